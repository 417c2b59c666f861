"""Result storage on any filesystem pyarrow knows: locations (paths and URIs) and atomic batch commits."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use: a factory worker writing its spool atomically
# does not import pyarrow's filesystems. ``redact`` lives in the ground floor's cp_common.printable.
_FACE = {
    "Location": "cp_store.location",
    "StoreError": "cp_store.location",
    "redact": "cp_common.printable",
    "resolve": "cp_store.location",
    "atomic_write": "cp_store.atomic_files",
    "read_manifests": "cp_store.manifests",
    "read_table": "cp_store.tables",
    "Published": "cp_store.published_run",
    "published": "cp_store.published_run",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
