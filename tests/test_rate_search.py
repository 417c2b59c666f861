"""The rate search logic, on trials whose capacity is known exactly."""

from __future__ import annotations

import pytest

from cloudprofiler.rate_search import Step, bisect_search, linear_search


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
