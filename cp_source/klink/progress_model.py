"""Klink's progress model for a windowed Spark query: SWMs, epochs, delay statistics, prediction.

Pure computation on numpy arrays, so it works on the records of any sink. Times
on the common clock are integer nanoseconds (``*_ns``); event times, window
bounds and watermarks are integer milliseconds (``*_ms``), as in Spark.

Definitions (Klink, Farhat et al., SIGMOD '21, Sections 2-3):

* **Deadline.** Spark aligns windows of size ``s`` and slide ``l`` at multiples
  of ``l`` from the Unix epoch; window ``[e - s, e)`` has deadline ``e``. Spark
  finalises it (append mode) once the watermark reaches its end,
  ``watermark >= e``.
* **Sweeping watermark (SWM).** The first batch whose watermark (the one Spark
  reports after the batch) passes a deadline. One batch may pass several
  deadlines (sliding windows, or a jump in event time); it is one SWM. SWM ``n``
  is ingested at ``w_n``, the batch's ingestion time.
* **Epoch.** Epoch ``n`` is the batches after SWM ``n-1`` up to and including
  SWM ``n`` (Section 3); batches after the last SWM form an open epoch, not
  reported.
* **Delay** of a tuple: ingestion time minus generation time (``D_n`` of Eq. 3/4).

The prediction model, and why it departs from the letter of Section 3.1:

The paper writes ``E[w_{n+1}] = mu_n + p`` (Eq. 2/5): a period ``p`` plus the
mean delay, from a time origin it leaves implicit. We make the origin explicit.
Event time is stamped from the generator's clock, so a deadline ``e`` maps to a
generation-clock instant ``A = c + (e + delay_ms) * 1e6`` (``c`` = median of
``gen_ns - event_ms * 1e6`` over the tuples): the moment the generator produced
the event time that lets the watermark pass ``e``. The SWM that closes ``e`` is
then ingested at ``w = A + delta``, and ``delta`` (the SWM's delay) is what the
model is about. Consecutive anchors are exactly one deadline spacing apart
(``p = A_{n+1} - A_n``: slide * 1e6 ns), so Eq. 5 reads
``E[w_{n+1}] = A_n + p + mu_n``.

``mu_n`` is the mean of the last ``h`` SWM delays (Algorithm 1, line 2), not of
all tuples' delays: Spark's watermark follows the *largest* event time seen, so
the SWM rides on the fastest tuple that crosses the threshold, plus the wait
for the micro-batch, not on an average tuple. Using the tuples' mean would
predict every SWM too late by the gap between the mean and the low tail of the
delays. The per-epoch tuple statistics are still reported (``EpochStats``).

Eq. 6 as printed is garbled; read with ``h`` for ``n-1`` it is
``(1/h^2) * sum_i (chi_i - mu_i^2)``: the variance of the *mean* of one delay per
epoch, which shrinks as ``1/h`` and would make an interval for a single arrival
far too narrow. We report it (``Prediction.eq6_var_ns2``) but the interval uses
the predictive variance of the next delay, ``s^2 (1 + 1/h)`` with ``s^2`` the
sample variance of the last ``h`` SWM delays, and a Student-t quantile with
``h - 1`` degrees of freedom instead of Algorithm 1's fixed 2 sigma, so that for
normal delays the interval holds the next SWM with probability exactly ``f``
(Eq. 7). For large ``h`` this is the paper's normal interval.

Slack (Eq. 8, Algorithm 1) slides a window of ``r`` over ``[t_min, t_max]``
starting at ``max(t, t_min)``, weighting each step's slack
``(x + r - t) - cost`` by ``P(x <= w <= x + r) / P(w > t)`` under the normal
model (Eq. 9 conditions on ``w > t``; its case test is printed reversed, and
Eq. 10's Q-function divides by the standard deviation, printed as the
variance). Taken literally (``slack_eq8_ns``) the mass above ``t_max`` counts as
zero slack, so the slack of a query whose SWM is late *rises* again once ``t``
passes about the predicted mean plus one standard deviation (with ``r`` = one
standard deviation) before it drops to 0: a late query would look less urgent.
``slack_ns`` keeps the paper's steps from ``t`` up to ``t_max`` but lets the last
step hold all the mass above it (and includes the small mass between ``t`` and
``t_min``), which makes it the expected slack with ``w`` rounded up to the next
step; since the normal's hazard rate increases it never grows with ``t``, and
past ``t_max`` it is ``r - cost`` (due within the next cycle).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# scipy.special, not scipy.stats: the same two functions at a quarter of the import time, which
# every klink source pays in its first latestOffset (0.23 s against 0.96 s on a quiet host)
from scipy import special

from cp_common.faces import deprecated_names

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
NS_PER_MS = 1_000_000
MAX_SLACK_STEPS = 100_000  # bounds the work of one slack evaluation


def _i64(name: str, values: npt.ArrayLike) -> I64:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-d array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _same_length(**arrays: I64) -> None:
    sizes = {k: len(v) for k, v in arrays.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"arrays differ in length: {sizes}")


@dataclass(frozen=True)
class Batches:
    """Per micro-batch: id, ingestion time (ns), watermark after the batch (ms), max event time (ms).

    Spark's progress reports the watermark a batch *used*, computed after the batch before it; the
    watermark after batch k is the one reported with batch k+1.
    """

    batch_id: I64
    ingest_ns: I64
    watermark_ms: I64
    max_event_ms: I64

    @staticmethod
    def of(
        batch_id: npt.ArrayLike,
        ingest_ns: npt.ArrayLike,
        watermark_ms: npt.ArrayLike,
        max_event_ms: npt.ArrayLike,
    ) -> Batches:
        """Validated batches: ids strictly increasing, ingestion times and watermarks non-decreasing."""
        b = Batches(
            _i64("batch_id", batch_id),
            _i64("ingest_ns", ingest_ns),
            _i64("watermark_ms", watermark_ms),
            _i64("max_event_ms", max_event_ms),
        )
        _same_length(
            batch_id=b.batch_id,
            ingest_ns=b.ingest_ns,
            watermark_ms=b.watermark_ms,
            max_event_ms=b.max_event_ms,
        )
        for name, arr, strict in (
            ("batch_id", b.batch_id, True),
            ("ingest_ns", b.ingest_ns, False),
            ("watermark_ms", b.watermark_ms, False),
        ):
            step = np.diff(arr)
            bad = np.flatnonzero(step <= 0 if strict else step < 0)
            if bad.size:
                i = int(bad[0]) + 1
                order = "increase strictly" if strict else "not decrease"
                raise ValueError(
                    f"{name} must {order}; batch {int(b.batch_id[i])}: {int(arr[i])} after {int(arr[i - 1])}"
                )
        return b


@dataclass(frozen=True)
class Tuples:
    """Per tuple (or per bucket, with ``count`` tuples sharing the stamps)."""

    batch_id: I64
    gen_ns: I64
    ingest_ns: I64
    event_ms: I64
    count: I64

    @staticmethod
    def of(
        batch_id: npt.ArrayLike,
        gen_ns: npt.ArrayLike,
        ingest_ns: npt.ArrayLike,
        event_ms: npt.ArrayLike,
        count: npt.ArrayLike | None = None,
    ) -> Tuples:
        """Validated tuples; ``count`` defaults to one per row and must be positive."""
        bid = _i64("batch_id", batch_id)
        cnt = np.ones(len(bid), np.int64) if count is None else _i64("count", count)
        t = Tuples(bid, _i64("gen_ns", gen_ns), _i64("ingest_ns", ingest_ns), _i64("event_ms", event_ms), cnt)
        _same_length(
            batch_id=t.batch_id, gen_ns=t.gen_ns, ingest_ns=t.ingest_ns, event_ms=t.event_ms, count=t.count
        )
        if cnt.size and int(cnt.min()) < 1:
            raise ValueError(f"count must be >= 1, row {int(np.argmin(cnt))} has {int(cnt.min())}")
        return t


def window_deadlines(size_ms: int, slide_ms: int, lo_ms: int, hi_ms: int) -> I64:
    """Deadlines (window ends, ms) of every Spark window holding an event time in [lo_ms, hi_ms]."""
    if size_ms <= 0 or slide_ms <= 0:
        raise ValueError(f"window size and slide must be positive, got size={size_ms} slide={slide_ms}")
    if slide_ms > size_ms:
        raise ValueError(f"slide {slide_ms} ms exceeds window size {size_ms} ms (Spark refuses it)")
    if hi_ms < lo_ms:
        return np.zeros(0, np.int64)
    # window [k*l, k*l + s) holds t iff k*l <= t < k*l + s
    k_lo = (lo_ms - size_ms) // slide_ms + 1
    k_hi = hi_ms // slide_ms
    return np.arange(k_lo, k_hi + 1, dtype=np.int64) * slide_ms + size_ms


@dataclass(frozen=True)
class Swms:
    """The SWMs of a run (one row per SWM batch) and, per deadline, the batch that closed it."""

    batch_index: I64  # index into Batches
    batch_id: I64
    ingest_ns: I64  # w_n
    watermark_ms: I64
    first_deadline_ms: I64  # smallest deadline this SWM closed
    last_deadline_ms: I64
    windows_closed: I64
    deadlines_ms: I64
    closing_batch_index: I64  # per deadline; -1 while still open


def sweeping_watermarks(batches: Batches, deadlines_ms: npt.ArrayLike) -> Swms:
    """Which batches' watermarks are SWMs: for each deadline, the first batch with watermark >= deadline."""
    dl = _i64("deadlines_ms", deadlines_ms)
    if dl.size and np.any(np.diff(dl) <= 0):
        raise ValueError("deadlines_ms must increase strictly")
    closing = np.searchsorted(batches.watermark_ms, dl, side="left").astype(np.int64)
    closing[closing >= len(batches.batch_id)] = -1
    closed = closing >= 0
    idx, first_pos, n_closed = np.unique(closing[closed], return_index=True, return_counts=True)
    closed_dl = dl[closed]
    return Swms(
        batch_index=idx.astype(np.int64),
        batch_id=batches.batch_id[idx],
        ingest_ns=batches.ingest_ns[idx],
        watermark_ms=batches.watermark_ms[idx],
        first_deadline_ms=closed_dl[first_pos],
        last_deadline_ms=closed_dl[first_pos + n_closed - 1],
        windows_closed=n_closed.astype(np.int64),
        deadlines_ms=dl,
        closing_batch_index=closing,
    )


