"""What travels on the wire: the bucket format, the sender's link to a factory, the workloads' rows."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "AD_TYPES": "cp_source.wire.workloads",
    "EVENT_TYPES": "cp_source.wire.workloads",
    "campaigns_table": "cp_source.wire.workloads",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
