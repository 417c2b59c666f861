"""``sync=auto``: the sink's sync with no hand-started agents.

``driver`` reads the sink's sync options, starts one coordinator per sink path on the driver
host and asks it for the stop phase; ``coordinator`` is that detached process; ``host_agent``
starts one agent per executor host and TSC domain from the sink's first task there.
docs/sync-auto.md tells the whole story.
"""

from __future__ import annotations

from cp_common.faces import deprecated_names, lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "SyncOptions": "cp_sync.auto.driver",
    "ensure_coordinator": "cp_sync.auto.driver",
    "coordinator_state": "cp_sync.auto.driver",
    "stop": "cp_sync.auto.driver",
    "AgentSpec": "cp_sync.auto.host_agent",
    "ensure_agent": "cp_sync.auto.host_agent",
}
# public from cloudprofiler; this package once was the module the docs named for it
_OLD = {"wait_for_stop": "cp_sync.auto.driver"}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, {**_FACE, **_OLD})
deprecated_names(__name__, "cloudprofiler", _OLD)
