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

A query that may drop tuples (``Target.may_filter``: a user's filter) cannot be
judged by counting its sink alone: its sink holds fewer tuples than were emitted.
Such a query's committed micro-batches are counted as well: what each read
(Spark's ``numInputRows``, ``Target.batches``) and what it wrote (the sink's
manifest of the same batch id). Both counts are taken over the same committed
micro-batches, the trial's (the query has read everything earlier before a trial
starts): the tuples read and not written are ``filtered``, and a trial has
landed when the micro-batch that brought what the query read to all it emitted
finished (or, with tuples lost in transit, all the factory published: the factory
drained and the query read through its latest segments). When it lands after the
grace period, ``received`` and ``filtered`` are those of the micro-batches that
had finished when the grace ran out, so a tuple read after the grace counts
against the trial whether it was written or filtered: emitted = received +
filtered + lost + still in the pipeline when the trial was judged; the verdict
and the landing time agree.

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
from cloudprofiler.jobs.queries import BatchRead, Target
from cloudprofiler.jobs.rate_search import Step, grace_from_landings, reference_latency
from cloudprofiler.jobs.sink_counter import SinkCounter
from cp_source.spool.segments import Spool

# Spark reports a micro-batch's progress just after the batch finished: this long after an instant,
# every batch that finished by then has been reported
PROGRESS_LAG_S = 0.5


