"""The emission loop's pacing: each bucket gets a fixed time budget and leaves at its deadline.

The loop gives every bucket a fixed time budget (``bucket / rate`` seconds): bucket k is due at
``t0 + k * budget``; the sender sleeps until 200 us before the deadline and busy-waits the rest,
then sends without blocking. A send the receiver cannot take (ZeroMQ EAGAIN) is a counted drop: the
bucket's tuple ids are consumed all the same, so drops are exact id ranges, and its bucket sequence
number is not (sequence numbers count buckets actually sent, so a gap in them is loss in transit).
If the loop falls behind its own schedule it catches up by sending back to back; a sender still
emitting after twice its duration plus a second stops early (``aborted``). Event times: see
``cp_source.generate.events``.

The intended stamp. Every data bucket's header carries, beside its send stamp, the TSC at which the
schedule meant it to leave (``Intended``): bucket k at ``t0 + round(k * bucket * hz / rate)`` ticks of
the sender's own TSC (``hz``: ``native_tsc.frequency_hz()``). A wait for the factory's credit moves
the loop's deadlines, never this schedule, so the time a sender was held or ran behind shows as
``intended -> gen`` and in every latency that starts at ``intended`` (the coordinated-omission
correction of wrk2 and HdrHistogram). It costs one multiplication per bucket and nothing per tuple.
The loop's deadlines run on ``time.perf_counter_ns``: for a punctual sender ``gen - intended`` is the
two clocks' difference since ``t0`` (microseconds per second at most), which may be slightly negative.

Heartbeats. While the loop sleeps toward a deadline more than ``heartbeat_ms`` away it sends a
heartbeat every ``heartbeat_ms``: seq = the data buckets sent so far (the next bucket's seq) and
``wall_ns`` = a lower bound on the event time of every tuple the sender still has to send (the next
bucket's own event time on a schedule clock). A heartbeat's bound also lifts the floor of the
event times' ``max``, so the promise holds whatever the wall clock does. A heartbeat the queue
cannot take is skipped: the next one says the same or more.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from functools import partial as bind
from typing import Any

import zmq

import native_tsc
from cp_source.generate.credit import POLL_MS, CreditGate
from cp_source.generate.events import EventSettings, event_clock
from cp_source.generate.hot_keys import Payloads
from cp_source.generate.payloads import bucket_shape
from cp_source.wire import bucket as bk

SPIN_NS = 200_000  # busy-wait the last 200 us before a deadline; sleep before that (sleep overshoots ~60 us)
SLEEP_MIN_NS = 300_000
ABORT_FACTOR = 2.0  # a sender still emitting after 2x its duration (+1 s) stops: it cannot offer the rate


def add_drop(ranges: list[list[int]], first: int, count: int) -> None:
    """Record ids first .. first+count-1 as dropped, extending the last range when they follow it."""
    if ranges and ranges[-1][0] + ranges[-1][1] == first:
        ranges[-1][1] += count
    else:
        ranges.append([first, count])


@dataclass(frozen=True, slots=True)
class Intended:
    """A sender's schedule on its TSC: data bucket k was meant to leave at ``at(k)``."""

    t0: int  # TSC of bucket 0's deadline
    hz: float  # the sender's TSC frequency (counts per second)
    ticks: float  # TSC ticks per bucket: bucket * hz / rate

    @classmethod
    def start(cls, bucket: int, rate: float, lead_ns: int) -> Intended:
        """The schedule of a loop whose bucket 0 is due ``lead_ns`` from now; read just before the
        loop's own clock, so ``t0`` is not later than the loop's first deadline."""
        hz = native_tsc.frequency_hz()
        return cls(native_tsc.now() + round(lead_ns * hz / 1e9), hz, bucket * hz / rate)

    def at(self, k: int) -> int:
        return self.t0 + round(k * self.ticks)


