"""The throughput-controlled generator: pre-serialized buckets offered at an exact rate over ZeroMQ.

Before the emission loop starts, each sender builds a small pool of payloads
(``bucket`` rows each, serialized by orjson) that the loop reuses; the tuple
ids and the event time live in the per-bucket header, so reusing payload rows
changes nothing the factory produces except the repeated field values.

The loop gives every bucket a fixed time budget (``bucket / rate`` seconds):
bucket k is due at ``t0 + k * budget``; the sender sleeps until 200 us before
the deadline and busy-waits the rest, then sends without blocking. A send the
receiver cannot take (ZeroMQ EAGAIN) is a counted drop: the bucket's tuple
ids are consumed all the same, so drops are exact id ranges, and its bucket
sequence number is not (sequence numbers count buckets actually sent, so a
gap in them is loss in transit). If the loop falls behind its own schedule it
catches up by sending back to back; a run whose achieved rate ends more than
1% below the target, or that ran more than 10% of its duration late at any
point, is flagged ``generator_bound``, and a sender still emitting after
twice its duration plus a second stops early (``aborted``): the generator, not the system under
test, limited the rate, so the run says nothing about the system.

Event times (``EventSettings``). A bucket's event time is whole milliseconds,
carried in its header's ``wall_ns`` as ``ms * 1_000_000``. Its base is the
wall clock at send, or, with ``start_ms``, the schedule itself: bucket k of
a sender is at ``start_ms + floor(k * bucket / rate * 1000)`` (``rate`` per
sender), so the same arguments give the same tuples in every run. Sender i
of a run lags ``i * lag_ms`` behind, and each bucket moves back a further
random ``[0, jitter_ms)`` drawn from ``random.Random(sender_id)``. Every
bucket's event time is at least its predecessor's (a ``max``), so each
sender's event times never decrease, even when the wall clock steps back.

Heartbeats. While the loop sleeps toward a deadline more than ``heartbeat_ms``
away it sends a heartbeat every ``heartbeat_ms``: seq = the data buckets sent
so far (the next bucket's seq) and ``wall_ns`` = a lower bound on the event
time of every tuple the sender still has to send (the next bucket's own event
time on a schedule clock). A heartbeat's bound also lifts the floor of the
``max`` above, so the promise holds whatever the wall clock does. A heartbeat
the queue cannot take is skipped: the next one says the same or more.

Injected network delay (``delay``, see ``DelaySpec``). Bucket k is generated
at its deadline: it takes its ``gen`` TSC stamp, its event time and its tuple
ids then, and is held until ``generated + d_k``, d_k drawn per bucket from
the distribution by ``random.Random(delay_seed if given else sender_id)``
(``draw_delays_ms`` gives the same numbers). Held buckets wait in a min-heap
by send time; the loop sends every bucket whose time has come and sleeps
toward the earlier of the next deadline and the next send. Delayed buckets
overtake each other: seq is assigned at send (gapless in send order), so
event times are non-decreasing in generation (tuple-id) order but not in seq
order. Lateness (``generator_bound``) is measured against each deadline and
each send time, and the rate against the generation span, so the delay itself
is not mistaken for a slow generator. While anything is held, a heartbeat's
bound is the smallest event time still held (an older one than any to be
generated), so it stays a lower bound on every tuple not yet sent. Without
a delay the loop does no heap work at all.

The factory's frame cap. The answer to a sender's hello names the largest
payload the factory accepts; a sender whose pool holds a larger one raises
``BucketTooLarge`` before its first bucket and closes its stream with nothing
sent. The answer to its end of stream names the tuples the factory received
(``factory_accepted``), and a monitor counts the connections that dropped
(``disconnects``): a sender is ``acknowledged`` only when every tuple it
emitted arrived (see ``sender_link``).
"""

from __future__ import annotations

import bisect
import heapq
import math
import multiprocessing as mp
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import zmq

import native_tsc
from cp_source.factory.startup_trace import mark
from cp_source.generate.hot_keys import KeySkew, Payloads, parse_key_skew, plan_skew, skewed_payloads
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import (
    DEFAULT_READY_TIMEOUT_S,
    AckInfo,
    DisconnectWatch,
    FactoryUnavailable,
    SenderIdInUse,
    close_stream_info,
    open_link_info,
)
from cp_source.wire.workloads import file_lines, ysb_rows

SEND_HWM = 8  # at least this many buckets may wait in a sender's queue ...
SEND_QUEUE_S = 0.05  # ... or as many as it offers in 50 ms, so scheduling jitter is not a drop
SEND_QUEUE_MAX_BYTES = 64 << 20
# The end of stream waits behind the buckets queued before it; a query at capacity with a full spool
# may take this long to make room for them.
EOS_ACK_TIMEOUT_S = 60.0
# A sender that stops before its first bucket (its buckets are too large for the factory, or another
# sender of the run failed) still closes its stream, with nothing sent; a live factory answers at once.
EMPTY_EOS_TIMEOUT_S = 10.0
RATE_TOLERANCE = 0.01
LAG_TOLERANCE = 0.10  # of the run's duration
SPIN_NS = 200_000  # busy-wait the last 200 us before a deadline; sleep before that (sleep overshoots ~60 us)
SLEEP_MIN_NS = 300_000
FRESH_BASE_ATTEMPTS = 5  # random sender-id bases tried when the factory has seen the drawn one
ABORT_FACTOR = 2.0  # a sender still emitting after 2x its duration (+1 s) stops: it cannot offer the rate
MAX_EVENT_OFFSET_MS = 86_400_000.0  # lag per sender and jitter: at most a day
MAX_EVENT_START_MS = 4_000_000_000_000  # ~2096: event ns stay far inside a signed 64-bit header field
MAX_HEARTBEAT_MS = 60_000.0
MIN_HEARTBEAT_MS = 1.0  # 0 disables; below 1 ms heartbeats would crowd out the data
MAX_DELAY_MS = 60_000.0  # no injected delay exceeds a minute
# Buckets one sender may hold for their delayed send (about rate / bucket * the largest delay); a run
# that could hold more is refused up front, and the loop never holds more (it sends before generating).
MAX_HELD_BUCKETS = 100_000
ZIPF_RANKS = 1000  # zipf:S,MAX: rank k of 1..1000 drawn with weight k**-S, delay k * MAX / 1000 ms
NORMAL_MAX_SDS = 6.0  # normal:MEAN,SD is truncated to [0, MEAN + 6 SD] by redrawing
EXP_MAX_MEANS = 20.0  # exp:MEAN is truncated to [0, 20 MEAN] by redrawing
MAX_DELAY_SEED = (1 << 63) - 1
DELAY_FORMS = "normal:MEAN_MS,SD_MS, exp:MEAN_MS, uniform:LO_MS,HI_MS or zipf:S,MAX_MS"


