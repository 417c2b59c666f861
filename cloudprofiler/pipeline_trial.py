"""One constant-rate trial against a running streaming query.

A trial offers a rate for a fixed duration from fresh sender ids, then
compares what the generator emitted with what the query's cloudprofiler sink
committed for exactly those senders (:class:`cloudprofiler.sink_counter.SinkCounter`).
Before the next trial starts the query is given time to drain, so sink
partitions never mix trials; the factory's ledger (``Spool.stats().lost_of``)
says what was lost in transit, final once the factory has drained.

The target (:mod:`cloudprofiler.queries`) is a small set of callables, so the
same trial runs the cloudprofiler source, a baseline source fed by another
offer function (socket, files), or a user's query identified by its sink path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloudprofiler.errors import TrialError
from cloudprofiler.latency_slope import latency_slope
from cloudprofiler.queries import Target
from cloudprofiler.rate_search import Step
from cloudprofiler.sink_counter import SinkCounter
from cp_source.spool import Spool


@dataclass
class PipelineTrial:
    """Run constant-rate trials against ``target``; call it with a rate to get a judged-ready Step."""

    target: Target
    duration: float = 5.0
    grace: float | None = 3.0  # None: the warm-up's landing time + grace_margin
    grace_margin: float = 0.25
    drain_timeout: float = 60.0
    latency: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counter = SinkCounter(self.target.sink)
        self.landing_s: float | None = None
        self._landed_at = 0.0

    def _check_alive(self) -> None:
        why = self.target.alive()
        if why:
            raise TrialError(f"the query under test stopped: {why}")

    def warm_up(self, rate: float, duration: float = 2.0, tries: int = 6, landings: int = 3) -> None:
        """Offer short, unjudged loads until ``landings`` of them land within the grace period.

        The first micro-batches start Python workers and JIT-compile parsers; that
        is not the pipeline's sustained behaviour and belongs to no trial. With
        ``grace`` None (automatic), the grace period becomes the median landing time
        (generator stop to the last tuple committed) of the last ``landings`` warm-ups
        plus ``grace_margin``; the first ones, still warming up, land late.
        """
        saved, saved_grace = self.duration, self.grace
        self.duration = duration
        if self.grace is None:
            self.grace = self.drain_timeout
        landed: list[float] = []
        try:
            for _ in range(tries):
                summary, senders, received, t_offered = self._offer_and_count(rate, grace=self.grace)
                self._drain(senders, int(summary["emitted"]))
                if received >= int(summary["emitted"]):
                    landed.append(self._landed_at - t_offered)
                    if len(landed) >= landings:
                        break
                else:
                    landed.clear()
        finally:
            self.duration = saved
            self.grace = saved_grace
        self.landing_s = float(np.median(landed[-landings:])) if landed else None
        if self.grace is None:
            self.grace = (self.landing_s if self.landing_s is not None else 3.0) + self.grace_margin

    def _offer_and_count(self, rate: float, grace: float) -> tuple[dict[str, Any], set[int], int, float]:
        self._check_alive()
        summary = self.target.offer(rate, self.duration)
        t_offered = time.time()
        senders = {int(s["id"]) for s in summary["senders"]}
        emitted = int(summary["emitted"])
        # grace: how long after the generator stopped the query may take to commit the rest
        deadline = t_offered + grace
        while True:
            self.counter.poll()
            received = self.counter.received(senders)
            if received >= emitted or time.time() >= deadline:
                self._landed_at = time.time()
                return summary, senders, received, t_offered
            self._check_alive()
            time.sleep(0.05)

    def _drain(self, senders: set[int], emitted: int) -> tuple[int, int | None]:
        """Wait until the query committed every tuple the factory published; return (received, lost)."""
        deadline = time.time() + self.drain_timeout
        lost: int | None = None
        while True:
            self.counter.poll()
            received = self.counter.received(senders)
            if received >= emitted:
                return received, 0  # everything emitted arrived: nothing was lost
            if self.target.spool is None:
                lost = 0
            elif Spool(self.target.spool).drained(senders):
                # only now are the factory's gap counts final
                lost = Spool(self.target.spool).stats().lost_of(senders)
                if lost is not None and received >= emitted - lost:
                    return received, lost
            if time.time() > deadline:
                return received, lost
            self._check_alive()
            time.sleep(0.1)

    def __call__(self, rate: float) -> Step:
        import native_tsc

        t_start, tsc_start = time.time(), native_tsc.now()
        if self.grace is None:
            raise ValueError("an automatic grace period needs warm_up() first")
        summary, senders, received, t_offered = self._offer_and_count(rate, self.grace)
        tsc_offered = native_tsc.now()
        t_judged = time.time()
        slope, samples = latency_slope(self.target.sink, senders) if self.latency else (None, 0)
        # drain before the next trial so no sink partition mixes two trials
        drained, lost = self._drain(senders, int(summary["emitted"]))
        mixed = self.counter.mixed_with(senders)
        if mixed:
            raise TrialError(f"sink partitions mixed tuples of different trials: {mixed[:3]}")
        self.history.append(
            {
                "rate": rate,
                "t_start": t_start,
                "t_offered": t_offered,
                "t_judged": t_judged,
                "tsc_start": tsc_start,
                "tsc_offered": tsc_offered,
                "node": native_tsc.domain_id(),
                "t_drained": time.time(),
                "senders": sorted(senders),
                "received_after_drain": drained,
                "latency_samples": samples,
                "lost_known": lost is not None,
                "grace": self.grace,
                "max_lag_ms": summary.get("max_lag_ms"),
            }
        )
        return Step(
            rate=rate,
            emitted=int(summary["emitted"]),
            dropped=int(summary["dropped"]),
            lost=int(lost or 0),
            received=int(received),
            generator_bound=bool(summary["generator_bound"]),
            achieved_rate=float(summary["achieved_rate"]),
            latency_slope=slope,
            duration=self.duration,
        )
