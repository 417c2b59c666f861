"""The demo's verdict on constructed runs: "sustained" means no drop, no loss and no climbing
latency; otherwise the line names every criterion that failed, with its figures."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloudprofiler.jobs.demo_verdict import judge
from cloudprofiler.jobs.latency_slope import latency_trend, settled_trend

RATE = "50,000 tuples/s into each query (windows, latency), steady state"
CRITERION = "p50 of the measured run's middle third -> its last third"


def _run(latency_s: np.ndarray, **over: Any) -> dict[str, Any]:
    """A measured run's totals with ``latency_s`` the end-to-end latency of records 0.01 s apart."""
    t = np.arange(len(latency_s)) * 0.01
    trend = settled_trend(t, latency_s)
    totals = {
        "target_rate": 50_000,
        "generator_bound": False,
        "dropped_per_query": {"windows": 0, "latency": 0},
        "lost_per_query": {"windows": 0, "latency": 0},
        "latency_trend": None if trend is None else asdict(trend),
    }
    return totals | over


def test_a_line_through_the_records_gives_the_slope_and_where_latency_goes() -> None:
    t = np.linspace(0.0, 5.0, 501)
    trend = latency_trend(t, 5.5 + 0.34 * t)
    assert trend is not None and trend.samples == 501 and trend.span_s == 5.0
    assert trend.slope == pytest.approx(0.34) and (trend.first_s, trend.last_s) == pytest.approx((5.5, 7.2))
    assert latency_trend(t[:9], t[:9]) is None  # too few records to tell
    assert latency_trend(np.ones(50), np.arange(50.0)) is None  # no time between them


def test_a_flat_sawtooth_with_no_drop_or_loss_is_sustained() -> None:
    saw = 0.2 + 0.1 * (np.arange(1000) % 50) / 50  # the micro-batch cadence, no trend
    t = _run(saw)
    line = judge(t, 0.05)
    assert t["sustained"] is True and t["failed"] == [] and t["verdict"] == line
    flat = "+0.0009 s/s, 249 ms -> 252 ms in 3.3 s"
    assert line == f"sustained {RATE}: no drop, no loss, latency flat: {flat} ({CRITERION}; limit 0.05 s/s)"


def test_climbing_latency_alone_is_not_sustained_and_says_by_how_much() -> None:
    t = _run(5.5 + 0.34 * np.arange(501) * 0.01)  # 5.5 s to 7.2 s over 5 s, nothing dropped
    climbs = f"latency climbs +0.34 s/s, 6.35 s -> 6.92 s in 1.7 s ({CRITERION}; limit 0.05 s/s)"
    assert judge(t, 0.05) == f"not sustained: {RATE}: {climbs}"
    assert t["sustained"] is False
    # the same run under a looser limit passes
    assert judge(t, 0.5).startswith(f"sustained {RATE}: no drop, no loss, latency flat: +0.34 s/s, 6.35 s")


def test_every_failed_criterion_is_named_with_its_query() -> None:
    t = _run(
        0.2 + 0.1 * np.arange(101) * 0.01,
        generator_bound=True,
        dropped_per_query={"windows": 1234, "latency": 0},
        lost_per_query={"windows": 0, "latency": 7},
    )
    judge(t, 0.05)
    assert t["failed"] == [
        "the generator could not offer the rate (generator-bound run)",
        "the windows query's generator dropped 1,234",
        "the latency query lost 7 in transit",
        f"latency climbs +0.1 s/s, 250 ms -> 284 ms in 0.3 s ({CRITERION}; limit 0.05 s/s)",
    ]
    assert t["verdict"] == f"not sustained: {RATE}: " + "; ".join(t["failed"]) and t["sustained"] is False


def test_too_few_records_for_a_trend_is_said_not_hidden() -> None:
    t = _run(np.full(5, 0.3))
    assert judge(t) == f"sustained {RATE}: no drop, no loss (too few records to tell the latency trend)"
    assert judge(_run(np.full(5, 0.3), lost_per_query={"windows": 3, "latency": 0})) == (
        f"not sustained: {RATE}: the windows query lost 3 in transit"
    )


# -- the steady state judged, the warm-up apart (the demo's own path: translated records, its series) --

STEADY = RATE.replace("50,000", "25,000")


