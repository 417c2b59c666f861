"""The Arrow spool on disk: segments, the ledger of counts, compaction, durability."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "Spool": "cp_source.spool.segments",
    "read_segment": "cp_source.spool.segments",
    "read_front_progress": "cp_source.spool.front_records",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