@dataclass
class Emission:
    """What the emission loop did: counters, the id after the last one used, and its clock span."""

    next_id: int
    emitted: int
    dropped: int
    ranges: list[list[int]]
    seq: int
    max_lag: int
    aborted: bool
    t0: int
    end: int
    end_wall: float  # wall time (s) the loop ended: the last bucket's emission, for landing times
    event_first: int | None = None  # event time (ms) of the first and the last bucket
    event_last: int | None = None
    heartbeats: int = 0
    delay_seed: int | None = None  # with an injected delay: the seed, the drawn delays' mean and max
    delay_ms_mean: float | None = None
    delay_ms_max: float | None = None
    credit: CreditGate | None = None  # the factory's flow control, as the loop saw it
    intended: Intended | None = None  # the schedule on the sender's TSC (None: the loop never started)


class Heartbeats:
    """Heartbeats sent while the loop sleeps toward a deadline more than one interval away."""

    def __init__(
        self, sock: zmq.Socket[Any], packer: bk.HeaderPacker, interval_ms: float, lag_ns: int, jitter_ns: int
    ) -> None:
        self.sock, self.packer = sock, packer
        self.interval = int(interval_ms * 1e6)
        self.reach = self.interval + SPIN_NS  # a wait longer than this has room for a heartbeat
        self.behind_ns = lag_ns + jitter_ns  # wall clock: no bucket to come is further behind it than this
        self.sent = 0

    def wait(self, deadline: int, seq: int, exact: int | None, floor: int, held: int | None = None) -> int:
        """Sleep toward ``deadline`` in heartbeat intervals, a heartbeat after each while one more
        interval fits; return the event-time floor, lifted to the bound the heartbeats promised.

        ``exact``: the next bucket's event time when it is known in advance (schedule clock).
        ``held``: the smallest event time of the buckets generated but held back by an injected
        delay (None: none held); it is then the bound, and the floor stays where it is.
        """
        clock = time.perf_counter_ns
        now = clock()
        while deadline - now > self.reach:
            time.sleep(self.interval / 1e9)
            now = clock()
            if deadline - now <= self.reach:
                break
            floor = self.beat(seq, exact, floor, held)
        return floor

    def beat(self, seq: int, exact: int | None, floor: int, held: int | None = None) -> int:
        """Send one heartbeat (``wait``'s arguments); the floor, lifted to its bound when it was sent."""
        if held is not None:
            bound = held  # at most floor: generated earlier than any bucket still to come
        else:
            bound = exact if exact is not None else (time.time_ns() - self.behind_ns) // 1_000_000
            bound = max(bound, floor)
        hdr = self.packer.pack(bk.KIND_HEARTBEAT, seq, 0, 0, 0, native_tsc.now(), bound * 1_000_000)
        try:
            self.sock.send(hdr, zmq.NOBLOCK | zmq.SNDMORE)
        except zmq.Again:
            return floor  # the queue is full: skipped, the next heartbeat says as much or more
        self.sock.send(b"", zmq.NOBLOCK)
        self.sent += 1
        return max(floor, bound)


