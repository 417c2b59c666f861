"""Result storage on any filesystem pyarrow knows: locations (paths and URIs) and atomic batch commits."""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module defining it, imported on first use: a factory worker writing its spool atomically
# does not import pyarrow's filesystems. The ground floor imports no other package, so this face is
# written out here rather than made by native_tsc.faces.
_FACE = {
    "Location": "cp_store.location",
    "StoreError": "cp_store.location",
    "redact": "cp_store.location",
    "resolve": "cp_store.location",
    "atomic_write": "cp_store.atomic_files",
    "read_manifests": "cp_store.manifests",
    "read_table": "cp_store.tables",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_FACE[name]), name)
    globals()[name] = value
    return value
