"""cp_source.klink.progress_model against constructed truth: hand-made cases and seeded synthetic streams."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from cp_source.klink.progress_model import (
    NS_PER_MS,
    Batches,
    EpochStats,
    Prediction,
    Tuples,
    epoch_delay_stats,
    epoch_of_batches,
    out_of_orderness_ms,
    predict_next_swm,
    prediction_table,
    slack_eq8_ns,
    slack_ns,
    sweeping_watermarks,
    watermark_advice,
    window_deadlines,
)

T0_NS = 1_000_000_000_000  # a whole number of ms, so event time maps onto the generation clock with c = 0
Z = 5.0  # tolerance in standard errors for a statistic checked once per epoch


@dataclass
class Stream:
    batches: Batches
    tuples: Tuples
    stats: EpochStats
    gen_end_ns: int


def synth(
    delay_ns: np.ndarray, gen_step_ns: int, batch_ns: int, size_ms: int, slide_ms: int, wm_delay_ms: int
) -> Stream:
    """Tuples generated every gen_step_ns, ingested after their delays, batched every batch_ns like Spark."""
    gen = T0_NS + np.arange(len(delay_ns), dtype=np.int64) * gen_step_ns
    ingest = gen + delay_ns.astype(np.int64)
    batch = -(-ingest // batch_ns)  # a tuple ingested in ((k-1)B, kB] is read by batch k at kB
    event = gen // NS_PER_MS
    ids, inv = np.unique(batch, return_inverse=True)
    max_event = np.full(len(ids), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(max_event, inv, event)
    watermark = np.maximum.accumulate(max_event) - wm_delay_ms
    batches = Batches.of(ids, ids * batch_ns, watermark, max_event)
    tuples = Tuples.of(ids[inv], gen, ingest, event)
    swms = sweeping_watermarks(
        batches, window_deadlines(size_ms, slide_ms, int(event.min()), int(event.max()))
    )
    return Stream(batches, tuples, epoch_delay_stats(batches, swms, tuples, wm_delay_ms), int(gen[-1]))


# ---- deadlines and SWMs on hand-made cases


def test_tumbling_deadlines() -> None:
    assert window_deadlines(10, 10, 0, 25).tolist() == [10, 20, 30]
    assert window_deadlines(10, 10, 10, 19).tolist() == [20]
    assert window_deadlines(10, 10, 9, 10).tolist() == [10, 20]


def test_sliding_deadlines() -> None:
    # 3 is in [-5, 5) and [0, 10); 12 is in [5, 15) and [10, 20)
    assert window_deadlines(10, 5, 3, 12).tolist() == [5, 10, 15, 20]
    assert window_deadlines(10, 5, -7, -7).tolist() == [-5, 0]
    assert window_deadlines(30, 10, 0, 0).tolist() == [10, 20, 30]


@pytest.mark.parametrize(
    ("size", "slide", "message"),
    [(10, 20, "exceeds window size"), (0, 1, "must be positive"), (10, -1, "must be positive")],
)
def test_bad_window_spec(size: int, slide: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        window_deadlines(size, slide, 0, 100)


def hand_batches() -> Batches:
    return Batches.of(
        [0, 1, 2, 3, 4, 5], [100, 200, 300, 400, 500, 600], [0, 4, 12, 12, 25, 31], [4, 14, 22, 17, 35, 41]
    )


def test_tumbling_swms() -> None:
    swms = sweeping_watermarks(hand_batches(), [10, 20, 30, 40])
    assert swms.batch_index.tolist() == [2, 4, 5]
    assert swms.ingest_ns.tolist() == [300, 500, 600]
    assert swms.windows_closed.tolist() == [1, 1, 1]
    assert swms.closing_batch_index.tolist() == [2, 4, 5, -1]
    assert epoch_of_batches(swms, 6).tolist() == [0, 0, 0, 1, 1, 2]


def test_sliding_swms_close_several_windows_at_once() -> None:
    swms = sweeping_watermarks(hand_batches(), [5, 10, 15, 20, 25, 30, 35])
    assert swms.batch_index.tolist() == [2, 4, 5]
    assert swms.windows_closed.tolist() == [2, 3, 1]
    assert swms.first_deadline_ms.tolist() == [5, 15, 30]
    assert swms.last_deadline_ms.tolist() == [10, 25, 30]
    assert swms.closing_batch_index.tolist() == [2, 2, 4, 4, 4, 5, -1]


def test_watermark_equal_to_the_deadline_closes_it() -> None:
    b = Batches.of([7, 8], [1, 2], [19, 20], [29, 30])
    assert sweeping_watermarks(b, [20]).batch_id.tolist() == [8]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"watermark_ms": [5, 4, 6]}, "watermark_ms must not decrease; batch 1: 4 after 5"),
        ({"batch_id": [0, 2, 2]}, "batch_id must increase strictly; batch 2: 2 after 2"),
        ({"ingest_ns": [10, 9, 11]}, "ingest_ns must not decrease"),
        ({"max_event_ms": [1, 2]}, "arrays differ in length"),
        ({"watermark_ms": [0.5, 1.0, 2.0]}, "expected integers"),
    ],
)
def test_bad_batches(kwargs: dict[str, list[float]], message: str) -> None:
    args: dict[str, list[float]] = {"batch_id": [0, 1, 2], "ingest_ns": [1, 2, 3], "watermark_ms": [0, 1, 2]}
    args["max_event_ms"] = [5, 6, 7]
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        Batches.of(**args)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    slide=st.integers(1, 30),
    extra=st.integers(0, 3),
)
def test_every_window_closed_exactly_once(steps: list[int], slide: int, extra: int) -> None:
    size = slide * (1 + extra)
    wm = np.cumsum(steps)
    b = Batches.of(np.arange(len(wm)), np.arange(len(wm)) * 10, wm, wm)
    dl = window_deadlines(size, slide, 0, int(wm[-1]) + size)
    swms = sweeping_watermarks(b, dl)
    assert np.all(np.diff(swms.batch_index) > 0)
    assert np.all(np.diff(swms.watermark_ms) > 0)
    due = dl[dl <= wm[-1]]
    assert int(swms.windows_closed.sum()) == len(due)
    for d, i in zip(dl, swms.closing_batch_index, strict=True):
        if d > wm[-1]:
            assert i == -1
        else:  # the first batch whose watermark reaches the deadline
            assert wm[i] >= d and (i == 0 or wm[i - 1] < d)


# ---- per-epoch statistics


def test_epoch_stats_hand_case() -> None:
    b = hand_batches()
    swms = sweeping_watermarks(b, [10, 20, 30, 40])
    # batch 0,2 -> epoch 0; 3,4 -> epoch 1; 5 -> epoch 2; batch 1 tuple in epoch 0
    t = Tuples.of(
        batch_id=[0, 1, 2, 2, 3, 4, 5, 5],
        gen_ns=[0, 0, 0, 0, 0, 0, 0, 0],
        ingest_ns=[10, 20, 30, 40, 100, 300, 7, 9],
        event_ms=[0, 0, 0, 0, 0, 0, 0, 0],
        count=[1, 1, 1, 1, 1, 1, 3, 1],
    )
    s = epoch_delay_stats(b, swms, t, delay_ms=10, offset_ns=0)
    assert s.count.tolist() == [4, 2, 4]
    assert s.mean_ns.tolist() == [25.0, 200.0, 7.5]
    assert s.var_ns2.tolist() == [125.0, 10000.0, 0.75]
    assert s.chi_ns2.tolist() == pytest.approx([750.0, 50000.0, 57.0])
    assert s.p50_ns.tolist() == [20, 100, 7]
    assert s.p99_ns.tolist() == [40, 300, 9]
    # newest event time so far minus watermark: [4, 10, 10, 10, 10, 10]
    assert s.wm_lag_ms.tolist() == [10, 10, 10]
    assert s.max_wm_lag_ms.tolist() == [10, 10, 10]
    assert s.anchor_ns.tolist() == [20 * NS_PER_MS, 30 * NS_PER_MS, 40 * NS_PER_MS]
    assert s.swm_delay_ns.tolist() == [300 - 20 * NS_PER_MS, 500 - 30 * NS_PER_MS, 600 - 40 * NS_PER_MS]
    assert s.next_anchor_ns.tolist() == [30 * NS_PER_MS, 40 * NS_PER_MS, 50 * NS_PER_MS]
    assert s.open_tuples == 0


def test_tuples_in_the_open_epoch_are_counted_not_lost() -> None:
    b = Batches.of([0, 1, 2], [1, 2, 3], [0, 12, 15], [10, 22, 25])
    swms = sweeping_watermarks(b, [10, 20])
    t = Tuples.of([0, 1, 2, 2], [0, 0, 0, 0], [5, 5, 5, 5], [0, 0, 0, 0], [1, 1, 2, 5])
    s = epoch_delay_stats(b, swms, t, delay_ms=10, offset_ns=0)
    assert s.count.tolist() == [2]
    assert s.open_tuples == 7


def test_tuple_of_an_unknown_batch_is_an_error() -> None:
    b = hand_batches()
    t = Tuples.of([0, 9], [0, 0], [1, 1], [0, 0])
    with pytest.raises(ValueError, match="tuple row 1 names batch 9, which is not in the batches"):
        epoch_delay_stats(b, sweeping_watermarks(b, [10]), t, delay_ms=0)


def test_a_watermark_ahead_of_the_events_is_an_error() -> None:
    b = hand_batches()
    with pytest.raises(ValueError, match=r"batch 1: watermark 4 ms is ahead of .* delay_ms=11 = 3 ms"):
        epoch_delay_stats(b, sweeping_watermarks(b, [10]), Tuples.of([0], [0], [1], [0]), delay_ms=11)


def test_counts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="count must be >= 1, row 1 has 0"):
        Tuples.of([0, 0], [0, 0], [1, 1], [0, 0], [1, 0])


def steady_epochs(s: Stream, settle_ns: int) -> np.ndarray:
    """Epochs whose tuples all come from the steady part of the stream (past the start, before the end)."""
    start = np.concatenate(([T0_NS], s.stats.w_ns[:-1]))
    return np.flatnonzero((start >= T0_NS + settle_ns) & (s.stats.w_ns <= s.gen_end_ns))


# (name, delays in ns, variance, fourth central moment)
def _delay_cases(n: int) -> list[tuple[str, np.ndarray, float, float, float]]:
    rng = np.random.default_rng(16)
    mu_n, sd_n = 200e6, 30e6
    theta = 50e6
    lo, hi = 20e6, 120e6
    w = hi - lo
    return [
        ("normal", rng.normal(mu_n, sd_n, n), mu_n, sd_n**2, 3 * sd_n**4),
        ("exponential", rng.exponential(theta, n), theta, theta**2, 9 * theta**4),
        ("uniform", rng.uniform(lo, hi, n), (lo + hi) / 2, w**2 / 12, w**4 / 80),
    ]


@pytest.mark.parametrize(
    ("case", "size", "slide"), [(0, 1000, 1000), (1, 1000, 1000), (2, 1000, 1000), (0, 2000, 500)]
)
def test_epoch_mean_and_variance_match_the_injected_delays(case: int, size: int, slide: int) -> None:
    n = 60_000  # 2000 tuples a second for 30 s, batches every 100 ms
    name, delays, mean, var, m4 = _delay_cases(n)[case]
    s = synth(
        np.rint(delays),
        gen_step_ns=500_000,
        batch_ns=100 * NS_PER_MS,
        size_ms=size,
        slide_ms=slide,
        wm_delay_ms=300,
    )
    epochs = steady_epochs(s, settle_ns=int(mean + 12 * math.sqrt(var)))
    assert len(epochs) >= 20 * 1000 // slide, name
    # one SWM per slide of event time: the deadlines follow each other, one window each
    assert s.stats.anchor_ns[1:].tolist() == (s.stats.anchor_ns[:-1] + slide * NS_PER_MS).tolist()
    for e in epochs:
        k = int(s.stats.count[e])
        assert abs(s.stats.mean_ns[e] - mean) <= Z * math.sqrt(var / k), (name, e)
        assert abs(s.stats.var_ns2[e] - var) <= Z * math.sqrt((m4 - var * var) / k), (name, e)
    # the watermark trails the newest event time by exactly the query's delay
    assert s.stats.wm_lag_ms.tolist() == [300] * len(s.stats.epoch)
    assert s.stats.open_tuples + int(s.stats.count.sum()) == n


def test_epoch_quantiles_match_the_injected_normal() -> None:
    name, delays, mean, var, _ = _delay_cases(60_000)[0]
    s = synth(
        np.rint(delays),
        gen_step_ns=500_000,
        batch_ns=100 * NS_PER_MS,
        size_ms=1000,
        slide_ms=1000,
        wm_delay_ms=0,
    )
    sd = math.sqrt(var)
    for e in steady_epochs(s, settle_ns=int(mean + 12 * sd)):
        k = int(s.stats.count[e])
        for q, got in ((0.5, s.stats.p50_ns[e]), (0.99, s.stats.p99_ns[e])):
            x = sps.norm.ppf(q, mean, sd)  # standard error of a sample quantile: sqrt(q(1-q)/k) / density
            se = math.sqrt(q * (1 - q) / k) / sps.norm.pdf(x, mean, sd)
            assert abs(got - x) <= Z * se, (name, e, q)


# ---- prediction of the next SWM


def sparse_stream(n_epochs: int, seed: int) -> tuple[Stream, float]:
    """One tuple per 1 s tumbling window, at its start; delays N(300 ms, 40 ms); batches every 5 ms.

    The tuple at event time e is the one whose arrival lets the watermark pass e, so each SWM's delay is its
    tuple's delay plus the wait for the batch: a normal with a small uniform added.
    """
    rng = np.random.default_rng(seed)
    delays = np.rint(rng.normal(300e6, 40e6, n_epochs + 1))
    s = synth(
        delays,
        gen_step_ns=1000 * NS_PER_MS,
        batch_ns=5 * NS_PER_MS,
        size_ms=1000,
        slide_ms=1000,
        wm_delay_ms=0,
    )
    return s, math.sqrt(40e6**2 + (5e6) ** 2 / 12)


@pytest.mark.parametrize(("h", "f", "seed"), [(20, 0.95, 1), (10, 0.95, 2), (10, 0.9, 3)])
def test_interval_covers_the_next_swm_at_its_confidence(h: int, f: float, seed: int) -> None:
    s, sd = sparse_stream(3000, seed)
    assert len(s.stats.epoch) == 3000
    table = prediction_table(s.stats, h=h, f=f)
    n = len(table.epoch)
    assert n == 3000 - h
    # binomial tolerance: 4 standard errors of a share over n predictions
    assert abs(table.coverage - f) <= 4 * math.sqrt(f * (1 - f) / n), table.coverage
    # |actual - mean| of a normal prediction error with sd * sqrt(1 + 1/h): mean sd*sqrt(1+1/h)*sqrt(2/pi)
    spread = sd * math.sqrt(1 + 1 / h)
    expect = spread * math.sqrt(2 / math.pi)
    assert abs(table.mae_ns - expect) <= Z * spread * math.sqrt(1 - 2 / math.pi) / math.sqrt(n)
    assert table.actual_ns.tolist() == s.stats.w_ns[h:].tolist()


def test_predict_next_swm_matches_the_table_row() -> None:
    s, _ = sparse_stream(50, 4)
    table = prediction_table(s.stats, h=10)
    p = predict_next_swm(s.stats, h=10, upto=30)
    row = 30 + 1 - 10
    assert table.epoch[row] == 31
    assert p.mean_ns == pytest.approx(table.mean_ns[row], abs=1.0)
    assert (p.t_min_ns, p.t_max_ns) == pytest.approx((table.t_min_ns[row], table.t_max_ns[row]), abs=1.0)
    assert p.period_ns == 1000 * NS_PER_MS
    # (w_30 - w_21) / 9: one period plus the drift (delta_30 - delta_21) / 9, sd 40 ms * sqrt(2) / 9
    assert abs(p.observed_period_ns - 1000 * NS_PER_MS) <= Z * 40e6 * math.sqrt(2) / 9
    assert p.observed_period_ns == pytest.approx((s.stats.w_ns[30] - s.stats.w_ns[21]) / 9)
    d = s.stats.swm_delay_ns[21:31]
    assert p.mu_ns == pytest.approx(d.mean(), abs=1e-3)
    assert p.mean_ns == pytest.approx(s.stats.anchor_ns[30] + p.period_ns + d.mean(), abs=1.0)
    # one tuple per epoch: no spread inside an epoch, so the paper's Eq. 6 is 0
    assert p.eq6_var_ns2 == 0.0


def test_prediction_needs_h_epochs() -> None:
    s, _ = sparse_stream(5, 5)
    with pytest.raises(ValueError, match="need h=10 complete epochs before predicting, have 5"):
        predict_next_swm(s.stats, h=10)
    with pytest.raises(ValueError, match="h must be at least 2"):
        predict_next_swm(s.stats, h=1)
    with pytest.raises(ValueError, match=r"confidence f must be in \(0, 1\)"):
        predict_next_swm(s.stats, h=3, f=1.0)


def test_eq6_hand_case() -> None:
    b = Batches.of([0, 1], [10, 20], [10, 20], [10, 20])
    swms = sweeping_watermarks(b, [10, 20])
    t = Tuples.of([0, 0, 1, 1], [0, 0, 0, 0], [2, 4, 10, 20], [0, 0, 0, 0])
    s = epoch_delay_stats(b, swms, t, delay_ms=0, offset_ns=0)
    p = predict_next_swm(s, h=2)
    # per-epoch variances 1 and 25: (1 + 25) / 2^2
    assert p.eq6_var_ns2 == 6.5


# ---- watermark advice


def test_watermark_advice_hand_case() -> None:
    events = [10, 12, 11, 15, 9, 14, 16, 3]
    # newest before each: -, 10, 12, 12, 15, 15, 15, 16 -> behind: 0 0 1 0 6 1 0 13
    assert out_of_orderness_ms(events, range(8)).tolist() == [0, 0, 1, 0, 6, 1, 0, 13]
    a = watermark_advice(events, range(8), current_delay_ms=10, max_drop_share=0.25)
    assert (a.delay_ms, a.would_drop, a.tuples, a.saving_ms) == (1, 2, 8, 9)
    a = watermark_advice(events, range(8), current_delay_ms=10, max_drop_share=0.2)
    assert (a.delay_ms, a.would_drop, a.saving_ms) == (6, 1, 4)
    a = watermark_advice(events, range(8), current_delay_ms=10, max_drop_share=0.0)
    assert (a.delay_ms, a.would_drop, a.saving_ms) == (13, 0, 0)


def test_watermark_advice_follows_arrival_not_input_order() -> None:
    events = np.array([10, 12, 11, 15, 9, 14, 16, 3])
    perm = np.array([5, 2, 7, 0, 3, 6, 1, 4])
    arrival_ns = np.arange(8) * 1000 + 17
    behind = out_of_orderness_ms(events[perm], arrival_ns[perm])
    assert behind.tolist() == np.array([0, 0, 1, 0, 6, 1, 0, 13])[perm].tolist()


def test_watermark_advice_within_one_bucket_of_the_true_quantile() -> None:
    # buckets every 1 ms; 90% sent at once, 10% delayed uniformly in [0, 100 ms)
    rng = np.random.default_rng(7)
    n = 1_000_000
    gen = T0_NS + np.arange(n, dtype=np.int64) * NS_PER_MS
    late = rng.random(n) < 0.1
    delay = np.where(late, rng.uniform(0, 100e6, n), 0.0).astype(np.int64)
    a = watermark_advice(gen // NS_PER_MS, gen + delay, current_delay_ms=500)
    # true quantile: 0.9 + 0.1 * x / 100 = 1 - 1e-4
    truth = 100 * (1 - 1e-4 / 0.1)
    assert abs(a.delay_ms - truth) <= 1.0, a
    assert a.would_drop <= 100
    assert a.saving_ms == 500 - a.delay_ms


def test_watermark_advice_bad_input() -> None:
    with pytest.raises(ValueError, match="max_drop_share must be in"):
        watermark_advice([1], [1], 0, max_drop_share=1.0)
    with pytest.raises(ValueError, match="no tuples"):
        watermark_advice([], [], 0)
    with pytest.raises(ValueError, match="arrays differ in length"):
        out_of_orderness_ms([1, 2], [1])


# ---- slack


def pred(mean: float, sd: float, f: float = 0.95) -> Prediction:
    z = sps.norm.ppf((1 + f) / 2)
    return Prediction(mean, sd, mean - z * sd, mean + z * sd, 0.0, 0.0, 0.0, 0.0)


def test_slack_hand_case() -> None:
    # N(100, 10), interval [80.4, 119.6], r = 10, t = 100: steps x = 100 and 110 (120 > t_max)
    phi1, phi2 = 0.8413447460685429, 0.9772498680518208
    p = pred(100.0, 10.0)
    # Algorithm 1 as printed: P(100..110) and P(110..120), each over P(w > 100) = 0.5
    assert slack_eq8_ns(p, 100.0, 10.0) == pytest.approx(
        (phi1 - 0.5) / 0.5 * 10 + (phi2 - phi1) / 0.5 * 20, rel=1e-12
    )
    assert slack_eq8_ns(p, 125.0, 10.0) == 0.0
    # the last step holds everything above 110: P(w >= 110) = 1 - phi1
    assert slack_ns(p, 100.0, 10.0) == pytest.approx(
        (phi1 - 0.5) / 0.5 * 10 + (1 - phi1) / 0.5 * 20, rel=1e-12
    )
    assert slack_ns(p, 100.0, 10.0, cost_ns=3.0) == pytest.approx(
        (phi1 - 0.5) / 0.5 * 7 + (1 - phi1) / 0.5 * 17, rel=1e-12
    )
    # past t_max the SWM is due within this cycle
    assert slack_ns(p, 125.0, 10.0, cost_ns=3.0) == pytest.approx(7.0, rel=1e-12)
    assert slack_ns(p, 1e6, 10.0, cost_ns=3.0) == 7.0
    # before t_min: steps from t (60, 70, ..., 110), every one below 119.6
    x = np.arange(60.0, 111.0, 10.0)
    cdf = sps.norm.cdf(np.append(x, np.inf), 100, 10)
    expect = np.sum(np.diff(cdf) / (1 - cdf[0]) * (x + 10 - 60))
    assert slack_ns(p, 60.0, 10.0) == pytest.approx(expect, rel=1e-12)


def test_eq8_as_printed_rises_as_a_late_swm_nears_t_max() -> None:
    p = pred(1e7, 1.0)
    times = np.linspace(p.mean_ns, p.t_max_ns, 50)
    lit = [slack_eq8_ns(p, float(t), 1.0) for t in times]
    ours = [slack_ns(p, float(t), 1.0) for t in times]
    assert any(b > a for a, b in zip(lit, lit[1:], strict=False))
    assert all(b <= a for a, b in zip(ours, ours[1:], strict=False))


@settings(max_examples=150, deadline=None)
@given(
    sd=st.floats(1.0, 1e6),
    r_share=st.floats(0.01, 3.0),
    cost_share=st.floats(0.0, 3.0),
)
def test_slack_never_grows_as_time_passes(sd: float, r_share: float, cost_share: float) -> None:
    p = pred(1e7, sd)
    r = r_share * sd
    times = np.linspace(p.mean_ns - 6 * sd, p.t_max_ns + 2 * r, 300)
    sl = [slack_ns(p, float(t), r, cost_ns=cost_share * r) for t in times]
    # times near 1e7 ns: the steps' (x + r - t) round at ~1e-9 ns, so allow a femtosecond
    assert all(b <= a + 1e-9 * max(abs(a), 1.0) + 1e-6 for a, b in zip(sl, sl[1:], strict=False))
    assert sl[-1] == pytest.approx(r - cost_share * r, abs=1e-6 * sd)  # times near 1e7: rounding


def test_slack_bad_input() -> None:
    with pytest.raises(ValueError, match="the cycle r must be positive"):
        slack_ns(pred(0.0, 1.0), 0.0, 0.0)
    with pytest.raises(ValueError, match="standard deviation must be positive"):
        slack_ns(Prediction(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), 0.0, 1.0)
    with pytest.raises(ValueError, match="more than"):
        slack_ns(pred(0.0, 1e9), 0.0, 1.0)
