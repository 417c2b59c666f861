"""One sender: says hello, offers its tuples at its rate, and closes its stream with its totals.

The factory's frame cap. The answer to a sender's hello names the largest payload the factory
accepts; a sender whose pool holds a larger one raises ``BucketTooLarge`` before its first bucket and
closes its stream with nothing sent. The answer to its end of stream names the tuples the factory
received (``factory_accepted``), and a monitor counts the connections that dropped
(``disconnects``): a sender is ``acknowledged`` only when every tuple it emitted arrived (see
``cp_source.wire.sender_link``).

Flow control. The sender's hello asks for the factory's credit; it then sends only below it and
waits, heartbeating, for more (``cp_source.generate.credit``): ``credit_waits``, ``credit_wait_s``
and ``credit_lapsed`` in its counters.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import zmq

import native_tsc
from cp_common.process_times import mark
from cp_source.generate.credit import POLL_MS, CreditGate
from cp_source.generate.delayed import DelayedEmitter
from cp_source.generate.events import EventSettings
from cp_source.generate.file_check import BadFileLine, FileLines, check_against_factory, read_workload_file
from cp_source.generate.file_pool import bucket_bytes, check_file_fits
from cp_source.generate.hot_keys import Payloads
from cp_source.generate.pacing import Emission, emit
from cp_source.generate.payloads import BucketTooLarge, check_fits, file_payloads, sender_payloads
from cp_source.generate.settings import CreditCounters, SenderCounters, SenderSettings
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import AckInfo, DisconnectWatch, close_stream_info, open_link
from cp_source.wire.workload_id import WorkloadMismatch, identify

SEND_HWM = 8  # at least this many buckets may wait in a sender's queue ...
SEND_QUEUE_S = 0.05  # ... or as many as it offers in 50 ms, so scheduling jitter is not a drop
SEND_QUEUE_MAX_BYTES = 64 << 20
# The end of stream waits behind the buckets queued before it; a query at capacity with a full spool
# may take this long to make room for them.
EOS_ACK_TIMEOUT_S = 60.0
# A sender that stops before its first bucket (its buckets are too large for the factory, or another
# sender of the run failed) still closes its stream, with nothing sent; a live factory answers at once.
EMPTY_EOS_TIMEOUT_S = 10.0


def _open_link(
    endpoint: str, packer: bk.HeaderPacker, s: SenderSettings, bucket_bytes: int, ask_schema: bool = False
) -> tuple[zmq.Context[Any], zmq.Socket[Any], AckInfo]:
    """A context and a socket whose hello a factory acknowledged, its queue sized for the sender's
    rate; and what the acknowledgement said (with ``ask_schema``, the factory's workload and schema)."""
    hwm = s.hwm
    if hwm is None:
        by_time = math.ceil(SEND_QUEUE_S * s.rate / s.bucket)
        hwm = max(SEND_HWM, min(by_time, SEND_QUEUE_MAX_BYTES // max(1, bucket_bytes)))
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        workload = identify(s.workload, s.schema)  # named in the hello: a factory of another refuses it
        return ctx, *open_link(
            ctx,
            endpoint,
            packer,
            hwm,
            s.ready_timeout,
            s.curve_keys,
            workload,
            credit=s.flow_control,
            schema=ask_schema,
        )
    except BaseException:
        ctx.term()
        raise


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
    e: Emission,
    watch: DisconnectWatch,
) -> SenderCounters:
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
        "line_check": None,
        "intended_t0_tsc": e.intended.t0 if e.intended is not None else None,
        "tsc_hz": e.intended.hz if e.intended is not None else None,
        **_credit_report(e.credit),
    }


def _credit_report(gate: CreditGate | None) -> CreditCounters:
    """The sender's flow-control counters: how often and how long it waited for the factory's credit,
    and whether the factory went silent during a wait (``cp_source.generate.credit``)."""
    if gate is None:
        return {"credit_waits": 0, "credit_wait_s": 0.0, "credit_lapsed": False}
    return {"credit_waits": gate.waits, "credit_wait_s": gate.wait_ns / 1e9, "credit_lapsed": gate.lapsed}


def run_sender(endpoint: str, settings: SenderSettings, barrier: Any = None) -> SenderCounters:
    """One sender: offer ``settings.tuples`` tuples at ``settings.rate`` tuples/s; return its counters.

    Raises ``FactoryUnavailable`` when no factory acknowledges its hello within ``ready_timeout``
    (its message says so when the CurveZMQ handshake failed: ``curve_keys``, a keys directory).
    ``barrier``: a ``multiprocessing`` barrier the senders of a run wait at before their first bucket.
    """
    return run_checked_sender(endpoint, settings, settings.event_settings(settings.rate, 1), barrier)


def run_checked_sender(
    endpoint: str,
    s: SenderSettings,
    events: EventSettings,
    barrier: Any = None,
    lines: FileLines | None = None,
) -> SenderCounters:
    """``run_sender`` with its event settings already parsed and checked; ``lines``: a file
    workload's lines already read and checked (None: read and check them here)."""
    mark(f"sender {s.sender_id}: started")
    pays, lines, size = _prepared(s, events, lines)
    packer = bk.HeaderPacker(s.sender_id, native_tsc.domain_id())
    # a file replayed without a schema: its lines are checked against the one the factory announces
    ctx, sock, hello = _open_link(
        endpoint, packer, s, size, ask_schema=lines is not None and lines.against is None
    )
    first = bk.tuple_id(s.sender_id, 0)
    watch = DisconnectWatch(sock)
    try:
        try:
            if lines is not None:  # before the schedule: a bad line costs nothing on the hot path
                lines = check_against_factory(lines, hello.workload, hello.schema, s.skip_bad_lines)
            pays = _fitting(pays, lines, s, hello.max_frame_bytes)
            gate = CreditGate(sock, s.sender_id, hello.credit_seq, events.heartbeat_ms or POLL_MS)
            emission = _run_loop(sock, packer, pays, s, first, barrier, events, gate)
        except (BucketTooLarge, BadFileLine, WorkloadMismatch, threading.BrokenBarrierError):
            _close_empty(sock, packer, s.sender_id, first)  # before any bucket: nothing was sent
            raise
        counters = _end_of_stream(sock, packer, s.sender_id, first, s.rate, s.tuples, emission, watch)
        counters["line_check"] = lines.report() if lines is not None else None
        return counters
    finally:
        watch.close()
        sock.close(0)  # the end of stream was acknowledged (or counted as not delivered)
        ctx.term()


def _prepared(
    s: SenderSettings, events: EventSettings, lines: FileLines | None
) -> tuple[Payloads | None, FileLines | None, int]:
    """The sender's payloads, or a file's checked lines (its pool is built once the factory named its
    frame cap), and a bucket's bytes (to size the send queue)."""
    if lines is None:
        lines = read_workload_file(s.workload, s.schema, s.skip_bad_lines)
    if lines is not None:
        return None, lines, bucket_bytes(lines, s.bucket)
    seed = s.sender_id if s.seed is None else s.seed
    pays = sender_payloads(s.workload, s.bucket, s.rate, s.tuples, seed, events.key_skew)
    return pays, None, len(pays.pools[0][0])


def _fitting(pays: Payloads | None, lines: FileLines | None, s: SenderSettings, cap: int | None) -> Payloads:
    """The sender's payloads, checked against the factory's frame cap (``BucketTooLarge``); a file's
    pool is built only once its lines and buckets are known to fit."""
    if pays is not None:
        check_fits(pays, s.bucket, s.workload, cap)
        return pays
    assert lines is not None
    check_file_fits(lines, s.bucket, s.workload, cap)
    return Payloads([file_payloads(lines, s.bucket)], [])


def _run_loop(
    sock: zmq.Socket[Any],
    packer: bk.HeaderPacker,
    pays: Payloads,
    s: SenderSettings,
    first: int,
    barrier: Any,
    events: EventSettings,
    gate: CreditGate,
) -> Emission:
    """The emission loop: the plain one, or the one that holds buckets back for an injected delay;
    either sends only below the factory's credit (``gate``)."""
    if events.delay is None:
        return emit(
            sock, packer, pays, s.bucket, s.rate, s.tuples, first, barrier, events, s.sender_index, gate
        )
    loop = DelayedEmitter(sock, packer, pays, s.bucket, s.rate, s.tuples, first, events, s.sender_index)
    loop.gate = gate
    return loop.run(barrier)


def _close_empty(sock: zmq.Socket[Any], packer: bk.HeaderPacker, sender_id: int, first: int) -> None:
    """End the stream of a sender that sent nothing, so the factory holds it closed with zero totals."""
    body = bk.EndOfStream(sender_id, first, first, 0, 0, 0, []).to_json()
    close_stream_info(sock, packer, 0, body, EMPTY_EOS_TIMEOUT_S)
