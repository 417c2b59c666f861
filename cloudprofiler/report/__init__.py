"""``cloudprofiler report``: one self-contained HTML page per run directory (cp_sync.run_page)."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "write_maxrate_run": "cloudprofiler.report.runs",
    "waterfall_line": "cloudprofiler.report.waterfall",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