def epoch_of_batches(swms: Swms, n_batches: int) -> I64:
    """Epoch number of every batch: n for batches after SWM n-1 up to SWM n; len(SWMs) for the open tail."""
    return np.searchsorted(swms.batch_index, np.arange(n_batches), side="left").astype(np.int64)


@dataclass(frozen=True)
class EpochStats:
    """Per complete epoch n: its SWM, the tuples' delays, the watermark lag, the SWM's own delay."""

    epoch: I64
    swm_batch_id: I64
    w_ns: I64  # ingestion time of the epoch's SWM
    count: I64  # tuples ingested in the epoch
    mean_ns: F64  # mean delay (Eq. 3, t >= w_n)
    var_ns2: F64  # population variance of the delays
    chi_ns2: F64  # mean squared delay (Eq. 4)
    p50_ns: I64
    p99_ns: I64
    wm_lag_ms: I64  # newest event time seen minus watermark, at the SWM batch
    max_wm_lag_ms: I64  # largest such lag over the epoch's batches
    anchor_ns: I64  # A_n: generation-clock instant of the SWM's first deadline + delay
    swm_delay_ns: I64  # w_n - A_n
    next_anchor_ns: I64  # A of the first deadline still open after SWM n
    event_offset_ns: int  # c: gen_ns - event_ms * 1e6 (median)
    open_tuples: int  # tuples in batches after the last SWM (no complete epoch yet)


