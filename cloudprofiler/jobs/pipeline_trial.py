"""One constant-rate trial against a running streaming query.

A trial offers a rate for a fixed duration from fresh sender ids, then
compares what the generator emitted with what the query's cloudprofiler sink
committed for exactly those senders (:class:`cloudprofiler.jobs.sink_counter.SinkCounter`).
Before the next trial starts the query is given time to drain, so sink
partitions never mix trials; the factory's ledger (``Spool.stats().lost_of``)
says what was lost in transit, final once the factory has drained.

A trial is judged when everything emitted landed, or when the grace period
after the generator's stop ran out. The automatic grace period is the
pipeline's reference latency (the smallest landing times of the loads it
sustained) plus a small excess, never the latency of one slow load: a backlog
that drains within the grace period passes as sustained.

A query that may drop tuples (``Target.may_filter``: a user's filter or
aggregation) cannot be judged by counting: its sink holds fewer tuples than were
emitted. Its trial has landed once the factory has drained the trial's senders
and the query's last committed micro-batch read every segment the factory
published (``Target.read_through`` against ``Spool.latest``); the tuples it read
and did not write are then ``filtered``, exactly: emitted = in the sink + lost
in transit + filtered.

The target (:mod:`cloudprofiler.jobs.queries`) is a small set of callables, so the
same trial runs the cloudprofiler source, a baseline source fed by another
offer function (socket, files), or a user's query identified by its sink path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cloudprofiler.errors import TrialError
from cloudprofiler.jobs.latency_slope import latency_slope
from cloudprofiler.jobs.queries import Target
from cloudprofiler.jobs.rate_search import Step, grace_from_landings, reference_latency
from cloudprofiler.jobs.sink_counter import SinkCounter
from cp_source.spool.segments import Spool


class _Offered(NamedTuple):
    summary: dict[str, Any]
    senders: set[int]
    received: int  # committed when judged: at landing, or when the grace period ran out
    t_offered: float  # wall time the generator stopped
    landing: float | None  # generator stop -> last tuple committed, s; None: not within the grace period


@dataclass
class PipelineTrial:
    """Run constant-rate trials against ``target``; call it with a rate to get a judged-ready Step.

    With ``grace`` None (automatic), each trial is judged with
    :func:`cloudprofiler.jobs.rate_search.grace_from_landings` over the landing times
    of the loads sustained so far (warm-ups, then trials); an explicit ``grace``
    is used as given.
    """

    target: Target
    duration: float = 5.0
    grace: float | None = 3.0  # None: automatic (grace_from_landings)
    grace_margin: float = 0.5  # automatic grace: excess over the reference latency, s
    drain_timeout: float = 60.0
    latency: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counter = SinkCounter(self.target.sink)
        self.landings: list[float] = []  # landing times of sustained loads, s
        self._spool = None if self.target.spool is None else Spool(self.target.spool)

    def _caught_up(self, senders: set[int]) -> bool:
        """The factory drained ``senders`` and the query committed a micro-batch reading all it published."""
        if self._spool is None or self.target.read_through is None:
            return False
        if not self._spool.drained(senders):
            return False
        latest = self._spool.latest()  # final for these senders: the factory has published all of them
        end = self.target.read_through()
        return end is not None and all(end.get(w, -1) >= n for w, n in latest.items())

    def _landed(self, senders: set[int], emitted: int) -> bool:
        """Everything emitted was committed (or, for a query that may filter, read and committed)."""
        if self.target.may_filter:
            caught_up = self._caught_up(senders)
            self.counter.poll()  # after the check: the commit it saw is in the sink's manifests
            return caught_up
        self.counter.poll()
        return self.counter.received(senders) >= emitted

    def current_grace(self) -> float | None:
        """The grace period the next trial is judged with (None: automatic, before any landing)."""
        if self.grace is not None:
            return self.grace
        return grace_from_landings(self.landings, self.grace_margin)

    def reference_landing(self) -> float | None:
        """The pipeline's reference latency: the median of the three smallest landing times so far."""
        return reference_latency(self.landings)

    def _check_alive(self) -> None:
        why = self.target.alive()
        if why:
            raise TrialError(f"the query under test stopped: {why}")

    def warm_up(self, rate: float, duration: float = 2.0, tries: int = 8, landings: int = 3) -> None:
        """Offer short, unjudged loads until their landing times stop falling (at most ``tries``).

        The first micro-batches start Python workers and JIT-compile parsers; that
        is not the pipeline's sustained behaviour and belongs to no trial. Landing
        times (generator stop to the last tuple committed) keep falling for several
        loads after that: 21.7, 2.1, 1.4, 1.3, 0.6, 0.6 s on a loaded 2-core machine.
        So the first load is not counted, and the warm-up goes on until ``landings``
        loads landed and the newest no longer lands below the reference. The
        landings feed the automatic grace period.
        """
        saved = self.duration
        self.duration = duration
        try:
            for i in range(tries):
                off = self._offer_and_count(rate, grace=self.drain_timeout)
                self._drain(off.senders, int(off.summary["emitted"]))
                if i == 0 or off.landing is None:
                    continue  # the cold start, or nothing to learn about latency
                self.landings.append(off.landing)
                ref = self.reference_landing()
                if len(self.landings) >= landings and ref is not None and off.landing >= ref:
                    break
        finally:
            self.duration = saved
        if self.current_grace() is None:
            raise TrialError(
                f"no warm-up load at {rate:,.0f} tuples/s landed within {self.drain_timeout:g} s: "
                "nothing to size the grace period from (give one)"
            )

    def _offer_and_count(self, rate: float, grace: float) -> _Offered:
        self._check_alive()
        summary = self.target.offer(rate, self.duration)
        # the generator's last emission, not when offer() returned: the end-of-stream handshake and
        # the process's exit take a second or more on a loaded machine, time a backlog would drain in
        t_offered = min(time.time(), float(summary.get("end_wall_s") or time.time()))
        senders = {int(s["id"]) for s in summary["senders"]}
        emitted = int(summary["emitted"])
        # grace: how long after the generator stopped the query may take to commit the rest
        deadline = t_offered + grace
        while True:
            landed = self._landed(senders, emitted)
            received = self.counter.received(senders)
            now = time.time()
            if landed:
                return _Offered(summary, senders, received, t_offered, now - t_offered)
            if now >= deadline:
                return _Offered(summary, senders, received, t_offered, None)
            self._check_alive()
            time.sleep(0.05)

    def _drain(self, senders: set[int], emitted: int) -> tuple[int, int | None, float | None]:
        """Wait until the query committed every tuple the factory published.

        Returns (received, lost, wall time every emitted tuple was committed or None). For a query
        that may filter, lost is None unless the query read everything within the drain timeout:
        only then is what it did not write known to be filtered, not still on its way.
        """
        if self.target.may_filter:
            return self._drain_read(senders)
        deadline = time.time() + self.drain_timeout
        lost: int | None = None
        while True:
            self.counter.poll()
            received = self.counter.received(senders)
            if received >= emitted:
                return received, 0, time.time()  # everything emitted arrived: nothing was lost
            if self.target.spool is None:
                lost = 0
            elif Spool(self.target.spool).drained(senders):
                # only now are the factory's gap counts final
                lost = Spool(self.target.spool).stats().lost_of(senders)
                if lost is not None and received >= emitted - lost:
                    return received, lost, None
            if time.time() > deadline:
                return received, lost, None
            self._check_alive()
            time.sleep(0.1)

    def _drain_read(self, senders: set[int]) -> tuple[int, int | None, float | None]:
        deadline = time.time() + self.drain_timeout
        while not self._caught_up(senders):
            if time.time() > deadline:
                self.counter.poll()
                return self.counter.received(senders), None, None
            self._check_alive()
            time.sleep(0.1)
        self.counter.poll()
        assert self._spool is not None  # _caught_up needs the spool
        return self.counter.received(senders), self._spool.stats().lost_of(senders), time.time()

    def __call__(self, rate: float) -> Step:
        import native_tsc

        grace = self.current_grace()
        if grace is None:
            raise ValueError("an automatic grace period needs warm_up() first")
        t_start, tsc_start = time.time(), native_tsc.now()
        off = self._offer_and_count(rate, grace)
        summary, senders = off.summary, off.senders
        tsc_offered = native_tsc.now()
        t_judged = time.time()
        slope, samples = latency_slope(self.target.sink, senders) if self.latency else (None, 0)
        # drain before the next trial so no sink partition mixes two trials
        drained, lost, t_all = self._drain(senders, int(summary["emitted"]))
        # the landing past the grace period too: how far a backlog was from passing
        landing = off.landing if off.landing is not None or t_all is None else t_all - off.t_offered
        mixed = self.counter.mixed_with(senders)
        if mixed:
            raise TrialError(f"sink partitions mixed tuples of different trials: {mixed[:3]}")
        emitted = int(summary["emitted"])
        # what the query read and did not write: known once it has read everything (lost is then final)
        filtered = emitted - lost - drained if self.target.may_filter and lost is not None else 0
        clean = not summary["dropped"] and not lost and not summary["generator_bound"]
        if off.landing is not None and clean:
            self.landings.append(off.landing)  # a load it sustained: its latency is the pipeline's
        self.history.append(
            {
                "rate": rate,
                "t_start": t_start,
                "t_offered": off.t_offered,
                "t_judged": t_judged,
                "tsc_start": tsc_start,
                "tsc_offered": tsc_offered,
                "node": native_tsc.domain_id(),
                "t_drained": time.time(),
                "senders": sorted(senders),
                # the ids the generator numbered, [first, next) per sender, and those it could not send
                "id_ranges": [[s["first_tuple_id"], s["next_tuple_id"]] for s in summary["senders"]],
                "dropped_ranges": [r for s in summary["senders"] for r in s.get("dropped_ranges", [])],
                "received_after_drain": drained,
                "filtered": filtered,
                "latency_samples": samples,
                "lost_known": lost is not None,
                "grace": grace,
                "landing": landing,
                "max_lag_ms": summary.get("max_lag_ms"),
            }
        )
        return Step(
            rate=rate,
            emitted=int(summary["emitted"]),
            dropped=int(summary["dropped"]),
            lost=int(lost or 0),
            received=int(off.received),
            generator_bound=bool(summary["generator_bound"]),
            achieved_rate=float(summary["achieved_rate"]),
            latency_slope=slope,
            duration=self.duration,
            landing=landing,
            grace=grace,
            filtered=filtered,
        )
