"""The throughput-controlled generator: pre-serialized buckets offered at an exact rate over ZeroMQ.

A run (``run_generator``) shares its rate and its tuples among ``senders`` processes started
together at a barrier; each one (``cp_source.generate.sender``) offers pre-serialized payloads
(``cp_source.generate.payloads``) at its exact rate (``cp_source.generate.pacing``), optionally held
back by an injected network delay (``cp_source.generate.delay``, ``cp_source.generate.delayed``),
with event times and heartbeats as ``cp_source.generate.events`` says. Settings and the JSON
summary: ``cp_source.generate.settings``.

A run whose achieved rate ends more than 1% below the target, or that ran more than 10% of its
duration late at any point, or whose sender stopped early (``aborted``), is flagged
``generator_bound``: the generator, not the system under test, limited the rate, so the run says
nothing about the system.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
from typing import Any

import zmq

from cp_common.faces import deprecated_names
from cp_source.generate.events import EventSettings
from cp_source.generate.file_check import BadFileLine, FileLines, read_workload_file
from cp_source.generate.hot_keys import plan_skew
from cp_source.generate.payloads import BucketTooLarge, default_pool
from cp_source.generate.sender import run_checked_sender
from cp_source.generate.settings import GeneratorSettings, GeneratorSummary, SenderCounters, SenderSettings
from cp_source.wire import bucket as bk
from cp_source.wire.parquet_rows import ReplayTooLarge
from cp_source.wire.sender_link import FactoryUnavailable, SenderIdInUse
from cp_source.wire.workload_id import WorkloadMismatch
from cp_source.wire.workloads import WORKLOAD_SPELLING, resolve

RATE_TOLERANCE = 0.01
LAG_TOLERANCE = 0.10  # of the run's duration
FRESH_BASE_ATTEMPTS = 5  # random sender-id bases tried when the factory has seen the drawn one


def fresh_sender_base(senders: int) -> int:
    """A random base for sender ids, so runs feeding one factory do not reuse ids."""
    if not 1 <= senders <= 256:
        raise ValueError(f"senders must be 1..256, got {senders}")
    return random.SystemRandom().randrange(1, (bk.MAX_SENDER + 1) // 256) * 256


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


def _sender_proc(
    q: Any, barrier: Any, endpoint: str, job: SenderSettings, events: EventSettings, lines: FileLines | None
) -> None:
    try:
        q.put(("ok", run_checked_sender(endpoint, job, events, barrier, lines)))
    except BaseException as e:  # reported to the parent, which raises
        q.put(("error", (type(e).__name__, str(e))))
        if barrier is not None:
            barrier.abort()


def _check_args(
    rate: float, duration: float, senders: int, bucket: int, workload: str, schema: str | None = None
) -> None:
    """Reject a run before any sender starts."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a positive number of tuples/s, got {rate}")
    if not duration > 0 or not math.isfinite(duration):
        raise ValueError(f"duration must be positive seconds, got {duration}")
    if not 1 <= senders <= 256:
        raise ValueError(f"senders must be 1..256, got {senders}")
    if bucket < 1 or bucket > bk.DEFAULT_MAX_TUPLES:
        raise ValueError(f"bucket must be 1..{bk.DEFAULT_MAX_TUPLES} tuples, got {bucket}")
    if workload.startswith("parquet:"):
        resolve(workload, schema)  # its footer read now: a missing or bad file fails here, nothing sent
    elif not (workload == "ysb" or workload.startswith("file:")):
        raise ValueError(f"unknown workload {workload!r}: expected {WORKLOAD_SPELLING}")