def event_offset_ns(tuples: Tuples) -> int:
    """c: the median of gen_ns - event_ms * 1e6, mapping event time onto the generation clock."""
    if not len(tuples.gen_ns):
        raise ValueError("no tuples: cannot map event time onto the generation clock")
    return int(np.median(tuples.gen_ns - tuples.event_ms * NS_PER_MS))


def _weighted_quantile_per_group(group: I64, values: I64, weights: I64, n_groups: int, q: float) -> I64:
    """Inverted-CDF quantile per group: the smallest value whose cumulative weight reaches q."""
    order = np.lexsort((values, group))
    g, v, cw = group[order], values[order], np.cumsum(weights[order])
    total = np.bincount(g, weights=weights[order], minlength=n_groups).astype(np.int64)
    before = np.concatenate(([0], np.cumsum(total)[:-1]))
    need = np.maximum(np.ceil(q * total).astype(np.int64), 1)
    out = np.zeros(n_groups, np.int64)
    has = total > 0
    out[has] = v[np.searchsorted(cw, before[has] + need[has], side="left")]
    return out


def _tuple_epochs(batches: Batches, swms: Swms, tuples: Tuples) -> I64:
    pos = np.searchsorted(batches.batch_id, tuples.batch_id)
    pos_c = np.minimum(pos, max(len(batches.batch_id) - 1, 0))
    bad = np.flatnonzero((pos >= len(batches.batch_id)) | (batches.batch_id[pos_c] != tuples.batch_id))
    if bad.size:
        raise ValueError(
            f"tuple row {int(bad[0])} names batch {int(tuples.batch_id[bad[0]])}, which is not in the batches"
        )
    return epoch_of_batches(swms, len(batches.batch_id))[pos_c]