@dataclass(frozen=True, slots=True)
class DelaySpec:
    """An injected network delay distribution (ms), parsed from ``text`` by :func:`parse_delay`.

    * ``normal:MEAN,SD``: N(MEAN, SD^2) truncated to [0, MEAN + 6 SD] by redrawing out-of-range draws;
    * ``exp:MEAN``: exponential with mean MEAN truncated to [0, 20 MEAN] by redrawing;
    * ``uniform:LO,HI``: uniform on [LO, HI);
    * ``zipf:S,MAX``: rank k in 1..1000 with probability proportional to k**-S, delay k * MAX / 1000.

    ``max_ms`` is the largest delay the distribution can give (at most ``MAX_DELAY_MS``).
    """

    text: str
    kind: str
    a: float
    b: float
    max_ms: float


def _delay_numbers(text: str, body: str, n: int) -> list[float]:
    parts = body.split(",")
    if len(parts) != n:
        raise ValueError(f"delay {text!r}: expected {n} number(s) after the colon, got {len(parts)}")
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"delay {text!r}: not a number in {body!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in vals):
        raise ValueError(f"delay {text!r}: every number must be finite and >= 0")
    return vals


def parse_delay(text: str) -> DelaySpec:
    """The distribution named by ``text`` (see ``DelaySpec``); ValueError naming the problem otherwise."""
    kind, colon, body = text.strip().partition(":")
    if not colon or kind not in ("normal", "exp", "uniform", "zipf"):
        raise ValueError(f"delay {text!r}: expected {DELAY_FORMS}")
    if kind == "exp":
        (mean,) = _delay_numbers(text, body, 1)
        a, b, top = mean, 0.0, EXP_MAX_MEANS * mean
    else:
        a, b = _delay_numbers(text, body, 2)
        if kind == "normal":
            top = a + NORMAL_MAX_SDS * b
        elif kind == "uniform":
            if a > b:
                raise ValueError(f"delay {text!r}: LO_MS {a:g} is above HI_MS {b:g}")
            top = b
        else:
            if a > 10:
                raise ValueError(f"delay {text!r}: the Zipf exponent S must be in 0..10, got {a:g}")
            top = b
    if top > MAX_DELAY_MS:
        raise ValueError(
            f"delay {text!r}: its largest delay ({top:g} ms) is above {MAX_DELAY_MS:.0f} ms"
            + (" (normal reaches MEAN + 6 SD)" if kind == "normal" else "")
            + (" (exp reaches 20 x MEAN)" if kind == "exp" else "")
        )
    return DelaySpec(text.strip(), kind, a, b, top)


class DelaySampler:
    """Draws a spec's delays (ms) one per call from ``random.Random(seed)``: the emission loop's draws."""

    def __init__(self, spec: DelaySpec, seed: int) -> None:
        self.spec = spec
        self.rnd = random.Random(seed)
        if spec.kind == "zipf":
            w = [k**-spec.a for k in range(1, ZIPF_RANKS + 1)]
            total = math.fsum(w)
            acc, self.cdf = 0.0, []
            for x in w:
                acc += x
                self.cdf.append(acc / total)

    def __call__(self) -> float:
        s, rnd = self.spec, self.rnd
        if s.kind == "uniform":
            return s.a + (s.b - s.a) * rnd.random()
        if s.kind == "zipf":
            rank = min(bisect.bisect_right(self.cdf, rnd.random()), ZIPF_RANKS - 1) + 1
            return rank * s.b / ZIPF_RANKS
        while True:  # truncated by redrawing: MEAN >= 0, so at least half the draws are in range
            d = (
                rnd.normalvariate(s.a, s.b)
                if s.kind == "normal"
                else (rnd.expovariate(1 / s.a) if s.a else 0.0)
            )
            if 0.0 <= d <= s.max_ms:
                return d


def draw_delays_ms(spec: str | DelaySpec, seed: int, n: int) -> np.ndarray:
    """The delays (ms, float64) of the first ``n`` buckets of a sender whose delay seed is ``seed``
    (``delay_seed`` when given, else its sender id): exactly what its emission loop drew."""
    draw = DelaySampler(parse_delay(spec) if isinstance(spec, str) else spec, seed)
    return np.array([draw() for _ in range(n)], dtype=np.float64)


def check_delay_seed(seed: int | None) -> int | None:
    """``seed``, or ValueError when it is not an integer in 0..2**63-1."""
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_DELAY_SEED
    ):
        raise ValueError(f"delay_seed must be an integer in 0..{MAX_DELAY_SEED}, got {seed!r}")
    return seed


