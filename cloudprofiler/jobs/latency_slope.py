"""Whether latency keeps growing during a trial: the slope of gen -> sink latency over the trial.

A pipeline that cannot keep up builds a backlog, so each tuple waits longer
than the one before: the latency's slope over time is positive (Karimov et al.
use this criterion). Only records whose two stamps share one TSC domain are
used; records across domains need cp_sync's translation first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cp_common.stamp_columns import GEN, SINK, node_column, tsc_column
from cp_source.wire.bucket import SEQ_BITS

MIN_SAMPLES = 10  # fewer records than this say nothing about a trend
# Records of one micro-batch carry sink stamps close together (the batch's partitions write within a
# few hundred ms), and a batch follows the one before after at least this gap in the demo's 1 s
# cadence (0.8 s and more in its runs, at most 0.25 s inside one). Closer batches count as one group:
# fewer groups, so a wider error or none, never a narrower one.
BATCH_GAP_S = 0.3
MIN_BATCHES = 4  # a line through fewer settled micro-batches leaves no scatter to measure


@dataclass(frozen=True)
class LatencyTrend:
    """The least-squares line of latency over a run's time: how fast it climbs, and where it goes."""

    slope: float  # seconds of latency gained per second of run
    first_s: float  # the line's latency at the first record, seconds
    last_s: float  # the line's latency at the last record, seconds
    span_s: float  # seconds from the first record to the last
    samples: int
    # The slope's standard error, s/s, from the scatter of the settled run's micro-batches about their
    # line (``settled_trend`` only; None with too few micro-batches to tell), and how many there were.
    slope_se: float | None = None
    batches: int = 0


def latency_trend(t_s: np.ndarray, latency_s: np.ndarray) -> LatencyTrend | None:
    """The line through (``t_s``, ``latency_s``), both in seconds; None with fewer than
    ``MIN_SAMPLES`` finite points or no time between the first and the last."""
    t, lat = np.asarray(t_s, dtype=np.float64), np.asarray(latency_s, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(lat)
    t, lat = t[ok], lat[ok]
    if len(t) < MIN_SAMPLES or np.ptp(t) == 0:
        return None
    lo, hi = float(t.min()), float(t.max())
    slope, intercept = np.polyfit(t - lo, lat, 1)  # least squares, from the first record's time
    return LatencyTrend(float(slope), float(intercept), float(intercept + slope * (hi - lo)), hi - lo, len(t))


def settled_trend(t_s: np.ndarray, latency_s: np.ndarray) -> LatencyTrend | None:
    """How latency moves once the pipeline has settled: the median latency of the middle third of
    the run's time (``first_s``) and of its last third (``last_s``), ``span_s`` the time between the
    two thirds' median times and ``slope`` the change over it; None as for ``latency_trend``.

    A run that starts on idle queries spends its first micro-batches growing to its cadence (each
    batch takes longer as it brings more), so its first third may climb and then level off: that
    third is left out. A backlog climbs on to the end, and is measured at the least-squares line's
    slope (the median of a third of a straight line is the line at the third's middle); one slow
    micro-batch moves a median by little. With no record in the middle third (a run of two or three
    micro-batches), everything before the last third stands in for it."""
    t, lat = np.asarray(t_s, dtype=np.float64), np.asarray(latency_s, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(lat)
    t, lat = t[ok], lat[ok]
    if len(t) < MIN_SAMPLES or np.ptp(t) == 0:
        return None
    lo, third = float(t.min()), float(np.ptp(t)) / 3
    middle, last = (t > lo + third) & (t < lo + 2 * third), t >= lo + 2 * third
    if not middle.any():  # a run of a few micro-batches (records share their batch's sink stamp)
        middle = ~last
    first_s, last_s = float(np.median(lat[middle])), float(np.median(lat[last]))
    span = float(np.median(t[last]) - np.median(t[middle]))
    se, batches = _slope_error(t, lat, lo + third, lo + 2 * third, span)
    return LatencyTrend((last_s - first_s) / span, first_s, last_s, span, len(t), se, batches)


def _slope_error(
    t: np.ndarray, lat: np.ndarray, settled_from: float, last_from: float, span: float
) -> tuple[float | None, int]:
    """The standard error of ``settled_trend``'s slope, and the settled run's micro-batches.

    Each micro-batch (records between gaps over ``BATCH_GAP_S``) counts once, as its median latency
    at its median time: records of one batch share its wait, so they are not independent samples.
    The batches' scatter about their least-squares line (``sigma``) gives the error of a median of
    the middle third's ``m`` batches minus one of the last third's ``n``: sigma * sqrt(1/m + 1/n),
    over the span."""
    order = np.argsort(t, kind="stable")
    t, lat = t[order], lat[order]
    cuts = np.flatnonzero(np.diff(t) > BATCH_GAP_S) + 1
    bt = np.array([np.median(g) for g in np.split(t, cuts)])
    bl = np.array([np.median(g) for g in np.split(lat, cuts)])
    keep = bt > settled_from
    bt, bl = bt[keep], bl[keep]
    m, n = int(np.sum(bt < last_from)), int(np.sum(bt >= last_from))
    if len(bt) < MIN_BATCHES or m == 0 or n == 0 or np.ptp(bt) == 0:
        return None, len(bt)
    slope, intercept = np.polyfit(bt - bt[0], bl, 1)
    resid = bl - (intercept + slope * (bt - bt[0]))
    sigma = float(np.sqrt(resid @ resid / (len(bt) - 2)))
    return sigma * float(np.sqrt(1 / m + 1 / n)) / span, len(bt)


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
    hz = native_tsc.frequency_hz()
    trend = latency_trend((gen - gen.min()) / hz if len(gen) else gen, (snk - gen) / hz)
    return (None if trend is None else trend.slope), len(gen)
