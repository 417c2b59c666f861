"""cp_sync: cross-node time.

MinRTT probes timed in C between TSC domains (``probe``, ``agent``,
``coordinator``; ``probe_python`` is the pure-Python twin, ``probe_api`` their
shared types), sync tables that keep every probe (``sync_table``),
translation of stamps into a reference domain with a strict bound per record
by the paper's two-point method or the convex hull (``hull``, ``translate``),
summaries, the latency table and plots (``report``, ``latency_report``), the
methods it is compared with (``returntrip``, ``ntp``), and synthetic probes
with exact truth (``synthetic``). Commands: ``cloudprofiler sync`` and
``cloudprofiler translate``.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "Coordinator": "cp_sync.coordinator",
    "Agent": "cp_sync.agent",
    "wait_for_stop": "cp_sync.auto",
    "latency_table": "cp_sync.latency_report",
    "read_sync": "cp_sync.sync_table",
    "write_sync": "cp_sync.sync_table",
    "translate_records": "cp_sync.translate.records",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