class _Offered(NamedTuple):
    summary: dict[str, Any]
    senders: set[int]
    received: int  # committed when judged: at landing, or when the grace period ran out
    filtered: int  # read and not written by then (a query that may filter; 0 otherwise)
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
        self._read: dict[int, BatchRead] = {}  # a filtering query's committed micro-batches, by id
        # the segments the query had read through when the current load started: a micro-batch that
        # reads past them reads the load's tuples (an idle progress report, which has the next batch's
        # id and reads nothing, does not)
        self._base: dict[str, int] = {}
        if self.target.may_filter and (self.target.batches is None or self._spool is None):
            raise ValueError(
                "a query that may filter is judged by its micro-batches and its spool: give both"
            )

    def _last_batch(self) -> BatchRead | None:
        """The query's last committed micro-batch; every batch since the last call is kept in ``_read``."""
        assert self.target.batches is not None  # a query that may filter has them (__post_init__)
        for b in self.target.batches():
            self._read[b.batch] = b
        return self._read[max(self._read)] if self._read else None

    def _read_through(self, last: BatchRead | None) -> bool:
        """``last`` read through every segment the factory has published (true while there is none)."""
        assert self._spool is not None
        end = {} if last is None or last.end is None else last.end
        return all(end.get(w, -1) >= n for w, n in self._spool.latest().items())

    def _reads_load(self, b: BatchRead) -> bool:
        """Micro-batch ``b`` read segments published since the current load started."""
        return b.end is not None and any(n > self._base.get(w, -1) for w, n in b.end.items())

    def _disposed(
        self, senders: set[int], emitted: int, until: float | None = None
    ) -> tuple[float | None, int, int]:
        """(when the load landed, received, filtered) of a query that may filter, both counts over
        the same committed micro-batches: those up to the landing, or, if it landed after ``until``
        or not yet, those that finished by ``until`` (by now without it).

        Landed: when the micro-batch that brought what the query read to every emitted tuple
        finished; or, once the factory drained ``senders`` (what it published is final, the rest
        was lost in transit) and the query read through it, when its last micro-batch finished.
        """
        drained = self._spool is not None and self._spool.drained(senders)
        last = self._last_batch()  # after the drain check: then its latest segments are final
        self.counter.poll()  # after the batch: a batch's manifest is published before its progress
        load = [b for i, b in sorted(self._read.items()) if self._reads_load(b)]
        read, upto = 0, len(load)
        for n, b in enumerate(load, 1):
            read += b.rows
            if read >= emitted:
                upto = n
                break
        landed: float | None = None
        if read >= emitted:
            landed = load[upto - 1].done
        elif drained and self._read_through(last):
            landed = load[-1].done if load else time.time()
        counted = load[:upto]
        if until is not None and (landed is None or landed > until):
            counted = [b for b in load if b.done <= until]
        return (landed, *self._counts(senders, counted))

    def _counts(self, senders: set[int], batches: list[BatchRead]) -> tuple[int, int]:
        """(received, filtered) in ``batches``, the load's committed micro-batches in order."""
        if not batches:
            return 0, 0
        received = self.counter.received(senders, through=batches[-1].batch)
        return received, sum(b.rows for b in batches) - received

    def _settle(self) -> None:
        """Before a load on a query that may filter: wait until it read all the factory published, so
        the micro-batches from now on read only the new load's tuples."""
        deadline = time.time() + self.drain_timeout
        while True:
            drained = self._spool is not None and self._spool.drained()
            last = self._last_batch()  # after the drain check: then the latest segments are final
            if drained and self._read_through(last):
                self._base = {} if last is None or last.end is None else dict(last.end)
                return
            if time.time() > deadline:
                raise TrialError(
                    f"the query under test had not read all the factory published {self.drain_timeout:g} s "
                    "after the last load: a new trial would count those tuples as its own"
                )
            self._check_alive()
            time.sleep(0.1)

    def _landed(self, senders: set[int], emitted: int, until: float) -> tuple[float | None, int, int]:
        """(when everything emitted was accounted for, or None; received; filtered): counted at one
        instant, the landing or ``until`` (a query that may filter), or now."""
        if self.target.may_filter:
            return self._disposed(senders, emitted, until)
        now = time.time()  # before the counts: a check that finds the trial landed dates it from its start
        self.counter.poll()
        received = self.counter.received(senders)
        return (now if received >= emitted else None), received, 0

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
        if self.target.may_filter:
            self._settle()
        summary = self.target.offer(rate, self.duration)
        # the generator's last emission, not when offer() returned: the end-of-stream handshake and
        # the process's exit take a second or more on a loaded machine, time a backlog would drain in
        t_offered = min(time.time(), float(summary.get("end_wall_s") or time.time()))
        senders = {int(s["id"]) for s in summary["senders"]}
        emitted = int(summary["emitted"])
        # grace: how long after the generator stopped the query may take to commit the rest
        deadline = t_offered + grace
        # a filtering query's counts are of the micro-batches finished by the deadline: wait until
        # Spark has reported every one of them
        lag = PROGRESS_LAG_S if self.target.may_filter else 0.0
        while True:
            now = time.time()
            landed, received, filtered = self._landed(senders, emitted, deadline)
            if landed is not None and landed <= deadline:
                return _Offered(summary, senders, received, filtered, t_offered, landed - t_offered)
            if landed is not None or now >= deadline + lag:  # judged on the counts of the deadline
                return _Offered(summary, senders, received, filtered, t_offered, None)
            self._check_alive()
            time.sleep(0.05)

    def _drain(self, senders: set[int], emitted: int) -> tuple[int, int | None, float | None]:
        """Wait until the query committed every tuple the factory published.

        Returns (received, lost, wall time every emitted tuple was committed or None). For a query
        that may filter, lost is None unless the query read everything within the drain timeout:
        only then is what it did not write known to be filtered, not still on its way.
        """
        if self.target.may_filter:
            return self._drain_read(senders, emitted)
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

    def _drain_read(self, senders: set[int], emitted: int) -> tuple[int, int | None, float | None]:
        deadline = time.time() + self.drain_timeout
        while (t_all := self._disposed(senders, emitted)[0]) is None:
            if time.time() > deadline:
                return self.counter.received(senders), None, None
            self._check_alive()
            time.sleep(0.1)
        assert self._spool is not None  # a query that may filter has one (__post_init__)
        while not self._spool.drained(senders):  # the factory's gap counts are final only then
            if time.time() > deadline:
                return self.counter.received(senders), None, t_all
            time.sleep(0.1)
        return self.counter.received(senders), self._spool.stats().lost_of(senders), t_all

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
        # what the query read and did not write in all: known once it has read everything (lost final)
        filtered_all = emitted - lost - drained if self.target.may_filter and lost is not None else 0
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
                "filtered_after_drain": filtered_all,
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
            filtered=off.filtered,
        )