def _delay_moments(ep: I64, d: I64, w: I64, n: int) -> tuple[I64, F64, F64]:
    cnt = np.bincount(ep, weights=w, minlength=n).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(ep, weights=w * d.astype(np.float64), minlength=n) / cnt
        dev = d - mean[ep]
        var = np.bincount(ep, weights=w * dev * dev, minlength=n) / cnt
    return cnt, mean, var


def _check_watermark_delay(batches: Batches, delay_ms: int) -> None:
    """A watermark never passes the newest event time minus the delay (nor 0, where Spark starts)."""
    if not len(batches.batch_id):
        return
    ceiling = np.maximum(np.maximum.accumulate(batches.max_event_ms) - delay_ms, 0)
    ahead = np.flatnonzero(batches.watermark_ms > ceiling)
    if ahead.size:
        i = int(ahead[0])
        raise ValueError(
            f"batch {int(batches.batch_id[i])}: watermark {int(batches.watermark_ms[i])} ms is ahead of "
            f"the newest event time minus delay_ms={delay_ms} = {int(ceiling[i])} ms: check both"
        )


def epoch_delay_stats(
    batches: Batches, swms: Swms, tuples: Tuples, delay_ms: int, offset_ns: int | None = None
) -> EpochStats:
    """Per complete epoch: delay count, mean, variance, p50/p99, the watermark's lag, and the SWM's own delay.

    ``delay_ms`` is the query's watermark delay; ``offset_ns`` (c) defaults to event_offset_ns(tuples).
    """
    _check_watermark_delay(batches, delay_ms)
    n = len(swms.batch_index)
    ep_all = _tuple_epochs(batches, swms, tuples)
    keep = ep_all < n
    ep, w = ep_all[keep], tuples.count[keep]
    d = tuples.ingest_ns[keep] - tuples.gen_ns[keep]
    cnt, mean, var = _delay_moments(ep, d, w, n)
    newest = (
        np.maximum.accumulate(batches.max_event_ms) if len(batches.max_event_ms) else batches.max_event_ms
    )
    lag = newest - batches.watermark_ms
    b_ep = epoch_of_batches(swms, len(batches.batch_id))
    max_lag = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(max_lag, b_ep[b_ep < n], lag[b_ep < n])
    c = event_offset_ns(tuples) if offset_ns is None else int(offset_ns)
    slide = np.diff(swms.deadlines_ms)
    step = int(slide[0]) if slide.size else 0
    anchor = c + (swms.first_deadline_ms + delay_ms) * NS_PER_MS
    return EpochStats(
        epoch=np.arange(n, dtype=np.int64),
        swm_batch_id=swms.batch_id,
        w_ns=swms.ingest_ns,
        count=cnt,
        mean_ns=mean,
        var_ns2=var,
        chi_ns2=var + mean * mean,
        p50_ns=_weighted_quantile_per_group(ep, d, w, n, 0.5),
        p99_ns=_weighted_quantile_per_group(ep, d, w, n, 0.99),
        wm_lag_ms=lag[swms.batch_index],
        max_wm_lag_ms=max_lag,
        anchor_ns=anchor,
        swm_delay_ns=swms.ingest_ns - anchor,
        next_anchor_ns=c + (swms.last_deadline_ms + step + delay_ms) * NS_PER_MS,
        event_offset_ns=c,
        open_tuples=int(tuples.count[~keep].sum()),
    )