def _run_processes(
    endpoint: str, jobs: list[SenderSettings], events: EventSettings, lines: FileLines | None
) -> list[SenderCounters]:
    """Run one sender process per job, started together at a barrier; their counters by sender id.

    A file's checked lines go to each process with its job: no sender reads or checks it again."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(len(jobs))
    procs = [
        ctx.Process(target=_sender_proc, args=(q, barrier, endpoint, job, events, lines)) for job in jobs
    ]
    for p in procs:
        p.start()
    results: list[SenderCounters] = []
    errors: list[tuple[str, str]] = []
    for _ in procs:
        status, value = q.get()
        (results if status == "ok" else errors).append(value)
    for p in procs:
        p.join()
    # the others stopped at the barrier because of it, before any data bucket
    for kind in (
        SenderIdInUse,
        WorkloadMismatch,
        BadFileLine,
        BucketTooLarge,
        ReplayTooLarge,
        FactoryUnavailable,
    ):
        first = next((msg for name, msg in errors if name == kind.__name__), None)
        if first is not None:
            raise kind(first)
    if errors:
        raise OSError("generator sender failed: " + "; ".join(f"{n}: {m}" for n, m in errors))
    results.sort(key=lambda r: r["id"])
    return results


def _summary(
    results: list[SenderCounters],
    s: GeneratorSettings,
    endpoint: str,
    base: int,
    events: EventSettings,
    lines: FileLines | None,
) -> GeneratorSummary:
    """The run's settings, its senders' counters added up, and whether the generator limited it."""
    emitted = sum(r["emitted"] for r in results)
    dropped = sum(r["dropped"] for r in results)
    elapsed = max(r["elapsed_s"] for r in results)
    achieved = (emitted + dropped) / elapsed if elapsed else 0.0
    max_lag = max(r["max_lag_ms"] for r in results)
    end_wall = max(r["end_wall_s"] for r in results)
    aborted = any(r["aborted"] for r in results)
    # every sender checked the same lines against the same schema: the first one's check is the run's
    check = results[0]["line_check"] if lines is not None else None
    rate, duration = s.rate, s.duration
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
        "bucket": s.bucket,
        "workload": s.workload,
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
        "schema": s.schema,
        "skipped_lines": check["skipped"] if check is not None else 0,
        "line_check": check,
        "senders": results,
    }


def _run_senders(
    endpoint: str, base: int, total: int, s: GeneratorSettings, events: EventSettings, lines: FileLines | None
) -> list[SenderCounters]:
    """Senders ``base`` .. ``base + senders - 1`` sharing ``total`` tuples at ``rate``; their counters.

    Sender i is the run's sender index i (its event-time lag)."""
    shares = [total // s.senders + (i < total % s.senders) for i in range(s.senders)]
    per_rate = s.rate / s.senders
    jobs = [s.sender(i, base + i, per_rate, shares[i]) for i in range(s.senders)]
    if s.senders == 1:
        return [run_checked_sender(endpoint, jobs[0], events, lines=lines)]
    return _run_processes(endpoint, jobs, events, lines)


def run_generator(endpoint: str, settings: GeneratorSettings) -> GeneratorSummary:
    """Offer ``settings.rate`` tuples/s for ``settings.duration`` s from ``settings.senders``
    processes; return the JSON summary (``GeneratorSummary``).

    Each sender starts its schedule only after a factory acknowledged its hello
    (``FactoryUnavailable`` after ``ready_timeout`` s; ``BucketTooLarge`` before any bucket
    when a payload is over the frame cap the factory named); ``eos_delivered`` says the
    factory acknowledged every sender's end-of-stream totals, ``acknowledged`` that it received
    every tuple emitted. ``curve_keys``: a keys directory
    (``cloudprofiler keys generate``) when the factory runs with keys. Event times (sender i lags
    ``i * event_lag_ms``, jitter, a schedule clock from ``event_start_ms``) and heartbeats: see
    ``cp_source.generate.events``; ``schedule_event_ms`` gives a schedule clock's event times. ``delay``
    (a ``DelaySpec`` text such as ``normal:50,10``) holds each bucket back a drawn delay before its send,
    seeded by ``delay_seed`` (None: each sender's id); ``draw_delays_ms`` gives the delays drawn.
    ``key_skew`` (``uniform`` or ``zipf:S``, ysb only) draws the ads of ``skew_keys`` (``campaigns``
    or ``ads``) from that distribution, the hottest key moving every ``hot_key_rotate_s`` s of the
    schedule; ``cp_source.generate.hot_keys.expected_ads`` gives each tuple's ad (seed: the sender id).
    ``workload="file:PATH"`` with ``schema`` (Spark DDL): every line is parsed against it before any
    sender connects (``BadFileLine``, naming the line and the field), ``skip_bad_lines`` leaving the
    bad ones out (``skipped_lines`` in the summary); see ``cp_source.generate.file_check``.
    """
    s = settings
    _check_args(s.rate, s.duration, s.senders, s.bucket, s.workload, s.schema)
    events = s.event_settings(s.rate, s.senders)
    # every line of a replayed file checked before connecting: a bad one fails here, nothing sent
    lines = read_workload_file(s.workload, s.schema, s.skip_bad_lines)
    _check_endpoint(endpoint)
    total = round(s.rate * s.duration)
    if total >= bk.MAX_TUPLES_PER_SENDER:
        raise ValueError("rate x duration exceeds the tuple ids one sender can number")
    if events.key_skew is not None:  # refuse a pool too large before any sender starts
        plan_skew(
            events.key_skew, s.rate / s.senders, s.bucket, -(-total // s.senders), default_pool(s.bucket)
        )
    for attempt in range(1, FRESH_BASE_ATTEMPTS + 1):
        base = fresh_sender_base(s.senders) if s.sender_base is None else s.sender_base
        if base < 0 or base + s.senders - 1 > bk.MAX_SENDER:
            raise ValueError(f"sender ids {base}..{base + s.senders - 1} outside 0..{bk.MAX_SENDER}")
        try:
            results = _run_senders(endpoint, base, total, s, events, lines)
            break
        except SenderIdInUse:
            # a random base the factory has seen: nothing was sent yet, draw another
            if s.sender_base is not None or attempt == FRESH_BASE_ATTEMPTS:
                raise
    return _summary(results, s, endpoint, base, events, lines)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["run_generator"])