def _demo_totals(tmp_path: Path, gen_s: np.ndarray, end_s: np.ndarray) -> tuple[dict[str, Any], Any]:
    """The totals the demo judges, built as ``demo_report.collect`` builds them: the records of a
    demo-shaped run translated (a warm-up whose latency climbs from 0.5 s to 25 s, then the measured
    run's records as ``gen_s`` and ``end_s`` say), their series, the warm-up's figures and the trend."""
    from cloudprofiler.jobs.demo_report import RunClock, _warmup_totals, demo_series, latencies, with_run_time
    from cloudprofiler.jobs.demo_verdict import end_to_end_trend
    from tests.helpers.demo_run import HZ, MEASURED, START, WARM_IDS, write_run

    records, windows, sync, ref, _ = write_run(tmp_path, (gen_s, end_s))
    lat, _ = latencies(records, windows, sync, ref.domain)
    clock = RunClock(ref.apply(START), HZ, (MEASURED - START) / HZ)
    series = demo_series(with_run_time(lat, [WARM_IDS], clock))
    gen = {
        "duration": 2.0,
        "emitted": 200,
        "dropped": 0,
        "senders": [{"first_tuple_id": 1000, "next_tuple_id": 1200}],
    }
    warm = {
        "summaries": {"windows": gen, "latency": gen | {"dropped": 1_000}},  # the warm-up dropped: not judged
        "ready_s": 8.43,
        "load_end_s": 10.9,
        "caught_up_s": 33.0,
    }
    totals = {
        "target_rate": 25_000,
        "generator_bound": False,
        "dropped_per_query": {"windows": 0, "latency": 0},
        "lost_per_query": {"windows": 0, "latency": 0},
        "latency_trend": end_to_end_trend(series),
        "warmup": _warmup_totals(warm, series, clock),
    }
    return totals, series