@dataclass(frozen=True)
class Prediction:
    """The next SWM's ingestion time: mean, standard deviation and the f-interval [t_min, t_max] (ns)."""

    mean_ns: float
    sd_ns: float
    t_min_ns: float
    t_max_ns: float
    period_ns: float  # p: A_{n+1} - A_n
    observed_period_ns: float  # the SWMs' spacing over the last h epochs, per step of p (for comparison)
    mu_ns: float  # mean SWM delay over the last h epochs
    eq6_var_ns2: float  # the paper's Eq. 6 from the tuples' per-epoch moments (reported, not used)


def _interval_quantile(h: int, f: float) -> float:
    if not 0.0 < f < 1.0:
        raise ValueError(f"confidence f must be in (0, 1), got {f}")
    if h < 2:
        raise ValueError(f"h must be at least 2 epochs (a variance needs two), got {h}")
    return float(special.stdtrit(h - 1, (1.0 + f) / 2.0))


def _observed_period(stats: EpochStats, lo: int, n: int) -> float:
    """(w_n - w_lo) rescaled from the anchors' spacing to the next step: p plus the SWM delays' drift."""
    span = float(stats.anchor_ns[n] - stats.anchor_ns[lo])
    step = float(stats.next_anchor_ns[n] - stats.anchor_ns[n])
    return float(stats.w_ns[n] - stats.w_ns[lo]) * step / span if span > 0 else float("nan")


def predict_next_swm(stats: EpochStats, h: int = 10, f: float = 0.95, upto: int | None = None) -> Prediction:
    """Klink's normal model for w_{n+1} from epochs n-h+1..n (n = ``upto``, default the last epoch)."""
    n = len(stats.epoch) - 1 if upto is None else upto
    if not 0 <= n < len(stats.epoch):
        raise ValueError(f"epoch {n} is not among the {len(stats.epoch)} complete epochs")
    if n + 1 < h:
        raise ValueError(f"need h={h} complete epochs before predicting, have {n + 1}")
    q = _interval_quantile(h, f)
    lo = n - h + 1
    delays = stats.swm_delay_ns[lo : n + 1].astype(np.float64)
    mu = float(delays.mean())
    sd = float(delays.std(ddof=1)) * float(np.sqrt(1.0 + 1.0 / h))
    mean = float(stats.next_anchor_ns[n]) + mu
    m_i, chi_i = stats.mean_ns[lo : n + 1], stats.chi_ns2[lo : n + 1]
    return Prediction(
        mean_ns=mean,
        sd_ns=sd,
        t_min_ns=mean - q * sd,
        t_max_ns=mean + q * sd,
        period_ns=float(stats.next_anchor_ns[n] - stats.anchor_ns[n]),
        observed_period_ns=_observed_period(stats, lo, n),
        mu_ns=mu,
        eq6_var_ns2=float(np.sum(chi_i - m_i * m_i)) / (h * h),
    )