@dataclass(frozen=True, slots=True)
class EventSettings:
    """How senders stamp event times and whether they send heartbeats (see the module docstring)."""

    lag_ms: float = 0.0
    jitter_ms: float = 0.0
    start_ms: int | None = None
    heartbeat_ms: float = 100.0
    delay: DelaySpec | None = None  # injected network delay (see the module docstring)
    delay_seed: int | None = None  # None: each sender's id
    key_skew: KeySkew | None = None  # skewed YSB keys and the moving hot key (cp_source.generate.hot_keys)

    def check(self) -> EventSettings:
        """Self, or ValueError naming the bad setting."""
        check_delay_seed(self.delay_seed)
        for name, v, top in (
            ("event_lag_ms", self.lag_ms, MAX_EVENT_OFFSET_MS),
            ("event_jitter_ms", self.jitter_ms, MAX_EVENT_OFFSET_MS),
            ("heartbeat_ms", self.heartbeat_ms, MAX_HEARTBEAT_MS),
        ):
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= top:
                raise ValueError(f"{name} must be a number of milliseconds in 0..{top:.0f}, got {v!r}")
        if 0 < self.heartbeat_ms < MIN_HEARTBEAT_MS:
            raise ValueError(
                f"heartbeat_ms must be 0 (off) or at least {MIN_HEARTBEAT_MS:g}, got {self.heartbeat_ms}"
            )
        start = self.start_ms
        if start is not None and (
            isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= MAX_EVENT_START_MS
        ):
            raise ValueError(f"event_start_ms must be an integer in 0..{MAX_EVENT_START_MS}, got {start!r}")
        return self


def _jitters(sender_id: int, n_buckets: int, jitter_ms: float) -> list[float]:
    """The jitter (ms) of each bucket of a sender, in bucket order: what the emission loop draws."""
    if not jitter_ms:
        return [0.0] * n_buckets
    rnd = random.Random(sender_id).random
    return [rnd() * jitter_ms for _ in range(n_buckets)]


def schedule_event_ms(
    event_start_ms: int,
    rate_per_sender: float,
    bucket: int,
    n_buckets: int,
    sender_index: int,
    sender_id: int,
    lag_ms: float = 0.0,
    jitter_ms: float = 0.0,
) -> np.ndarray:
    """The event time (ms, int64) of each bucket of one sender on the schedule clock (``start_ms`` given).

    Bucket k: ``max(previous, floor(start + floor(k * bucket / rate * 1000) - index * lag - jitter_k))``,
    the same float operations in the same order as the emission loop, so the values are equal.
    """
    k = np.arange(n_buckets, dtype=np.int64)
    base = event_start_ms + np.floor(k * bucket / rate_per_sender * 1000).astype(np.int64)
    jit = np.array(_jitters(sender_id, n_buckets, jitter_ms), dtype=np.float64)
    ev = np.floor(base.astype(np.float64) - sender_index * lag_ms - jit).astype(np.int64)
    return np.maximum.accumulate(ev) if n_buckets else ev


def check_hold(delay: DelaySpec | None, rate: float, senders: int, bucket: int) -> None:
    """ValueError when a sender could hold more than ``MAX_HELD_BUCKETS`` buckets for their delayed
    send: about its buckets per second times the distribution's largest delay."""
    if delay is None:
        return
    held = math.ceil(delay.max_ms / 1000 * rate / senders / bucket) + 1
    if held > MAX_HELD_BUCKETS:
        raise ValueError(
            f"delay {delay.text!r}: at {rate / senders:g} tuples/s per sender in buckets of {bucket} "
            f"a sender may hold {held} buckets, above {MAX_HELD_BUCKETS}: bigger buckets or shorter delays"
        )


def key_skew_settings(
    key_skew: str | None, skew_keys: str, hot_key_rotate_s: float | None, workload: str
) -> KeySkew | None:
    """The run's key distribution (None: the unskewed pool), or ValueError naming the bad setting."""
    if key_skew is None:
        if hot_key_rotate_s is not None:
            raise ValueError("hot_key_rotate_s needs key_skew (a zipf:S whose hottest key moves)")
        if skew_keys != "campaigns":
            raise ValueError("skew_keys needs key_skew")
        return None
    if workload != "ysb":
        raise ValueError(f"key skew needs the ysb workload (its campaigns and ads), not {workload!r}")
    return parse_key_skew(key_skew, skew_keys, hot_key_rotate_s)


