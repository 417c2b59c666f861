"""The jobs that tie the packages together: the demo, the maximum-rate search and the queries they run."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "find_max_rate": "cloudprofiler.jobs.maxrate",
    "step_table": "cloudprofiler.jobs.maxrate",
    "start_source_query": "cloudprofiler.jobs.queries",
    "throttle": "cloudprofiler.jobs.queries",
    "ysb_stateless": "cloudprofiler.jobs.queries",
    "run_windowed": "cloudprofiler.jobs.ordering_compare",
    "generator_keys": "cloudprofiler.jobs.partition_load",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