@dataclass(frozen=True)
class PredictionTable:
    """For each epoch n+1 after the warm-up: predicted interval from epochs ..n against the actual w_{n+1}."""

    epoch: I64  # n + 1
    mean_ns: F64
    t_min_ns: F64
    t_max_ns: F64
    actual_ns: I64
    covered: npt.NDArray[np.bool_]
    coverage: float  # share of rows whose actual lies in [t_min, t_max]
    mae_ns: float  # mean |actual - mean|


def prediction_table(stats: EpochStats, h: int = 10, f: float = 0.95) -> PredictionTable:
    """Every prediction the model could make on this run (from epoch h on), beside the actual SWM time."""
    q = _interval_quantile(h, f)
    n_ep = len(stats.epoch)
    if n_ep <= h:
        raise ValueError(f"need more than h={h} complete epochs for a prediction table, have {n_ep}")
    win = np.lib.stride_tricks.sliding_window_view(stats.swm_delay_ns.astype(np.float64), h)[: n_ep - h]
    mu = win.mean(axis=1)
    sd = win.std(axis=1, ddof=1) * np.sqrt(1.0 + 1.0 / h)
    mean = stats.next_anchor_ns[h - 1 : n_ep - 1] + mu
    actual = stats.w_ns[h:]
    lo, hi = mean - q * sd, mean + q * sd
    covered = (actual >= lo) & (actual <= hi)
    return PredictionTable(
        epoch=stats.epoch[h:],
        mean_ns=mean,
        t_min_ns=lo,
        t_max_ns=hi,
        actual_ns=actual,
        covered=covered,
        coverage=float(covered.mean()),
        mae_ns=float(np.abs(actual - mean).mean()),
    )


@dataclass(frozen=True)
class WatermarkAdvice:
    """The smallest watermark delay that would have dropped at most max_drop_share of the tuples."""

    delay_ms: int
    would_drop: int  # tuples later than delay_ms behind the newest event time
    tuples: int
    saving_ms: int  # current delay - advised delay, when positive


def out_of_orderness_ms(event_ms: npt.ArrayLike, arrival: npt.ArrayLike) -> I64:
    """Per tuple (input order): how far its event time is behind the newest one ingested before it.

    ``arrival`` orders the tuples (an ingestion time or a sequence number); ties keep input order.
    """
    ev, ar = _i64("event_ms", event_ms), _i64("arrival", arrival)
    _same_length(event_ms=ev, arrival=ar)
    order = np.argsort(ar, kind="stable")
    e = ev[order]
    # the first tuple has nothing before it: compared with itself, it is 0 behind
    newest_before = np.maximum.accumulate(np.concatenate((e[:1], e[:-1])))
    behind = np.maximum(newest_before - e, 0)
    out = np.empty_like(behind)
    out[order] = behind
    return out


