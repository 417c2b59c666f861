"""The coordinator and its agents: probe phases between every pair of nodes, once or on a period.

Agents (``agent``, one per node or TSC domain) register with a coordinator (``coordinator``) over
one ZeroMQ control channel (``control``, its bounded wire format); a phase probes every ordered
pair of agents and writes the sync table. ``periodic`` runs phases on a fixed schedule for the
length of a job. ``cloudprofiler sync`` (cloudprofiler.cli.sync) is the command over them.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "Agent": "cp_sync.nodes.agent",
    "Coordinator": "cp_sync.nodes.coordinator",
    "list_agents": "cp_sync.nodes.coordinator",
    "run_phase": "cp_sync.nodes.coordinator",
    "Schedule": "cp_sync.nodes.periodic",
    "run_periodic": "cp_sync.nodes.periodic",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
