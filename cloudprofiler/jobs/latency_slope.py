"""Whether latency keeps growing during a trial: the slope of gen -> sink latency over the trial.

A pipeline that cannot keep up builds a backlog, so each tuple waits longer
than the one before: the latency's slope over time is positive (Karimov et al.
use this criterion). Only records whose two stamps share one TSC domain are
used; records across domains need cp_sync's translation first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cp_source.wire.bucket import SEQ_BITS
from native_tsc.stamp_columns import GEN, SINK, node_column, tsc_column


def latency_slope(sink: str | Path, senders: set[int]) -> tuple[float | None, int]:
    """Seconds of gen->sink latency gained per second of the trial, from records of one TSC domain.

    Uses whatever records the sink's handler kept (``id``, ``xoy``, ``downsample``);
    ``(None, 0)`` when it kept none or the stamps were taken in different domains
    (use cp_sync translation for those).
    """
    import native_tsc
    from cp_sink.records import read_records

    rec = read_records(sink)
    need = {tsc_column(GEN), tsc_column(SINK), node_column(GEN), node_column(SINK)}
    if rec.num_rows == 0 or not need <= set(rec.column_names):
        return None, 0
    ids = rec["tuple_id"].to_numpy()
    mine = np.isin(ids >> SEQ_BITS, np.fromiter(senders, np.int64))
    gen_node = np.asarray(rec[node_column(GEN)].to_pylist(), dtype=object)[mine]
    sink_node = np.asarray(rec[node_column(SINK)].to_pylist(), dtype=object)[mine]
    same = gen_node == sink_node
    gen = rec[tsc_column(GEN)].to_numpy()[mine][same].astype(np.float64)
    snk = rec[tsc_column(SINK)].to_numpy()[mine][same].astype(np.float64)
    if len(gen) < 10 or np.ptp(gen) == 0:
        return None, len(gen)
    from scipy.stats import linregress

    hz = native_tsc.frequency_hz()
    fit = linregress((gen - gen.min()) / hz, (snk - gen) / hz)
    return float(fit.slope), len(gen)
