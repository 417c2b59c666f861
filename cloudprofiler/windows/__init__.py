"""Enorm's compute/consolidate split in Spark: shared sliding windows, their per-key pane state, and
the salting of hot keys (data skew)."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "native_agg": "cloudprofiler.windows.shared",
    "plan": "cloudprofiler.windows.shared",
    "sliding_agg": "cloudprofiler.windows.shared",
    "multi_window_agg": "cloudprofiler.windows.multi",
    "native_multi": "cloudprofiler.windows.multi",
    "SALT": "cloudprofiler.windows.skew",
    "adaptive_salt": "cloudprofiler.windows.skew",
    "assign_key_groups": "cloudprofiler.windows.skew",
    "balanced_repartition": "cloudprofiler.windows.skew",
    "compute": "cloudprofiler.windows.skew",
    "consolidate": "cloudprofiler.windows.skew",
    "group_loads": "cloudprofiler.windows.skew",
    "plain_aggregate": "cloudprofiler.windows.skew",
    "salt_column": "cloudprofiler.windows.skew",
    "salted_aggregate": "cloudprofiler.windows.skew",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
