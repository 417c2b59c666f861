"""Maximum-sustainable-rate search over constant-rate trials.

A trial offers one rate for a fixed duration and reports what the generator
emitted and dropped, what the factory lost in transit and what the sink
committed. A rate is sustained when nothing was dropped or lost, everything
emitted reached the sink within the grace period, and (optionally) event-time
latency did not keep growing. A trial in which the generator itself fell
behind its schedule says nothing about the pipeline: it is invalid, and it
caps the search instead of counting as a drop.

An overload shows as a backlog: ``(R - C) * D`` tuples for rate ``R``, capacity
``C`` and duration ``D``, which drain ``D * (R / C - 1)`` seconds after the
generator stops. A rate above capacity passes when that fits in the grace
period beyond the pipeline's own latency, so the grace period over the
duration bounds the search's precision (:func:`grace_from_landings`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["sustained", "drop", "lost", "backlog", "latency-growth", "generator-bound"]


@dataclass
class Step:
    """One constant-rate trial and what it showed."""

    rate: float
    emitted: int
    dropped: int
    lost: int
    received: int
    generator_bound: bool
    achieved_rate: float = 0.0
    latency_slope: float | None = None  # seconds of event-time latency gained per second of run
    duration: float = 0.0
    landing: float | None = None  # generator stop -> last tuple committed, s (None: never, or unknown)
    grace: float | None = None  # the grace period this trial was judged with, s
    # tuples the query itself dropped (a user's filter): published by the factory, read by the
    # query, not in the sink; 0 for a query that passes every tuple. Counted at the same instant as
    # ``received`` (at landing, or when the grace period ran out), over the same micro-batches
    filtered: int = 0
    verdict: Verdict = "sustained"

    @property
    def pending(self) -> int:
        """Emitted tuples neither lost, received nor filtered when the trial was judged: still in the
        pipeline when the grace period ran out (emitted = lost + received + filtered + pending)."""
        return self.emitted - self.lost - self.received - self.filtered

    def judge(self, latency_slope_limit: float | None) -> Verdict:
        """Set and return the verdict; the first failed criterion names it."""
        if self.generator_bound:
            v: Verdict = "generator-bound"
        elif self.dropped > 0:
            v = "drop"
        elif self.lost > 0:
            v = "lost"
        elif self.received + self.filtered < self.emitted:
            v = "backlog"
        elif (
            latency_slope_limit is not None
            and self.latency_slope is not None
            and self.latency_slope > latency_slope_limit
        ):
            v = "latency-growth"
        else:
            v = "sustained"
        if self.received + self.filtered > self.emitted:
            raise AssertionError(
                f"the query received {self.received} and filtered {self.filtered} tuples of a trial that "
                f"emitted {self.emitted}: duplicates or tuples from another trial"
            )
        self.verdict = v
        return v


def reference_latency(landings: list[float], k: int = 3) -> float | None:
    """The median of the ``k`` smallest landing times: the pipeline's latency once warmed up.

    A pipeline still warming up, or a slow moment on a shared machine, lands late;
    the smallest landings are what the pipeline does when nothing else is in the
    way. From ``k`` landings on it can only fall. None without any landing.
    """
    if not landings:
        return None
    return float(statistics.median(sorted(landings)[:k]))


def grace_from_landings(landings: list[float], margin: float = 0.5) -> float | None:
    """The automatic grace period: :func:`reference_latency` of ``landings`` plus ``margin`` seconds.

    ``landings`` are the landing times (generator stop -> last tuple committed) of
    loads the pipeline sustained; ``margin`` absorbs how much a sustained load's
    landing varies with the micro-batch it falls in. A backlog that drains within
    the grace period passes, so a trial of ``D`` seconds lets a rate pass up to
    ``grace / D`` above capacity, and in practice about ``(grace - L) / D``
    where ``L`` is the latency past the bottleneck. None without any landing.
    """
    ref = reference_latency(landings)
    return None if ref is None else ref + margin


@dataclass
class SearchResult:
    """The last sustained rate and every step that led to it."""

    max_rate: float | None
    method: str
    steps: list[Step] = field(default_factory=list)
    stopped_because: str = ""
    generator_cap: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = asdict(self)
        d["steps"] = [asdict(s) for s in self.steps]
        return d


Trial = Callable[[float], Step]


def _run(
    trial: Trial,
    rate: float,
    result: SearchResult,
    limit: float | None,
    progress: Callable[[Step], None] | None,
) -> Verdict:
    step = trial(rate)
    verdict = step.judge(limit)
    result.steps.append(step)
    if progress is not None:
        progress(step)
    return verdict


def linear_search(
    trial: Trial,
    start: float,
    increment: float,
    max_rate: float = math.inf,
    max_steps: int = 50,
    latency_slope_limit: float | None = None,
    progress: Callable[[Step], None] | None = None,
) -> SearchResult:
    """The paper's method: raise the rate by ``increment`` until the first failed trial."""
    if start <= 0 or increment <= 0:
        raise ValueError("start rate and increment must be positive")
    result = SearchResult(max_rate=None, method="linear")
    rate = start
    while len(result.steps) < max_steps and rate <= max_rate:
        verdict = _run(trial, rate, result, latency_slope_limit, progress)
        if verdict == "generator-bound":
            result.generator_cap = rate
            result.stopped_because = f"the generator could not offer {rate:,.0f} tuples/s"
            return result
        if verdict != "sustained":
            result.stopped_because = f"{verdict} at {rate:,.0f} tuples/s"
            return result
        result.max_rate = rate
        rate += increment
    result.stopped_because = "reached the step or rate limit without a failure"
    return result


def bisect_search(
    trial: Trial,
    start: float,
    tolerance: float = 0.05,
    max_rate: float = math.inf,
    min_rate: float = 1.0,
    max_steps: int = 20,
    latency_slope_limit: float | None = None,
    progress: Callable[[Step], None] | None = None,
) -> SearchResult:
    """Double the rate until a trial fails, then bisect between the last pass and the first failure.

    Stops when the failing and passing rates are within ``tolerance`` (relative).
    A generator-bound trial caps the bracket from above: rates above it cannot be
    tested on this machine, which the result says.
    """
    if start <= 0 or not 0 < tolerance < 1:
        raise ValueError("start rate must be positive and tolerance within (0, 1)")
    result = SearchResult(max_rate=None, method="bisect")
    lo: float | None = None
    hi: float | None = None
    rate = min(start, max_rate)
    while len(result.steps) < max_steps:
        verdict = _run(trial, rate, result, latency_slope_limit, progress)
        if verdict == "sustained":
            lo = rate
        else:
            hi = rate
            if verdict == "generator-bound":
                cap = result.generator_cap
                result.generator_cap = rate if cap is None else min(cap, rate)
        if hi is None:
            if rate >= max_rate:
                result.stopped_because = f"sustained the highest rate allowed ({max_rate:,.0f} tuples/s)"
                break
            rate = min(rate * 2, max_rate)
            continue
        if lo is None:
            if rate / 2 < min_rate:
                result.stopped_because = f"no rate down to {min_rate:,.0f} tuples/s was sustained"
                break
            rate = rate / 2
            continue
        if hi / lo - 1 <= tolerance:
            last_fail = next(s for s in reversed(result.steps) if s.rate == hi)
            result.stopped_because = (
                f"bracketed within {tolerance:.0%}: sustained {lo:,.0f}, {last_fail.verdict} at {hi:,.0f}"
            )
            break
        rate = (lo + hi) / 2
    else:
        result.stopped_because = f"stopped after {max_steps} steps"
    result.max_rate = lo
    return result
