"""Batches ready before Spark asks: the ready frontier and the batch plan over it."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "ReadyFrontier": "cp_source.ready.frontier",
    "ReadyState": "cp_source.ready.batch_plan",
    "plan_slices": "cp_source.ready.batch_plan",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
