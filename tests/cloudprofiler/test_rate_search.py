"""The rate search logic, on trials whose capacity is known exactly."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from cloudprofiler.jobs.rate_search import (
    Step,
    bisect_search,
    grace_from_landings,
    linear_search,
    reference_latency,
)


def capacity_trial(capacity: float, generator_max: float = 1e12, duration: float = 10.0):
    """A pipeline that keeps up to ``capacity`` tuples/s and backs up (drops) above it."""
    calls: list[float] = []

    def trial(rate: float) -> Step:
        calls.append(rate)
        emitted = int(rate * duration)
        if rate > generator_max:
            return Step(rate, emitted, 0, 0, emitted, generator_bound=True)
        if rate <= capacity:
            return Step(rate, emitted, 0, 0, emitted, generator_bound=False)
        dropped = int((rate - capacity) * duration)
        return Step(rate, emitted - dropped, dropped, 0, emitted - dropped, generator_bound=False)

    trial.calls = calls  # type: ignore[attr-defined]
    return trial


@pytest.mark.parametrize("capacity", [37_000.0, 1_000_000.0, 4_321_000.0])
def test_bisect_brackets_capacity(capacity: float) -> None:
    t = capacity_trial(capacity)
    r = bisect_search(t, start=10_000, tolerance=0.02)
    assert r.max_rate is not None
    assert capacity / 1.02 <= r.max_rate <= capacity
    # Every step's verdict follows from the known capacity.
    for s in r.steps:
        assert s.verdict == ("sustained" if s.rate <= capacity else "drop")
    lin = linear_search(capacity_trial(capacity), start=10_000, increment=capacity * 0.02)
    assert lin.max_rate is not None and capacity * 0.98 <= lin.max_rate <= capacity
    # Bisection needs far fewer trials than linear steps of the same resolution.
    assert len(r.steps) < len(lin.steps) / 2


def test_start_above_capacity_searches_down() -> None:
    r = bisect_search(capacity_trial(50_000), start=1_000_000, tolerance=0.05)
    assert r.max_rate is not None and 50_000 / 1.05 <= r.max_rate <= 50_000


def test_generator_bound_caps_instead_of_counting_as_drop() -> None:
    # The pipeline could take 10 M/s but the generator only offers 3 M/s.
    r = bisect_search(capacity_trial(10e6, generator_max=3e6), start=1e6, tolerance=0.05)
    assert r.generator_cap is not None and r.generator_cap > 3e6
    assert r.max_rate is not None and 3e6 / 1.05 <= r.max_rate <= 3e6
    assert all(s.verdict in ("sustained", "generator-bound") for s in r.steps)
    lin = linear_search(capacity_trial(10e6, generator_max=3e6), start=1e6, increment=1e6)
    assert lin.max_rate == 3e6 and lin.generator_cap == 4e6
    assert "generator could not offer" in lin.stopped_because


def test_backlog_lost_and_latency_growth_fail_a_step() -> None:
    assert Step(1000, 1000, 0, 0, 990, False).judge(None) == "backlog"
    assert Step(1000, 1000, 0, 3, 997, False).judge(None) == "lost"
    s = Step(1000, 1000, 0, 0, 1000, False, latency_slope=0.2)
    assert s.judge(None) == "sustained"
    assert s.judge(0.05) == "latency-growth"


def test_more_received_than_emitted_is_an_error() -> None:
    with pytest.raises(AssertionError, match="duplicates"):
        Step(1000, 1000, 0, 0, 1001, False).judge(None)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        bisect_search(capacity_trial(1), start=1, tolerance=0)
    with pytest.raises(ValueError, match="increment"):
        linear_search(capacity_trial(1), start=1, increment=0)


def landing_trial(
    capacity: float, duration: float, latencies: list[float], grace_of: Callable[[list[float]], float | None]
):
    """A pipeline of ``capacity`` judged by landing time, as PipelineTrial judges the real one.

    Below capacity the last tuple lands one of ``latencies`` after the generator
    stops. Above, the spool absorbs the backlog (no drops): ``(R - C) * D`` tuples
    that the saturated pipeline drains ``D * (R / C - 1)`` s after the stop, plus
    0.2 s past the bottleneck. Landings of sustained trials feed ``grace_of``.
    """
    lat = itertools.cycle(latencies)
    landings: list[float] = []

    def trial(rate: float) -> Step:
        grace = grace_of(landings)
        assert grace is not None
        over = rate > capacity
        landing = 0.2 + duration * (rate / capacity - 1) if over else next(lat)
        emitted = int(rate * duration)
        received = emitted if landing <= grace else emitted - int((landing - grace) * capacity)
        if received == emitted:
            landings.append(landing)
        return Step(rate, emitted, 0, 0, received, False, duration=duration, landing=landing, grace=grace)

    return trial, landings


def test_grace_from_a_late_landing_passes_an_overload() -> None:
    # The automatic grace of a run on a loaded machine (6.87 s, the median landing of warm-ups still
    # warming up) against 10 s trials: a 35 % overload drains within it and passes as sustained.
    trial, _ = landing_trial(10_000, 10.0, [0.7, 0.9, 1.0], lambda _: 6.87)
    r = bisect_search(trial, start=9_000, tolerance=0.08)
    assert r.max_rate is not None and r.max_rate > 13_000


def test_grace_from_the_smallest_landings_keeps_the_search_within_grace_over_duration() -> None:
    # Warm-up landings measured on a loaded 2-core machine after the cold start: still falling.
    warm = [2.1, 1.4, 1.3, 0.6, 0.6]
    trial, landings = landing_trial(10_000, 15.0, [0.7, 0.9, 1.0], lambda ls: grace_from_landings(warm + ls))
    r = bisect_search(trial, start=9_000, tolerance=0.08)
    graces = [s.grace for s in r.steps]
    assert graces[0] == pytest.approx(0.6 + 0.5)
    assert graces == sorted(graces, reverse=True)  # sustained landings never raise it
    assert r.max_rate is not None and 9_000 <= r.max_rate <= 10_000 * (1 + graces[0] / 15.0)
    for s in r.steps:
        assert s.landing is not None and s.grace is not None
        assert (s.verdict == "backlog") == (s.landing > s.grace)


def test_reference_latency_is_the_median_of_the_smallest_and_never_rises() -> None:
    assert reference_latency([]) is None and grace_from_landings([]) is None
    assert reference_latency([21.7]) == 21.7
    assert reference_latency([21.7, 2.1, 1.4, 1.3, 0.6]) == 1.3
    assert grace_from_landings([21.7, 2.1, 1.4, 1.3, 0.6], margin=0.25) == pytest.approx(1.55)
    landings: list[float] = []
    refs = []
    for x in [3.0, 2.0, 5.0, 0.5, 9.0, 0.7, 8.0]:
        landings.append(x)
        refs.append(reference_latency(landings))
    assert refs[2:] == sorted(refs[2:], reverse=True)  # from three landings on
