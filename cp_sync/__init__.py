"""cp_sync: cross-node time.

Subpackages, top to bottom (each imports only those below it, and the modules at the top of
cp_sync below them all):

* ``auto``: ``sync=auto``, the sink's sync with no hand-started agents;
* ``nodes``: the coordinator and its agents, probe phases between every pair of nodes;
* ``probe``: one MinRTT probe exchange, timed in C, and its pure-Python twin;
* ``compare``: the methods MinRTT sync is measured against (NTP, the return trip) and synthetic
  probes with exact truth;
* ``translate``: stamps translated into a reference domain with a strict bound per record, by the
  paper's two-point method or the convex hull.

``sync_table`` (the sync tables that keep every probe) is the floor all of them stand on.
The reports, plots and the ``cloudprofiler sync`` and ``cloudprofiler translate`` commands
live in cloudprofiler (``cloudprofiler.report``, ``cloudprofiler.cli``).
"""

from __future__ import annotations

from cp_common.faces import lazy_face, old_module_paths

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "Coordinator": "cp_sync.nodes.coordinator",
    "Agent": "cp_sync.nodes.agent",
    "read_sync": "cp_sync.sync_table",
    "write_sync": "cp_sync.sync_table",
    "translate_records": "cp_sync.translate.records",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
# Module paths the docs gave before cp_sync had subpackages; each name a user read there warns.
old_module_paths(
    {
        "cp_sync.coordinator": "cp_sync.nodes.coordinator",
        "cp_sync.latency_report": "cloudprofiler.report.latency",
        "cp_sync.waterfall_plot": "cloudprofiler.report.waterfall_plot",
    }
)