def _batches(gen_s: np.ndarray, took_s: np.ndarray) -> np.ndarray:
    """When each record is done: micro-batches every 0.5 s, the k-th taking ``took_s[k]`` s."""
    k = (gen_s // 0.5).astype(int)
    return (k + 1) * 0.5 + took_s[k]


def test_the_verdict_is_green_when_the_steady_state_held_and_the_warm_up_did_not(tmp_path: Path) -> None:
    from cloudprofiler.jobs.demo_report import warmup_line

    # 10 s measured on idle queries: the first micro-batches grow to the cadence (0.1 s, 0.4 s, ...
    # up to 1.2 s each, in the first 2 s), then it holds
    gen_s = np.linspace(0.01, 10.0, 500)
    end_s = _batches(gen_s, np.minimum(0.1 + 0.3 * np.arange(21), 1.2))
    totals, series = _demo_totals(tmp_path, gen_s, end_s)
    line = judge(totals, 0.05)
    assert totals["sustained"] is True and totals["failed"] == []
    flat = "-0.00086 s/s, 1.45 s -> 1.44 s in 3.5 s"
    assert line == f"sustained {STEADY}: no drop, no loss, latency flat: {flat} ({CRITERION}; limit 0.05 s/s)"
    # the least-squares line through the whole measured run climbs with those first batches
    (e2e,) = [
        s.steady().figured() for s in series if s.key["to_point"] == "sink" and s.key["from_point"] == "gen"
    ]
    assert len(e2e.t_s) == 500 and latency_trend(e2e.t_s, e2e.duration_ns / 1e9).slope > 0.05
    # the warm-up, whose latency climbed to 25 s and which dropped 1,000, on its own line with its figures
    assert warmup_line(totals) == (
        "warm-up: factories ready 8.4 s after the queries started; 2 s at 25,000 tuples/s into each "
        "query, caught up (read by both, no backlog) 33 s after the start, 22.1 s after its load ended "
        "(dropped: windows 0, latency 1,000; end to end p50 12.7 s, peak 25.0 s); not judged, not in the "
        "tables below"
    )


def test_a_steady_state_that_climbs_is_not_sustained_with_its_figures(tmp_path: Path) -> None:
    # a backlog: every micro-batch takes 0.1 s longer than the one before, to the end of the run (0.2 s
    # per second of gen time, 0.17 s per second of the sink's, the time axis)
    gen_s = np.linspace(0.01, 10.0, 500)
    end_s = _batches(gen_s, 0.3 + 0.1 * np.arange(21))
    totals, _ = _demo_totals(tmp_path, gen_s, end_s)
    line = judge(totals, 0.05)
    climbs = f"latency climbs +0.17 s/s, 1.54 s -> 2.19 s in 3.9 s ({CRITERION}; limit 0.05 s/s)"
    assert totals["sustained"] is False and totals["failed"] == [climbs]
    assert line == f"not sustained: {STEADY}: {climbs}"


def test_a_run_of_two_micro_batches_is_judged_on_them() -> None:
    # records share their micro-batch's sink stamp: two batches leave the middle third empty
    t, lat = np.repeat([0.0, 0.6], 50), np.repeat([0.3, 0.9], 50)
    trend = settled_trend(t, lat)
    assert trend is not None and (trend.first_s, trend.last_s, trend.span_s) == (0.3, 0.9, 0.6)
    assert trend.slope == pytest.approx(1.0) and trend.samples == 100


def test_queries_that_never_catch_up_are_the_verdict_in_one_line() -> None:
    import time

    from cloudprofiler.errors import CommandError
    from cloudprofiler.jobs.demo import _catch_up

    now = time.monotonic()
    with pytest.raises(CommandError) as e:
        _catch_up(
            lambda: False, "the windows query has not read all", deadline=now + 0.3, since=now - 5, rate=25e3
        )
    assert str(e.value) == (
        "not sustained: 25,000 tuples/s into each query: still catching up 5 s after the load ended "
        "(the windows query has not read all; --timeout)"
    )
    _catch_up(lambda: True, "never asked", deadline=now - 1, since=now, rate=25e3)  # caught up: no verdict


# -- a climb within the scatter of the micro-batches is not a backlog --


def _alternating_batches(climb_per_s: float) -> dict[str, Any]:
    """Nine micro-batches 1 s apart, ten records each sharing the batch's stamp and latency: 1.0 s
    and 1.4 s in turn from 3.5 s on (plus ``climb_per_s`` per second of run). The settled batches
    (3.5 s to 8.5 s) scatter about their line by residuals worked out by hand: sigma = 0.2342 s,
    so the climb's standard error (the middle third's 3 batches against the last third's 3, 3 s
    apart) is 0.2342 * sqrt(1/3 + 1/3) / 3 = 0.0638 s/s."""
    bt = np.arange(9) + 0.5
    bl = np.where(np.arange(9) % 2 == 0, 1.4, 1.0) + climb_per_s * bt
    trend = settled_trend(np.repeat(bt, 10), np.repeat(bl, 10))
    return _run(np.zeros(1)) | {"latency_trend": None if trend is None else asdict(trend)}


def test_a_climb_within_the_micro_batches_scatter_is_sustained_with_its_error() -> None:
    t = _alternating_batches(0.0)
    trend = t["latency_trend"]
    assert trend["slope"] == pytest.approx(0.4 / 3) and trend["batches"] == 6  # past the limit of 0.05
    assert trend["slope_se"] == pytest.approx(0.0638, abs=5e-4)
    line = judge(t, 0.05)
    assert t["sustained"] is True and t["failed"] == []
    assert line == (
        f"sustained {RATE}: no drop, no loss, latency climb within the run's noise: +0.13 s/s, 1.00 s -> "
        "1.40 s in 3.0 s, ± 0.13 s/s (2 standard errors over 6 micro-batches) "
        f"({CRITERION}; limit 0.05 s/s; a longer --duration narrows it)"
    )


def test_a_climb_beyond_the_micro_batches_scatter_is_not_sustained() -> None:
    # the same scatter on a backlog of 0.3 s/s: the climb (0.23 s/s by the thirds' medians) stands
    # 0.11 s/s clear of the limit after two standard errors
    t = _alternating_batches(0.3)
    assert t["latency_trend"]["slope"] == pytest.approx(0.7 / 3)
    assert t["latency_trend"]["slope_se"] == pytest.approx(0.0638, abs=5e-4)
    judge(t, 0.05)
    assert t["sustained"] is False
    climbs = f"latency climbs +0.23 s/s, 2.65 s -> 3.35 s in 3.0 s ({CRITERION}; limit 0.05 s/s)"
    assert t["failed"] == [climbs]


def test_too_few_micro_batches_leave_the_error_unknown_and_the_limit_alone() -> None:
    # three settled batches: no scatter to measure, so a climb past the limit fails the run as before
    bt = np.arange(5) + 0.5
    trend = settled_trend(np.repeat(bt, 10), np.repeat(1.0 + 0.2 * bt, 10))
    assert trend is not None and trend.slope_se is None and trend.batches == 3
    t = _run(np.zeros(1)) | {"latency_trend": asdict(trend)}
    judge(t, 0.05)
    assert t["sustained"] is False and t["failed"][0].startswith("latency climbs +0.2 s/s")