def emit(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    payloads: Payloads,
    bucket: int,
    rate: float,
    tuples: int,
    first: int,
    barrier: Any,
    ev: EventSettings,
    sender_index: int,
    gate: CreditGate | None = None,
) -> Emission:
    """The timed loop: bucket k leaves at t0 + k * budget, shifted by any wait for ``gate``'s credit."""
    n_buckets, last_rows, partial = bucket_shape(payloads, bucket, tuples)
    period = bucket / rate * 1e9
    pool, n_pool = payloads.pools[0], len(payloads.pools[0])  # every pool of a sender has the same length
    switches = iter(payloads.switches)  # hot-key epochs: the pool changes at these buckets
    switch_k, switch_to = next(switches, (-1, 0))
    emitted = dropped = seq = max_lag = 0
    next_id, aborted, ranges = first, False, list[list[int]]()
    now_tsc, clock, wall, send = native_tsc.now, time.perf_counter_ns, time.time_ns, sock.send
    flags_more = zmq.NOBLOCK | zmq.SNDMORE
    sched, start, lag_f, jit_f, lag_ns, jit_ns = event_clock(ev, sender_index)
    rnd = random.Random(packer.sender_id).random
    hb, gate, beats = _beats(sock, packer, ev.heartbeat_ms, lag_ns + jit_ns, gate)
    prev = e = -(1 << 62)
    first_ev: int | None = None
    native_tsc.frequency_hz()  # measured once per process (50 ms): before the barrier, not in t0
    if barrier is not None:
        barrier.wait()
    plan = Intended.start(bucket, rate, 1_000_000)
    t0 = clock() + 1_000_000
    give_up = t0 + int((tuples / rate * ABORT_FACTOR + 1.0) * 1e9)
    for k in range(n_buckets):
        deadline = t0 + int(k * period)
        now = clock()
        if now > give_up:
            aborted = True  # hopelessly behind: the run is generator-bound either way
            break
        if sched:
            base = start + math.floor(k * bucket / rate * 1000)
            e = math.floor(base - lag_f - (rnd() * jit_f if jit_f else 0.0))
            e = e if e > prev else prev
        if gate.blocks(k, seq):
            waited, prev = gate.wait(seq, bind(beats.beat, seq, e if sched else None), prev)
            t0, give_up, deadline, now = t0 + waited, give_up + waited, deadline + waited, clock()
        if now < deadline:
            prev = _sleep_until(deadline, now, hb, seq, e if sched else None, prev)
        elif now - deadline > max_lag:
            max_lag = now - deadline
        if not sched:
            off = lag_ns + int(rnd() * jit_ns) if jit_ns else lag_ns
            e = (wall() - off) // 1_000_000
            e = e if e > prev else prev
        prev = e
        first_ev = e if first_ev is None else first_ev
        if k == switch_k:
            pool, (switch_k, switch_to) = payloads.pools[switch_to], next(switches, (-1, 0))
        count = bucket if k < n_buckets - 1 or not partial else last_rows
        payload = pool[k % n_pool] if count == bucket else partial
        hdr = packer.pack(
            bk.KIND_DATA, seq, next_id, count, len(payload), now_tsc(), e * 1_000_000, plan.at(k)
        )
        try:
            send(hdr, flags_more)
        except zmq.Again:
            add_drop(ranges, next_id, count)
            dropped += count
        else:
            send(payload, zmq.NOBLOCK, copy=False)  # never fails once the first part is queued
            emitted += count
            seq += 1
        next_id += count
    em = Emission(next_id, emitted, dropped, ranges, seq, max_lag, aborted, t0, clock(), wall() / 1e9)
    em.event_first, em.event_last = first_ev, (prev if first_ev is not None else None)
    em.heartbeats, em.credit = beats.sent, gate  # with those sent while it waited for credit
    em.intended = plan
    return em


def _sleep_until(deadline: int, now: int, hb: Heartbeats | None, seq: int, ev: int | None, prev: int) -> int:
    """Wait for ``deadline`` (perf_counter ns): heartbeats while it is far, then a sleep and a spin.
    Returns the event time the last heartbeat carried (``prev`` if none was sent)."""
    if hb is not None and deadline - now > hb.reach:
        prev = hb.wait(deadline, seq, ev, prev)
        now = time.perf_counter_ns()
    if deadline - now > SLEEP_MIN_NS:
        time.sleep((deadline - now - SPIN_NS) / 1e9)
    while time.perf_counter_ns() < deadline:
        pass
    return prev


def _beats(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    heartbeat_ms: float,
    behind_ns: int,
    gate: CreditGate | None,
) -> tuple[Heartbeats | None, CreditGate, Heartbeats]:
    """The loop's heartbeats (None: off), its credit gate (a gate that never holds when none is
    given) and the heartbeats it sends while it waits for credit, heartbeats on or off (the same
    object when they are on, so its count is every heartbeat sent)."""
    hb = Heartbeats(sock, packer, heartbeat_ms, behind_ns, 0) if heartbeat_ms else None
    gate = gate or CreditGate(sock, packer.sender_id, None)
    return hb, gate, hb or Heartbeats(sock, packer, POLL_MS, behind_ns, 0)
