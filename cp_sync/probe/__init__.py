"""MinRTT probes between two TSC domains: one UDP exchange, timed in C or in its Python twin.

``native`` runs the loops of ``native_tsc.probe_loops`` (a responder thread and an initiator
call); ``python_twin`` is the same API and wire format timed by the interpreter, the baseline the
C loops are compared with; ``api`` holds the Protocols both meet and the result type; and
``background`` starts the daemon threads every sync process runs.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "Responder": "cp_sync.probe.native",
    "initiate": "cp_sync.probe.native",
    "ProbeUnavailable": "cp_sync.probe.native",
    "ProbeResult": "cp_sync.probe.api",
    "ProbeLoops": "cp_sync.probe.api",
    "ProbeResponder": "cp_sync.probe.api",
    "start_daemon": "cp_sync.probe.background",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
