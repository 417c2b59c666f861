"""What MinRTT sync is measured against: NTP's own bound, the return trip, and synthetic truth.

``ntp`` reads chrony's error bound on a node's clock; ``returntrip`` bounds a one-way latency
by the acknowledgement's trip back to the start node; ``synthetic`` makes probes between virtual
domains whose relation is known exactly, so a translation's error is checked against the truth.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "ntp_bound": "cp_sync.compare.ntp",
    "probe_returntrip": "cp_sync.compare.returntrip",
    "synth_phases": "cp_sync.compare.synthetic",
    "synth_probes": "cp_sync.compare.synthetic",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
