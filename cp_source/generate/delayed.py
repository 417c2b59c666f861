"""The emission loop with an injected network delay (``delay``, see ``cp_source.generate.delay``).

Bucket k is generated at its deadline and held until its drawn send time. Held buckets wait in a
min-heap by send time; the loop sends every bucket whose time has come and sleeps toward the earlier
of the next deadline and the next send. Delayed buckets overtake each other: seq is assigned at send
(gapless in send order), so event times are non-decreasing in generation (tuple-id) order but not in
seq order. Lateness (``generator_bound``) is measured against each deadline and each send time, and
the rate against the generation span, so the delay itself is not mistaken for a slow generator.
While anything is held, a heartbeat's bound is the smallest event time still held (an older one than
any to be generated), so it stays a lower bound on every tuple not yet sent. The factory's credit
(``cp_source.generate.credit``) is checked at each send; a wait for it moves the schedule and every
held bucket's send time on by the time waited, never a bucket's intended stamp (its schedule time on
the sender's TSC, ``pacing.Intended``), so a held bucket's wait shows in ``intended -> gen``; the
injected delay itself is after ``gen`` (it stands for the network). Without a delay the
sender runs ``cp_source.generate.pacing.emit``, which does no heap work at all.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from dataclasses import dataclass, field
from functools import partial as bind
from typing import Any

import zmq

import native_tsc
from cp_source.generate.credit import POLL_MS, CreditGate
from cp_source.generate.delay import MAX_HELD_BUCKETS, DelaySampler
from cp_source.generate.events import EventSettings, event_clock
from cp_source.generate.hot_keys import Payloads
from cp_source.generate.pacing import (
    ABORT_FACTOR,
    SLEEP_MIN_NS,
    SPIN_NS,
    Emission,
    Heartbeats,
    Intended,
    add_drop,
)
from cp_source.generate.payloads import bucket_shape
from cp_source.wire import bucket as bk


class Held:
    """Buckets generated and held for their delayed send.

    The heap holds plain ints ``send_at * n + k`` (k < n, the bucket's index), ordered by send time
    and cheaper to compare than tuples; ``items`` maps k to (first id, count, gen TSC, event ms,
    intended TSC).
    Event times never decrease in generation order, so the smallest held one is the lowest k's.
    """

    def __init__(self, n_buckets: int) -> None:
        self.n = max(1, n_buckets)
        self.heap: list[int] = []
        self.items: dict[int, tuple[int, int, int, int, int]] = {}
        self.low = 0  # no bucket below it is held

    def push(self, send_at: int, k: int, item: tuple[int, int, int, int, int]) -> None:
        heapq.heappush(self.heap, send_at * self.n + k)
        self.items[k] = item

    def shift(self, ns: int) -> None:
        """Move every held bucket's send time ``ns`` later (the heap's order stays)."""
        add = ns * self.n
        self.heap[:] = [x + add for x in self.heap]

    def next_send(self) -> int:
        return self.heap[0] // self.n

    def pop(self) -> tuple[int, int, tuple[int, int, int, int, int]]:
        """(send time, k, item) of the bucket due first."""
        send_at, k = divmod(heapq.heappop(self.heap), self.n)
        return send_at, k, self.items.pop(k)

    def min_event(self) -> int | None:
        """The smallest event time held, None when nothing is (amortized O(1))."""
        if not self.items:
            return None
        while self.low not in self.items:
            self.low += 1
        return self.items[self.low][3]


_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)  # computed once: an enum "|" per send costs ~0.3 us
_NOBLOCK = int(zmq.NOBLOCK)


@dataclass
class DelayedEmitter:
    """The emission loop with an injected delay (see the module docstring); ``pacing.emit``'s counterpart."""

    sock: zmq.Socket[Any]
    packer: bk.HeaderPacker
    payloads: Payloads
    bucket: int
    rate: float
    tuples: int
    first: int
    ev: EventSettings
    sender_index: int
    emitted: int = 0
    dropped: int = 0
    seq: int = 0
    max_lag: int = 0
    prev: int = -(1 << 62)
    pending: tuple[int, int] | None = None  # (k, event ms) of the next bucket on the schedule clock
    first_event: int | None = None
    delay_sum: float = 0.0
    delay_max: float = 0.0
    ranges: list[list[int]] = field(default_factory=list)
    gate: CreditGate | None = None  # the factory's credit (None: never held back)
    plan: Intended | None = None  # the schedule on the sender's TSC, set when the loop starts

    def __post_init__(self) -> None:
        self.n_buckets, self.last_rows, self.partial = bucket_shape(self.payloads, self.bucket, self.tuples)
        self.held = Held(self.n_buckets)
        self.clock = event_clock(self.ev, self.sender_index)
        self.rnd = random.Random(self.packer.sender_id).random
        assert self.ev.delay is not None
        seed = self.ev.delay_seed if self.ev.delay_seed is not None else self.packer.sender_id
        self.seed, self.draw = seed, DelaySampler(self.ev.delay, seed)
        lag_ns, jit_ns = self.clock[4], self.clock[5]
        hb_ms = self.ev.heartbeat_ms
        self.hb = Heartbeats(self.sock, self.packer, hb_ms, lag_ns, jit_ns) if hb_ms else None
        self.beats = self.hb or Heartbeats(
            self.sock, self.packer, POLL_MS, lag_ns, jit_ns
        )  # also while it waits

    def _sched_event(self, k: int) -> int:
        """Bucket k's event time on the schedule clock, drawn once (its jitter) however often asked."""
        if self.pending is None or self.pending[0] != k:
            _, start, lag_f, jit_f, _, _ = self.clock
            base = start + math.floor(k * self.bucket / self.rate * 1000)
            e = math.floor(base - lag_f - (self.rnd() * jit_f if jit_f else 0.0))
            self.pending = (k, e if e > self.prev else self.prev)
        return self.pending[1]

    def _wait(self, until: int, k: int) -> None:
        """Sleep (heartbeats in between) and spin until ``until``; k: the next bucket to generate."""
        clock = time.perf_counter_ns
        now = clock()
        if now >= until:
            return
        if self.hb is not None and until - now > self.hb.reach:
            exact = self._sched_event(k) if self.clock[0] and k < self.n_buckets else None
            self.prev = self.hb.wait(until, self.seq, exact, self.prev, self.held.min_event())
            now = clock()
        if until - now > SLEEP_MIN_NS:
            time.sleep((until - now - SPIN_NS) / 1e9)
        while clock() < until:
            pass

    def _generate(self, k: int, deadline: int, next_id: int) -> int:
        """Stamp bucket k and hold it until its send time; the id after its last."""
        tsc = native_tsc.now()  # before the clock: the send is at least the delay after this stamp
        now = time.perf_counter_ns()
        if now - deadline > self.max_lag:
            self.max_lag = now - deadline
        if self.clock[0]:
            e = self._sched_event(k)
        else:
            lag_ns, jit_ns = self.clock[4], self.clock[5]
            off = lag_ns + int(self.rnd() * jit_ns) if jit_ns else lag_ns
            e = (time.time_ns() - off) // 1_000_000
            e = e if e > self.prev else self.prev
        self.prev = e
        if not k:
            self.first_event = e
        count = self.bucket if k < self.n_buckets - 1 or not self.partial else self.last_rows
        d = self.draw()
        self.delay_sum += d
        if d > self.delay_max:
            self.delay_max = d
        assert self.plan is not None
        self.held.push(now + math.ceil(d * 1e6), k, (next_id, count, tsc, e, self.plan.at(k)))
        return next_id + count

    def _send(self) -> None:
        """Send the held bucket due first; seq is assigned here, so it stays gapless in send order."""
        send_at, k, (first_id, count, tsc, e, intended) = self.held.pop()
        late = time.perf_counter_ns() - send_at
        if late > self.max_lag:
            self.max_lag = late
        payload = self.payloads.payload(k) if count == self.bucket else self.partial
        hdr = self.packer.pack(
            bk.KIND_DATA, self.seq, first_id, count, len(payload), tsc, e * 1_000_000, intended
        )
        try:
            self.sock.send(hdr, _MORE)
        except zmq.Again:
            add_drop(self.ranges, first_id, count)
            self.dropped += count
        else:
            self.sock.send(payload, _NOBLOCK, copy=False)  # never fails once the first part is queued
            self.emitted += count
            self.seq += 1

    def _await_credit(self, k: int) -> int:
        """Wait for the factory's credit when the next send is at it; the ns waited, by which the
        schedule and the held buckets' send times move on."""
        if self.gate is None or not self.gate.blocks(k, self.seq):
            return 0
        held = self.held.min_event()
        waited, self.prev = self.gate.wait(
            self.seq, bind(self.beats.beat, self.seq, None, held=held), self.prev
        )
        self.held.shift(waited)
        return waited

    def run(self, barrier: Any) -> Emission:
        period, n, held = self.bucket / self.rate * 1e9, self.n_buckets, self.held
        heap, next_id, k, aborted = held.heap, self.first, 0, False
        native_tsc.frequency_hz()  # measured once per process (50 ms): before the barrier, not in t0
        if barrier is not None:
            barrier.wait()
        self.plan = Intended.start(self.bucket, self.rate, 1_000_000)
        t0 = time.perf_counter_ns() + 1_000_000
        give_up = t0 + int((self.tuples / self.rate * ABORT_FACTOR + 1.0) * 1e9)
        gen_end = t0
        while heap or (k < n and not aborted):
            due = t0 + int(k * period) if k < n and not aborted else None
            if heap and (due is None or held.next_send() <= due or len(heap) >= MAX_HELD_BUCKETS):
                self._wait(held.next_send(), k)
                waited = self._await_credit(k)
                t0, give_up = t0 + waited, give_up + waited
                self._send()
            elif due is not None and time.perf_counter_ns() > give_up:
                aborted = True  # hopelessly behind: stop generating, still send what is held
            elif due is not None:
                self._wait(due, k)
                next_id = self._generate(k, due, next_id)
                gen_end, k = time.perf_counter_ns(), k + 1
        return self._emission(next_id, aborted, t0, gen_end, k)

    def _emission(self, next_id: int, aborted: bool, t0: int, gen_end: int, k: int) -> Emission:
        # the rate is the generation span's: the delay only shifts sends
        ranges = bk.merge_ranges(self.ranges)
        end_wall = time.time_ns() / 1e9
        em = Emission(
            next_id,
            self.emitted,
            self.dropped,
            ranges,
            self.seq,
            self.max_lag,
            aborted,
            t0,
            gen_end,
            end_wall,
        )
        if k:
            em.event_first, em.event_last = self.first_event, self.prev
        em.heartbeats = self.beats.sent
        em.delay_seed = self.seed
        em.delay_ms_mean, em.delay_ms_max = (self.delay_sum / k if k else 0.0), self.delay_max
        em.credit, em.intended = self.gate, self.plan
        return em
