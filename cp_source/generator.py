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
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import zmq

import native_tsc
from cp_source import bucket as bk
from cp_source.sender_link import (
    DEFAULT_READY_TIMEOUT_S,
    FactoryUnavailable,
    SenderIdInUse,
    close_stream,
    open_link,
)
from cp_source.startup_trace import mark
from cp_source.workloads import file_lines, ysb_rows

SEND_HWM = 8  # at least this many buckets may wait in a sender's queue ...
SEND_QUEUE_S = 0.05  # ... or as many as it offers in 50 ms, so scheduling jitter is not a drop
SEND_QUEUE_MAX_BYTES = 64 << 20
# The end of stream waits behind the buckets queued before it; a query at capacity with a full spool
# may take this long to make room for them.
EOS_ACK_TIMEOUT_S = 60.0
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


@dataclass(frozen=True, slots=True)
class EventSettings:
    """How senders stamp event times and whether they send heartbeats (see the module docstring)."""

    lag_ms: float = 0.0
    jitter_ms: float = 0.0
    start_ms: int | None = None
    heartbeat_ms: float = 100.0

    def check(self) -> EventSettings:
        """Self, or ValueError naming the bad setting."""
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


def fresh_sender_base(senders: int) -> int:
    """A random base for sender ids, so runs feeding one factory do not reuse ids."""
    if not 1 <= senders <= 256:
        raise ValueError(f"senders must be 1..256, got {senders}")
    return random.SystemRandom().randrange(1, (bk.MAX_SENDER + 1) // 256) * 256


def build_payloads(workload: str, bucket: int, seed: int = 0, pool: int | None = None) -> list[bytes]:
    """A pool of full-bucket NDJSON payloads for ``workload`` (``ysb`` or ``file:PATH``)."""
    if bucket < 1 or bucket > bk.DEFAULT_MAX_TUPLES:
        raise ValueError(f"bucket must be 1..{bk.DEFAULT_MAX_TUPLES} tuples, got {bucket}")
    n_pool = pool or max(2, min(16, 64_000 // bucket))
    if workload == "ysb":
        lines = [orjson.dumps(r) for r in ysb_rows(bucket * n_pool, seed)]
    elif workload.startswith("file:"):
        src = file_lines(workload[5:])
        lines = [src[i % len(src)] for i in range(bucket * n_pool)]
    else:
        raise ValueError(f"unknown workload {workload!r}: expected ysb or file:PATH")
    return [b"\n".join(lines[k * bucket : (k + 1) * bucket]) + b"\n" for k in range(n_pool)]


def _partial(payload: bytes, rows: int) -> bytes:
    """The first ``rows`` lines of a payload."""
    pos = 0
    for _ in range(rows):
        pos = payload.index(b"\n", pos) + 1
    return payload[:pos]


def _shape(pool: list[bytes], bucket: int, tuples: int) -> tuple[int, int, bytes]:
    """Buckets for ``tuples``, the rows of the last one, and its payload when it is partial (else b"")."""
    n_buckets = math.ceil(tuples / bucket)
    last_rows = tuples - (n_buckets - 1) * bucket if n_buckets else 0
    partial = _partial(pool[(n_buckets - 1) % len(pool)], last_rows) if 0 < last_rows < bucket else b""
    return n_buckets, last_rows, partial


def _open_link(
    endpoint: str,
    packer: bk.HeaderPacker,
    rate: float,
    bucket: int,
    bucket_bytes: int,
    hwm: int | None,
    ready_timeout: float,
    curve_keys: str | None = None,
) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    """A context and a socket whose hello a factory acknowledged, its queue sized for ``rate``."""
    if hwm is None:
        by_time = math.ceil(SEND_QUEUE_S * rate / bucket)
        hwm = max(SEND_HWM, min(by_time, SEND_QUEUE_MAX_BYTES // max(1, bucket_bytes)))
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        return ctx, open_link(ctx, endpoint, packer, hwm, ready_timeout, curve_keys)
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

    def wait(self, deadline: int, seq: int, exact: int | None, floor: int) -> int:
        """Sleep toward ``deadline`` in heartbeat intervals, a heartbeat after each while one more
        interval fits; return the event-time floor, lifted to the bound the heartbeats promised.

        ``exact``: the next bucket's event time when it is known in advance (schedule clock).
        """
        clock = time.perf_counter_ns
        now = clock()
        while deadline - now > self.reach:
            time.sleep(self.interval / 1e9)
            now = clock()
            if deadline - now <= self.reach:
                break
            bound = exact if exact is not None else (time.time_ns() - self.behind_ns) // 1_000_000
            bound = max(bound, floor)
            hdr = self.packer.pack(bk.KIND_HEARTBEAT, seq, 0, 0, 0, native_tsc.now(), bound * 1_000_000)
            try:
                self.sock.send(hdr, zmq.NOBLOCK | zmq.SNDMORE)
            except zmq.Again:
                continue  # the queue is full: skipped, the next heartbeat says as much or more
            self.sock.send(b"", zmq.NOBLOCK)
            self.sent += 1
            floor = bound
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
    pool: list[bytes],
    bucket: int,
    rate: float,
    tuples: int,
    first: int,
    barrier: Any,
    ev: EventSettings = EventSettings(),
    sender_index: int = 0,
) -> _Emission:
    """The timed loop: bucket k leaves at t0 + k * budget (see the module docstring)."""
    n_buckets, last_rows, partial = _shape(pool, bucket, tuples)
    period = bucket / rate * 1e9
    n_pool = len(pool)
    emitted = dropped = seq = 0
    next_id = first
    ranges: list[list[int]] = []
    max_lag = 0
    now_tsc = native_tsc.now
    clock = time.perf_counter_ns
    wall = time.time_ns
    send = sock.send
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
    aborted = False
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
    end = clock()
    em = _Emission(next_id, emitted, dropped, ranges, seq, max_lag, aborted, t0, end, wall() / 1e9)
    em.event_first, em.event_last = first_ev, (prev if first_ev is not None else None)
    em.heartbeats = hb.sent if hb is not None else 0
    return em


def _end_of_stream(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    sender_id: int,
    first: int,
    rate: float,
    tuples: int,
    e: _Emission,
) -> dict[str, Any]:
    """Send end-of-stream and wait for the factory's acknowledgement; the sender's counters."""
    ideal_end = e.t0 + int(tuples / rate * 1e9)
    elapsed = (max(e.end, ideal_end) - e.t0) / 1e9
    eos = bk.EndOfStream(sender_id, first, e.next_id, e.seq, e.emitted, e.dropped, e.ranges)
    body = eos.to_json()
    eos_ok = close_stream(sock, packer, e.seq, body, EOS_ACK_TIMEOUT_S)
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
        "eos_delivered": eos_ok,
        "aborted": e.aborted,
        "end_wall_s": e.end_wall,
        "heartbeats": e.heartbeats,
        "event_ms_first": e.event_first,
        "event_ms_last": e.event_last,
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
) -> dict[str, Any]:
    """One sender: offer ``tuples`` tuples at ``rate`` tuples/s; return its counters.

    Raises ``FactoryUnavailable`` when no factory acknowledges its hello within ``ready_timeout``
    (its message says so when the CurveZMQ handshake failed: ``curve_keys``, a keys directory).
    ``sender_index`` (its place in the run, 0-based) and the event settings: see the module docstring.
    """
    events = EventSettings(event_lag_ms, event_jitter_ms, event_start_ms, heartbeat_ms).check()
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
    pool = build_payloads(workload, bucket, seed=sender_id if seed is None else seed)
    packer = bk.HeaderPacker(sender_id, native_tsc.domain_id())
    ctx, sock = _open_link(endpoint, packer, rate, bucket, len(pool[0]), hwm, ready_timeout, curve_keys)
    first = bk.tuple_id(sender_id, 0)
    try:
        emission = _emit(sock, packer, pool, bucket, rate, tuples, first, barrier, events, sender_index)
        return _end_of_stream(sock, packer, sender_id, first, rate, tuples, emission)
    finally:
        sock.close(0)  # the end of stream was acknowledged (or counted as not delivered)
        ctx.term()


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
    for kind in (SenderIdInUse, FactoryUnavailable):
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
        "heartbeats": sum(r["heartbeats"] for r in results),
        "heartbeat_ms": events.heartbeat_ms,
        "event_lag_ms": events.lag_ms,
        "event_jitter_ms": events.jitter_ms,
        "event_start_ms": events.start_ms,
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
) -> dict[str, Any]:
    """Offer ``rate`` tuples/s for ``duration`` s from ``senders`` processes; return the JSON summary.

    Each sender starts its schedule only after a factory acknowledged its hello
    (``FactoryUnavailable`` after ``ready_timeout`` s); ``eos_delivered`` says the
    factory acknowledged every sender's end-of-stream totals. ``curve_keys``: a keys directory
    (``cloudprofiler keys generate``) when the factory runs with keys. Event times (sender i lags
    ``i * event_lag_ms``, jitter, a schedule clock from ``event_start_ms``) and heartbeats: see the
    module docstring; ``schedule_event_ms`` gives a schedule clock's event times.
    """
    _check_args(rate, duration, senders, bucket, workload)
    events = EventSettings(event_lag_ms, event_jitter_ms, event_start_ms, heartbeat_ms).check()
    _check_endpoint(endpoint)
    total = round(rate * duration)
    if total >= bk.MAX_TUPLES_PER_SENDER:
        raise ValueError("rate x duration exceeds the tuple ids one sender can number")
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
