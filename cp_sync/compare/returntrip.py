"""The return-trip comparison: the end point acknowledges to the start node, which stamps the ack.

Both stamps are on the start node's counter, so no translation is needed, but
the one-way latency is only known to lie between 0 and the whole round trip:
the error is the acknowledgement's own trip. Reported as the interval's centre
and half-width, the same form as the translation's bound.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def returntrip_interval(c_start: np.ndarray, c_ack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Estimate and bound (start-node cycles) of the one-way latency start -> end from the ack's return."""
    rtt = (np.asarray(c_ack, np.int64) - np.asarray(c_start, np.int64)).astype(np.float64)
    if np.any(rtt < 0):
        raise ValueError("an acknowledgement stamped before its event")
    # The one-way trip lies in [0, rtt] (+1 cycle of counter quantisation at the ack's end).
    return (rtt + 1) / 2, (rtt + 1) / 2


def probe_returntrip(table: pa.Table, initiator: str, responder: str) -> tuple[np.ndarray, np.ndarray]:
    """Return-trip estimates for probes initiated by ``initiator`` (the reply is the acknowledgement)."""
    mask = pc.and_(pc.equal(table["initiator"], initiator), pc.equal(table["responder"], responder))
    t = table.filter(mask)
    return returntrip_interval(t["c_i"].to_numpy(), t["c_k"].to_numpy())