def watermark_advice(
    event_ms: npt.ArrayLike, arrival: npt.ArrayLike, current_delay_ms: int, max_drop_share: float = 1e-4
) -> WatermarkAdvice:
    """From the measured out-of-orderness: the exact empirical quantile that drops at most the given share."""
    if not 0.0 <= max_drop_share < 1.0:
        raise ValueError(f"max_drop_share must be in [0, 1), got {max_drop_share}")
    behind = np.sort(out_of_orderness_ms(event_ms, arrival))
    n = len(behind)
    if n == 0:
        raise ValueError("no tuples: nothing to advise a watermark delay from")
    allowed = int(np.floor(max_drop_share * n))
    # Spark drops a tuple whose event time is below the watermark: behind > delay
    advised = int(behind[n - 1 - allowed])
    drop = int(n - np.searchsorted(behind, advised, side="right"))
    return WatermarkAdvice(advised, drop, n, max(int(current_delay_ms) - advised, 0))


def _check_slack_args(pred: Prediction, r_ns: float) -> None:
    if r_ns <= 0:
        raise ValueError(f"the cycle r must be positive, got {r_ns}")
    if pred.sd_ns <= 0:
        raise ValueError(f"the prediction's standard deviation must be positive, got {pred.sd_ns}")


def _steps(start: float, t_max: float, r_ns: float) -> int:
    n = int(np.floor((t_max - start) / r_ns)) + 1
    if n > MAX_SLACK_STEPS:
        raise ValueError(f"r={r_ns} ns cuts [{start}, {t_max}] into {n} steps, more than {MAX_SLACK_STEPS}")
    return max(n, 0)


def _survival(pred: Prediction, x: npt.ArrayLike) -> F64:
    """P(w > x) under N(mean, sd), accurate in the upper tail (the lower CDF of the mirrored z)."""
    z = (np.asarray(x, dtype=np.float64) - pred.mean_ns) / pred.sd_ns
    return np.asarray(special.ndtr(-z), dtype=np.float64)


def slack_eq8_ns(pred: Prediction, t_ns: float, r_ns: float, cost_ns: float = 0.0) -> float:
    """Eq. 8 exactly as Algorithm 1 computes it: steps of r from max(t, t_min) while x <= t_max, else 0.

    Kept for comparison: the mass outside [t_min, t_max] counts as zero slack, so this rises again as t
    passes the predicted mean (see slack_ns).
    """
    _check_slack_args(pred, r_ns)
    start = max(t_ns, pred.t_min_ns)
    x = start + np.arange(_steps(start, pred.t_max_ns, r_ns)) * r_ns
    beyond = float(_survival(pred, np.array([t_ns]))[0])
    if beyond <= 0.0 or not x.size:
        return 0.0
    p = _survival(pred, x) - _survival(pred, x + r_ns)
    return float(np.sum(p / beyond * ((x + r_ns - t_ns) - cost_ns)))


def slack_ns(pred: Prediction, t_ns: float, r_ns: float, cost_ns: float = 0.0) -> float:
    """Expected slack at time t (Eq. 8 over steps of r from t), the last step holding all mass above it.

    Steps x = t, t + r, ... while x <= t_max (at least one); step k is worth (x + r - t) - cost and
    weighs P(x <= w < x + r | w > t); the last weighs P(w >= x | w > t). As in the paper the steps
    stop at t_max, but the tail beyond is not dropped: an SWM that is late stays due within the next
    cycle instead of looking less urgent, and the slack never grows as t passes.
    """
    _check_slack_args(pred, r_ns)
    x = t_ns + np.arange(max(_steps(t_ns, pred.t_max_ns, r_ns), 1)) * r_ns
    sf = _survival(pred, x)
    if sf[0] <= 0.0:  # far past the prediction: due within this cycle
        return float(r_ns - cost_ns)
    p = sf - np.append(sf[1:], 0.0)
    return float(np.sum(p / sf[0] * ((x + r_ns - t_ns) - cost_ns)))


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(
    __name__,
    "cloudprofiler.progress",
    [
        "Batches",
        "Tuples",
        "epoch_delay_stats",
        "predict_next_swm",
        "prediction_table",
        "slack_ns",
        "sweeping_watermarks",
        "watermark_advice",
        "window_deadlines",
    ],
)