def fresh_sender_base(senders: int) -> int:
    """A random base for sender ids, so runs feeding one factory do not reuse ids."""
    if not 1 <= senders <= 256:
        raise ValueError(f"senders must be 1..256, got {senders}")
    return random.SystemRandom().randrange(1, (bk.MAX_SENDER + 1) // 256) * 256


def default_pool(bucket: int) -> int:
    """Payloads in a sender's pool: 2..16, about 64,000 rows."""
    return max(2, min(16, 64_000 // bucket))


def build_payloads(workload: str, bucket: int, seed: int = 0, pool: int | None = None) -> list[bytes]:
    """A pool of full-bucket NDJSON payloads for ``workload`` (``ysb`` or ``file:PATH``)."""
    if bucket < 1 or bucket > bk.DEFAULT_MAX_TUPLES:
        raise ValueError(f"bucket must be 1..{bk.DEFAULT_MAX_TUPLES} tuples, got {bucket}")
    n_pool = pool or default_pool(bucket)
    if workload == "ysb":
        lines = [orjson.dumps(r) for r in ysb_rows(bucket * n_pool, seed)]
    elif workload.startswith("file:"):
        src = file_lines(workload[5:])
        lines = [src[i % len(src)] for i in range(bucket * n_pool)]
    else:
        raise ValueError(f"unknown workload {workload!r}: expected ysb or file:PATH")
    return [b"\n".join(lines[k * bucket : (k + 1) * bucket]) + b"\n" for k in range(n_pool)]


def sender_payloads(
    workload: str, bucket: int, rate: float, tuples: int, seed: int, skew: KeySkew | None
) -> Payloads:
    """A sender's payloads: one pool, or with key skew one pool per hot-key configuration."""
    if skew is None:
        return Payloads([build_payloads(workload, bucket, seed=seed)], [])
    if workload != "ysb":
        raise ValueError(f"key skew needs the ysb workload (its campaigns and ads), not {workload!r}")
    return skewed_payloads(plan_skew(skew, rate, bucket, tuples, default_pool(bucket)), seed)


def _partial(payload: bytes, rows: int) -> bytes:
    """The first ``rows`` lines of a payload."""
    pos = 0
    for _ in range(rows):
        pos = payload.index(b"\n", pos) + 1
    return payload[:pos]


def _shape(payloads: Payloads, bucket: int, tuples: int) -> tuple[int, int, bytes]:
    """Buckets for ``tuples``, the rows of the last one, and its payload when it is partial (else b"")."""
    n_buckets = math.ceil(tuples / bucket)
    last_rows = tuples - (n_buckets - 1) * bucket if n_buckets else 0
    partial = _partial(payloads.payload(n_buckets - 1), last_rows) if 0 < last_rows < bucket else b""
    return n_buckets, last_rows, partial


class BucketTooLarge(ValueError):
    """A bucket's payload is larger than the factory accepts (its frame cap): nothing was sent."""


def check_fits(payloads: Payloads, bucket: int, workload: str, cap: int | None) -> None:
    """BucketTooLarge, naming the size and the cap, when a payload is over the factory's frame cap.

    ``cap`` is what the factory's answer to the hello said (None: an older factory said nothing).
    A run's last bucket may be partial: a prefix of a full one, never larger.
    """
    if cap is None:
        return
    biggest = max(len(p) for pool in payloads.pools for p in pool)
    if biggest <= cap:
        return
    fit = bucket * cap // biggest
    hint = f"use --bucket {fit} or smaller" if fit else "one tuple alone is over it"
    raise BucketTooLarge(
        f"a bucket of {bucket} tuples of {workload} is {biggest:,} bytes, over the factory's frame cap "
        f"of {cap:,} bytes (its --max-frame-bytes): nothing was sent; {hint}, or start the factory "
        "with a larger --max-frame-bytes"
    )


def _open_link(
    endpoint: str,
    packer: bk.HeaderPacker,
    rate: float,
    bucket: int,
    bucket_bytes: int,
    hwm: int | None,
    ready_timeout: float,
    curve_keys: str | None = None,
) -> tuple[zmq.Context[Any], zmq.Socket[Any], AckInfo]:
    """A context and a socket whose hello a factory acknowledged, its queue sized for ``rate``; and
    what the acknowledgement said."""
    if hwm is None:
        by_time = math.ceil(SEND_QUEUE_S * rate / bucket)
        hwm = max(SEND_HWM, min(by_time, SEND_QUEUE_MAX_BYTES // max(1, bucket_bytes)))
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        return ctx, *open_link_info(ctx, endpoint, packer, hwm, ready_timeout, curve_keys)
    except BaseException:
        ctx.term()
        raise


def _add_drop(ranges: list[list[int]], first: int, count: int) -> None:
    """Record ids first .. first+count-1 as dropped, extending the last range when they follow it."""
    if ranges and ranges[-1][0] + ranges[-1][1] == first:
        ranges[-1][1] += count
    else:
        ranges.append([first, count])


@dataclass
class _Emission:
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


class _Heartbeats:
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
            if held is not None:
                bound = held  # at most floor: generated earlier than any bucket still to come
            else:
                bound = exact if exact is not None else (time.time_ns() - self.behind_ns) // 1_000_000
                bound = max(bound, floor)
            hdr = self.packer.pack(bk.KIND_HEARTBEAT, seq, 0, 0, 0, native_tsc.now(), bound * 1_000_000)
            try:
                self.sock.send(hdr, zmq.NOBLOCK | zmq.SNDMORE)
            except zmq.Again:
                continue  # the queue is full: skipped, the next heartbeat says as much or more
            self.sock.send(b"", zmq.NOBLOCK)
            self.sent += 1
            floor = max(floor, bound)
        return floor


def _event_clock(ev: EventSettings, sender_index: int) -> tuple[bool, int, float, float, int, int]:
    """The loop's event clock: on the schedule (``start_ms`` given, float ms as in schedule_event_ms),
    its start, this sender's lag and the jitter in ms; and for the wall clock, lag and jitter in ns."""
    lag_ms = sender_index * ev.lag_ms
    lag_ns, jit_ns = round(lag_ms * 1e6), round(ev.jitter_ms * 1e6)
    return ev.start_ms is not None, ev.start_ms or 0, lag_ms, ev.jitter_ms, lag_ns, jit_ns


def _emit(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    payloads: Payloads,
    bucket: int,
    rate: float,
    tuples: int,
    first: int,
    barrier: Any,
    ev: EventSettings = EventSettings(),
    sender_index: int = 0,
) -> _Emission:
    """The timed loop: bucket k leaves at t0 + k * budget (see the module docstring)."""
    n_buckets, last_rows, partial = _shape(payloads, bucket, tuples)
    period = bucket / rate * 1e9
    pool = payloads.pools[0]
    n_pool = len(pool)  # every pool of a sender has the same length
    switches = iter(payloads.switches)  # hot-key epochs: the pool changes at these buckets
    switch_k, switch_to = next(switches, (-1, 0))
    emitted = dropped = seq = max_lag = 0
    next_id, aborted = first, False
    ranges: list[list[int]] = []
    now_tsc, clock, wall, send = native_tsc.now, time.perf_counter_ns, time.time_ns, sock.send
    flags_more = zmq.NOBLOCK | zmq.SNDMORE
    sched, start, lag_f, jit_f, lag_ns, jit_ns = _event_clock(ev, sender_index)
    rnd = random.Random(packer.sender_id).random
    hb = _Heartbeats(sock, packer, ev.heartbeat_ms, lag_ns, jit_ns) if ev.heartbeat_ms else None
    prev = e = -(1 << 62)
    first_ev: int | None = None
    if barrier is not None:
        barrier.wait()
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
        if now < deadline:
            if hb is not None and deadline - now > hb.reach:
                prev = hb.wait(deadline, seq, e if sched else None, prev)
                now = clock()
            if deadline - now > SLEEP_MIN_NS:
                time.sleep((deadline - now - SPIN_NS) / 1e9)
            while clock() < deadline:
                pass
        elif now - deadline > max_lag:
            max_lag = now - deadline
        if not sched:
            off = lag_ns + int(rnd() * jit_ns) if jit_ns else lag_ns
            e = (wall() - off) // 1_000_000
            e = e if e > prev else prev
        prev = e
        if not k:
            first_ev = e
        if k == switch_k:
            pool = payloads.pools[switch_to]
            switch_k, switch_to = next(switches, (-1, 0))
        count = bucket if k < n_buckets - 1 or not partial else last_rows
        payload = pool[k % n_pool] if count == bucket else partial
        hdr = packer.pack(bk.KIND_DATA, seq, next_id, count, len(payload), now_tsc(), e * 1_000_000)
        try:
            send(hdr, flags_more)
        except zmq.Again:
            _add_drop(ranges, next_id, count)
            dropped += count
        else:
            send(payload, zmq.NOBLOCK, copy=False)  # never fails once the first part is queued
            emitted += count
            seq += 1
        next_id += count
    em = _Emission(next_id, emitted, dropped, ranges, seq, max_lag, aborted, t0, clock(), wall() / 1e9)
    em.event_first, em.event_last = first_ev, (prev if first_ev is not None else None)
    em.heartbeats = hb.sent if hb is not None else 0
    return em


class _Held:
    """Buckets generated and held for their delayed send.

    The heap holds plain ints ``send_at * n + k`` (k < n, the bucket's index), ordered by send time
    and cheaper to compare than tuples; ``items`` maps k to (first id, count, gen TSC, event ms).
    Event times never decrease in generation order, so the smallest held one is the lowest k's.
    """

    def __init__(self, n_buckets: int) -> None:
        self.n = max(1, n_buckets)
        self.heap: list[int] = []
        self.items: dict[int, tuple[int, int, int, int]] = {}
        self.low = 0  # no bucket below it is held

    def push(self, send_at: int, k: int, item: tuple[int, int, int, int]) -> None:
        heapq.heappush(self.heap, send_at * self.n + k)
        self.items[k] = item

    def next_send(self) -> int:
        return self.heap[0] // self.n

    def pop(self) -> tuple[int, int, tuple[int, int, int, int]]:
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
class _DelayedEmitter:
    """The emission loop with an injected delay (see the module docstring); ``_emit``'s counterpart."""

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

    def __post_init__(self) -> None:
        self.n_buckets, self.last_rows, self.partial = _shape(self.payloads, self.bucket, self.tuples)
        self.held = _Held(self.n_buckets)
        self.clock = _event_clock(self.ev, self.sender_index)
        self.rnd = random.Random(self.packer.sender_id).random
        assert self.ev.delay is not None
        seed = self.ev.delay_seed if self.ev.delay_seed is not None else self.packer.sender_id
        self.seed, self.draw = seed, DelaySampler(self.ev.delay, seed)
        lag_ns, jit_ns = self.clock[4], self.clock[5]
        hb_ms = self.ev.heartbeat_ms
        self.hb = _Heartbeats(self.sock, self.packer, hb_ms, lag_ns, jit_ns) if hb_ms else None

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
        self.held.push(now + math.ceil(d * 1e6), k, (next_id, count, tsc, e))
        return next_id + count

    def _send(self) -> None:
        """Send the held bucket due first; seq is assigned here, so it stays gapless in send order."""
        send_at, k, (first_id, count, tsc, e) = self.held.pop()
        late = time.perf_counter_ns() - send_at
        if late > self.max_lag:
            self.max_lag = late
        payload = self.payloads.payload(k) if count == self.bucket else self.partial
        hdr = self.packer.pack(bk.KIND_DATA, self.seq, first_id, count, len(payload), tsc, e * 1_000_000)
        try:
            self.sock.send(hdr, _MORE)
        except zmq.Again:
            _add_drop(self.ranges, first_id, count)
            self.dropped += count
        else:
            self.sock.send(payload, _NOBLOCK, copy=False)  # never fails once the first part is queued
            self.emitted += count
            self.seq += 1

    def run(self, barrier: Any) -> _Emission:
        period, n, held = self.bucket / self.rate * 1e9, self.n_buckets, self.held
        heap, next_id, k, aborted = held.heap, self.first, 0, False
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter_ns() + 1_000_000
        give_up = t0 + int((self.tuples / self.rate * ABORT_FACTOR + 1.0) * 1e9)
        gen_end = t0
        while heap or (k < n and not aborted):
            due = t0 + int(k * period) if k < n and not aborted else None
            if heap and (due is None or held.next_send() <= due or len(heap) >= MAX_HELD_BUCKETS):
                self._wait(held.next_send(), k)
                self._send()
            elif due is not None and time.perf_counter_ns() > give_up:
                aborted = True  # hopelessly behind: stop generating, still send what is held
            elif due is not None:
                self._wait(due, k)
                next_id = self._generate(k, due, next_id)
                gen_end, k = time.perf_counter_ns(), k + 1
        return self._emission(next_id, aborted, t0, gen_end, k)

    def _emission(self, next_id: int, aborted: bool, t0: int, gen_end: int, k: int) -> _Emission:
        # the rate is the generation span's: the delay only shifts sends
        ranges = bk.merge_ranges(self.ranges)
        end_wall = time.time_ns() / 1e9
        em = _Emission(
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
        em.heartbeats = self.hb.sent if self.hb is not None else 0
        em.delay_seed = self.seed
        em.delay_ms_mean, em.delay_ms_max = (self.delay_sum / k if k else 0.0), self.delay_max
        return em


def _acknowledged(ack: AckInfo | None, emitted: int, disconnects: int) -> bool:
    """The end of stream was acknowledged and every emitted tuple reached the factory: as its answer
    says, or, from a factory that does not say, as far as a connection that never dropped shows."""
    if ack is None:
        return False
    if ack.accepted_tuples is not None:
        return ack.accepted_tuples >= emitted
    return disconnects == 0


def _end_of_stream(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    sender_id: int,
    first: int,
    rate: float,
    tuples: int,
    e: _Emission,
    watch: DisconnectWatch,
) -> dict[str, Any]:
    """Send end-of-stream and wait for the factory's acknowledgement; the sender's counters.

    ``factory_accepted``: the tuples the factory's answer says it received (None: it did not say);
    ``disconnects``: connections that dropped during the run; ``acknowledged``: see _acknowledged.
    """
    ideal_end = e.t0 + int(tuples / rate * 1e9)
    elapsed = (max(e.end, ideal_end) - e.t0) / 1e9
    eos = bk.EndOfStream(sender_id, first, e.next_id, e.seq, e.emitted, e.dropped, e.ranges)
    body = eos.to_json()
    ack = close_stream_info(sock, packer, e.seq, body, EOS_ACK_TIMEOUT_S)
    disconnects = watch.count()
    accepted = ack.accepted_tuples if ack is not None else None
    return {
        "id": sender_id,
        "first_tuple_id": first,
        "next_tuple_id": e.next_id,
        "emitted": e.emitted,
        "dropped": e.dropped,
        "dropped_ranges": e.ranges,
        "buckets_sent": e.seq,
        "elapsed_s": elapsed,
        "achieved_rate": (e.emitted + e.dropped) / elapsed if elapsed else 0.0,
        "target_rate": rate,
        "max_lag_ms": e.max_lag / 1e6,
        "eos_delivered": ack is not None,
        "factory_accepted": accepted,
        "disconnects": disconnects,
        "acknowledged": _acknowledged(ack, e.emitted, disconnects),
        "aborted": e.aborted,
        "end_wall_s": e.end_wall,
        "heartbeats": e.heartbeats,
        "event_ms_first": e.event_first,
        "event_ms_last": e.event_last,
        "delay_seed": e.delay_seed,
        "delay_ms_mean": e.delay_ms_mean,
        "delay_ms_max": e.delay_ms_max,
    }


def run_sender(
    endpoint: str,
    sender_id: int,
    rate: float,
    tuples: int,
    bucket: int,
    workload: str,
    barrier: Any = None,
    hwm: int | None = None,
    seed: int | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    curve_keys: str | None = None,
    sender_index: int = 0,
    event_lag_ms: float = 0.0,
    event_jitter_ms: float = 0.0,
    event_start_ms: int | None = None,
    heartbeat_ms: float = 100.0,
    delay: str | None = None,
    delay_seed: int | None = None,
    key_skew: str | None = None,
    skew_keys: str = "campaigns",
    hot_key_rotate_s: float | None = None,
) -> dict[str, Any]:
    """One sender: offer ``tuples`` tuples at ``rate`` tuples/s; return its counters.

    Raises ``FactoryUnavailable`` when no factory acknowledges its hello within ``ready_timeout``
    (its message says so when the CurveZMQ handshake failed: ``curve_keys``, a keys directory).
    ``sender_index`` (its place in the run, 0-based), the event settings and ``delay``: see the module
    docstring.
    """
    spec = parse_delay(delay) if delay is not None else None
    skew = key_skew_settings(key_skew, skew_keys, hot_key_rotate_s, workload)
    ev_args = (event_lag_ms, event_jitter_ms, event_start_ms, heartbeat_ms)
    events = EventSettings(*ev_args, spec, delay_seed, skew)
    events.check()
    check_hold(spec, rate, 1, bucket)
    return _sender(
        endpoint,
        sender_id,
        rate,
        tuples,
        bucket,
        workload,
        barrier,
        hwm,
        seed,
        ready_timeout,
        curve_keys,
        sender_index,
        events,
    )


def _sender(
    endpoint: str,
    sender_id: int,
    rate: float,
    tuples: int,
    bucket: int,
    workload: str,
    barrier: Any,
    hwm: int | None,
    seed: int | None,
    ready_timeout: float,
    curve_keys: str | None,
    sender_index: int,
    events: EventSettings,
) -> dict[str, Any]:
    mark(f"sender {sender_id}: started")
    seed = sender_id if seed is None else seed
    pays = sender_payloads(workload, bucket, rate, tuples, seed, events.key_skew)
    packer = bk.HeaderPacker(sender_id, native_tsc.domain_id())
    size = len(pays.pools[0][0])
    ctx, sock, hello = _open_link(endpoint, packer, rate, bucket, size, hwm, ready_timeout, curve_keys)
    first = bk.tuple_id(sender_id, 0)
    watch = DisconnectWatch(sock)
    try:
        try:
            check_fits(pays, bucket, workload, hello.max_frame_bytes)
            emission = _run_loop(
                sock, packer, pays, bucket, rate, tuples, first, barrier, events, sender_index
            )
        except (BucketTooLarge, threading.BrokenBarrierError):
            _close_empty(sock, packer, sender_id, first)  # before any bucket: nothing was sent
            raise
        return _end_of_stream(sock, packer, sender_id, first, rate, tuples, emission, watch)
    finally:
        watch.close()
        sock.close(0)  # the end of stream was acknowledged (or counted as not delivered)
        ctx.term()


def _run_loop(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    pays: Payloads,
    bucket: int,
    rate: float,
    tuples: int,
    first: int,
    barrier: Any,
    events: EventSettings,
    sender_index: int,
) -> _Emission:
    """The emission loop: the plain one, or the one that holds buckets back for an injected delay."""
    if events.delay is None:
        return _emit(sock, packer, pays, bucket, rate, tuples, first, barrier, events, sender_index)
    loop = _DelayedEmitter(sock, packer, pays, bucket, rate, tuples, first, events, sender_index)
    return loop.run(barrier)


def _close_empty(sock: zmq.Socket[Any], packer: bk.HeaderPacker, sender_id: int, first: int) -> None:
    """End the stream of a sender that sent nothing, so the factory holds it closed with zero totals."""
    body = bk.EndOfStream(sender_id, first, first, 0, 0, 0, []).to_json()
    close_stream_info(sock, packer, 0, body, EMPTY_EOS_TIMEOUT_S)


def _check_endpoint(endpoint: str) -> None:
    """Fail before starting senders when ZeroMQ cannot parse the endpoint."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    try:
        s.connect(endpoint)
    except zmq.ZMQError as e:
        raise ValueError(
            f"invalid endpoint {endpoint!r}: {e.strerror} (expected e.g. tcp://127.0.0.1:5555)"
        ) from None
    finally:
        s.close(0)
        ctx.term()


# run_sender's leading positional arguments: endpoint, sender_id, rate, tuples, bucket, workload
SenderJob = tuple[str, int, float, int, int, str]


def _sender_proc(
    q: Any,
    barrier: Any,
    args: SenderJob,
    hwm: int | None,
    ready_timeout: float,
    curve_keys: str | None,
    index: int = 0,
    events: EventSettings = EventSettings(),
) -> None:
    try:
        result = _sender(*args, barrier, hwm, None, ready_timeout, curve_keys, index, events)
        q.put(("ok", result))
    except BaseException as e:  # reported to the parent, which raises
        q.put(("error", (type(e).__name__, str(e))))
        if barrier is not None:
            barrier.abort()


def _check_args(rate: float, duration: float, senders: int, bucket: int, workload: str) -> None:
    """Reject a run before any sender starts."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a positive number of tuples/s, got {rate}")
    if not duration > 0 or not math.isfinite(duration):
        raise ValueError(f"duration must be positive seconds, got {duration}")
    if not 1 <= senders <= 256:
        raise ValueError(f"senders must be 1..256, got {senders}")
    if bucket < 1 or bucket > bk.DEFAULT_MAX_TUPLES:
        raise ValueError(f"bucket must be 1..{bk.DEFAULT_MAX_TUPLES} tuples, got {bucket}")
    if not (workload == "ysb" or workload.startswith("file:")):
        raise ValueError(f"unknown workload {workload!r}: expected ysb or file:PATH")


def _run_processes(
    jobs: list[SenderJob],
    hwm: int | None,
    ready_timeout: float,
    curve_keys: str | None = None,
    events: EventSettings = EventSettings(),
) -> list[dict[str, Any]]:
    """Run one sender process per job, started together at a barrier; their counters by sender id.

    Job i is sender index i of the run (its event-time lag)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(len(jobs))
    procs = [
        ctx.Process(target=_sender_proc, args=(q, barrier, job, hwm, ready_timeout, curve_keys, i, events))
        for i, job in enumerate(jobs)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    errors: list[tuple[str, str]] = []
    for _ in procs:
        status, value = q.get()
        (results if status == "ok" else errors).append(value)
    for p in procs:
        p.join()
    # the others stopped at the barrier because of it, before any data bucket
    for kind in (SenderIdInUse, BucketTooLarge, FactoryUnavailable):
        first = next((msg for name, msg in errors if name == kind.__name__), None)
        if first is not None:
            raise kind(first)
    if errors:
        raise OSError("generator sender failed: " + "; ".join(f"{n}: {m}" for n, m in errors))
    results.sort(key=lambda r: r["id"])
    return results


def _summary(
    results: list[dict[str, Any]],
    rate: float,
    duration: float,
    bucket: int,
    workload: str,
    endpoint: str,
    base: int,
    events: EventSettings = EventSettings(),
) -> dict[str, Any]:
    """The run's settings, its senders' counters added up, and whether the generator limited it."""
    emitted = sum(r["emitted"] for r in results)
    dropped = sum(r["dropped"] for r in results)
    elapsed = max(r["elapsed_s"] for r in results)
    achieved = (emitted + dropped) / elapsed if elapsed else 0.0
    max_lag = max(r["max_lag_ms"] for r in results)
    end_wall = max(r["end_wall_s"] for r in results)
    aborted = any(r["aborted"] for r in results)
    bound = aborted or achieved < (1 - RATE_TOLERANCE) * rate or max_lag / 1e3 > LAG_TOLERANCE * duration
    return {
        "emitted": emitted,
        "dropped": dropped,
        "offered": emitted + dropped,
        "target_rate": rate,
        "achieved_rate": achieved,
        "generator_bound": bound,
        "duration": duration,
        "elapsed_s": elapsed,
        "max_lag_ms": max_lag,
        "end_wall_s": end_wall,  # the last sender's last emission, wall clock
        "bucket": bucket,
        "workload": workload,
        "endpoint": endpoint,
        "sender_base": base,
        "aborted": aborted,
        "eos_delivered": all(r["eos_delivered"] for r in results),
        "acknowledged": all(r["acknowledged"] for r in results),
        "disconnects": sum(r["disconnects"] for r in results),
        "heartbeats": sum(r["heartbeats"] for r in results),
        "heartbeat_ms": events.heartbeat_ms,
        "event_lag_ms": events.lag_ms,
        "event_jitter_ms": events.jitter_ms,
        "event_start_ms": events.start_ms,
        "delay": events.delay.text if events.delay is not None else None,
        "delay_seed": events.delay_seed,
        "key_skew": events.key_skew.text if events.key_skew is not None else None,
        "skew_keys": events.key_skew.keys if events.key_skew is not None else None,
        "hot_key_rotate_s": events.key_skew.rotate_ms / 1000
        if events.key_skew and events.key_skew.rotate_ms
        else None,
        "senders": results,
    }


def _run_senders(
    endpoint: str,
    base: int,
    rate: float,
    total: int,
    senders: int,
    bucket: int,
    workload: str,
    hwm: int | None,
    ready_timeout: float,
    curve_keys: str | None,
    events: EventSettings = EventSettings(),
) -> list[dict[str, Any]]:
    """Senders ``base`` .. ``base + senders - 1`` sharing ``total`` tuples at ``rate``; their counters."""
    shares = [total // senders + (i < total % senders) for i in range(senders)]
    per_rate = rate / senders
    jobs: list[SenderJob] = [
        (endpoint, base + i, per_rate, shares[i], bucket, workload) for i in range(senders)
    ]
    if senders == 1:
        return [_sender(*jobs[0], None, hwm, None, ready_timeout, curve_keys, 0, events)]
    return _run_processes(jobs, hwm, ready_timeout, curve_keys, events)


def run_generator(
    endpoint: str,
    rate: float,
    duration: float,
    senders: int = 1,
    bucket: int = 1000,
    workload: str = "ysb",
    sender_base: int | None = None,
    hwm: int | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    curve_keys: str | None = None,
    event_lag_ms: float = 0.0,
    event_jitter_ms: float = 0.0,
    event_start_ms: int | None = None,
    heartbeat_ms: float = 100.0,
    delay: str | None = None,
    delay_seed: int | None = None,
    key_skew: str | None = None,
    skew_keys: str = "campaigns",
    hot_key_rotate_s: float | None = None,
) -> dict[str, Any]:
    """Offer ``rate`` tuples/s for ``duration`` s from ``senders`` processes; return the JSON summary.

    Each sender starts its schedule only after a factory acknowledged its hello
    (``FactoryUnavailable`` after ``ready_timeout`` s; ``BucketTooLarge`` before any bucket
    when a payload is over the frame cap the factory named); ``eos_delivered`` says the
    factory acknowledged every sender's end-of-stream totals, ``acknowledged`` that it received
    every tuple emitted. ``curve_keys``: a keys directory
    (``cloudprofiler keys generate``) when the factory runs with keys. Event times (sender i lags
    ``i * event_lag_ms``, jitter, a schedule clock from ``event_start_ms``) and heartbeats: see the
    module docstring; ``schedule_event_ms`` gives a schedule clock's event times. ``delay`` (a
    ``DelaySpec`` text such as ``normal:50,10``) holds each bucket back a drawn delay before its send,
    seeded by ``delay_seed`` (None: each sender's id); ``draw_delays_ms`` gives the delays drawn.
    ``key_skew`` (``uniform`` or ``zipf:S``, ysb only) draws the ads of ``skew_keys`` (``campaigns``
    or ``ads``) from that distribution, the hottest key moving every ``hot_key_rotate_s`` s of the
    schedule; ``cp_source.generate.hot_keys.expected_ads`` gives each tuple's ad (seed: the sender id).
    """
    _check_args(rate, duration, senders, bucket, workload)
    spec = parse_delay(delay) if delay is not None else None
    skew = key_skew_settings(key_skew, skew_keys, hot_key_rotate_s, workload)
    ev_args = (event_lag_ms, event_jitter_ms, event_start_ms, heartbeat_ms)
    events = EventSettings(*ev_args, spec, delay_seed, skew)
    events.check()
    check_hold(spec, rate, senders, bucket)
    _check_endpoint(endpoint)
    total = round(rate * duration)
    if total >= bk.MAX_TUPLES_PER_SENDER:
        raise ValueError("rate x duration exceeds the tuple ids one sender can number")
    if skew is not None:  # refuse a pool too large before any sender starts
        plan_skew(skew, rate / senders, bucket, -(-total // senders), default_pool(bucket))
    for attempt in range(1, FRESH_BASE_ATTEMPTS + 1):
        base = fresh_sender_base(senders) if sender_base is None else sender_base
        if base < 0 or base + senders - 1 > bk.MAX_SENDER:
            raise ValueError(f"sender ids {base}..{base + senders - 1} outside 0..{bk.MAX_SENDER}")
        try:
            results = _run_senders(
                endpoint, base, rate, total, senders, bucket, workload, hwm, ready_timeout, curve_keys, events
            )
            break
        except SenderIdInUse:
            # a random base the factory has seen: nothing was sent yet, draw another
            if sender_base is not None or attempt == FRESH_BASE_ATTEMPTS:
                raise
    return _summary(results, rate, duration, bucket, workload, endpoint, base, events)
