"""The demo's verdict on constructed runs: "sustained" means no drop, no loss and no climbing
latency; otherwise the line names every criterion that failed, with its figures."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from cloudprofiler.jobs.demo_verdict import judge
from cloudprofiler.jobs.latency_slope import latency_trend

RATE = "50,000 tuples/s into each query (windows, latency)"


def _run(latency_s: np.ndarray, **over: Any) -> dict[str, Any]:
    """A measured run's totals with ``latency_s`` the end-to-end latency of records 0.01 s apart."""
    t = np.arange(len(latency_s)) * 0.01
    trend = latency_trend(t, latency_s)
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
    flat = "+0.0005 s/s, 247 ms -> 251 ms in 10.0 s"
    assert line == f"sustained {RATE}: no drop, no loss, latency flat: {flat} (limit 0.05 s/s)"


def test_climbing_latency_alone_is_not_sustained_and_says_by_how_much() -> None:
    t = _run(5.5 + 0.34 * np.arange(501) * 0.01)  # 5.5 s to 7.2 s over 5 s, nothing dropped
    climbs = "latency climbs +0.34 s/s, 5.50 s -> 7.20 s in 5.0 s (limit 0.05 s/s)"
    assert judge(t, 0.05) == f"not sustained: {RATE}: {climbs}"
    assert t["sustained"] is False
    # the same run under a looser limit passes
    assert judge(t, 0.5).startswith(f"sustained {RATE}: no drop, no loss, latency flat: +0.34 s/s, 5.50 s")


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
        "latency climbs +0.1 s/s, 200 ms -> 300 ms in 1.0 s (limit 0.05 s/s)",
    ]
    assert t["verdict"] == f"not sustained: {RATE}: " + "; ".join(t["failed"]) and t["sustained"] is False


def test_too_few_records_for_a_trend_is_said_not_hidden() -> None:
    t = _run(np.full(5, 0.3))
    assert judge(t) == f"sustained {RATE}: no drop, no loss (too few records to tell the latency trend)"
    assert judge(_run(np.full(5, 0.3), lost_per_query={"windows": 3, "latency": 0})) == (
        f"not sustained: {RATE}: the windows query lost 3 in transit"
    )
