"""Reports of a run: the latency table and its plots, the waterfall, and one HTML page per run.

``summary`` summarises translated records (p50/p90/p99/max with their error bounds) and draws the
box and error plots from the same arrays as the table; ``latency`` is the report of a run's
records and sync tables; ``waterfall_plot`` draws the stages of chosen records; ``run_page``
writes one self-contained HTML page per run directory (``cloudprofiler report``, ``cli``);
``runs`` writes the run directories of jobs with no latency table (maxrate's trials);
``waterfall`` places Spark's micro-batch phases on the demo's waterfall.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "latency_report": "cloudprofiler.report.latency",
    "latency_table": "cloudprofiler.report.latency",
    "summarize": "cloudprofiler.report.summary",
    "build": "cloudprofiler.report.run_page",
    "write_maxrate_run": "cloudprofiler.report.runs",
    "waterfall_line": "cloudprofiler.report.waterfall",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
