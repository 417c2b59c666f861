"""A generator sender's connection to a factory: hello before the schedule, acknowledged end of stream.

ZeroMQ queues messages for a peer that is not there yet, so a sender that
only sends cannot tell a live factory from a closed port: it would report a
clean run over a schedule nobody received. A sender therefore opens a DEALER
socket, sends a hello and waits for the factory's acknowledgement before its
schedule starts (``FactoryUnavailable`` if none comes in time), and after
its last bucket sends its end-of-stream totals and waits for their
acknowledgement: only then was the end of stream delivered.

The other side is any ROUTER that answers with :func:`ack_frames`: the
factory's front end, or the naive baseline source.

An acknowledgement's payload may say more (:class:`AckInfo`, a small JSON object
``{"v": 1, ...}``): the factory's frame cap in the answer to a hello, so the
sender refuses a bucket too large for it before sending any; and in the answer
to an end of stream the tuples and buckets of that sender it accepted, so a
sender whose buckets did not all arrive (a dropped connection) knows it. An
empty payload (an older factory, the naive source) or one that does not parse
says nothing more; the acknowledgement still counts.

Credit (flow control, ``cp_source.factory.credit``). A hello that says ``"credit": 1``
asks for it; the answer then carries ``credit_seq``, the seq the sender may send
up to (exclusive), and the factory raises it later with an acknowledgement of
data (:func:`credit_frames`: ``first_id`` = the data kind, ``seq`` = one past the
highest data seq it accepted, payload ``{"v": 1, "credit_seq": N}``), which the
sender reads with :func:`read_credit`. Both ends stay compatible: an older
factory says no ``credit_seq`` (the sender is then never held back), and an
older generator's hello does not ask (the factory then sends it no credit).

After the hello the sender watches its socket for dropped connections
(:class:`DisconnectWatch`): a connection ZeroMQ drops and reconnects takes the
messages in flight with it, without an error on the sending side.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Any

import orjson
import zmq

import native_tsc
from cp_common import curve_keys as ck
from cp_common.process_times import mark
from cp_common.zmq_bounds import send_within
from cp_source.wire import bucket as bk
from cp_source.wire.workload_id import WorkloadId, WorkloadMismatch, hello_payload, refused_by

DEFAULT_READY_TIMEOUT_S = 10.0
RESEND_S = 1.0
ACK_INFO_VERSION = 1
# the factory's schema (Spark DDL) in the answer to a hello that asks for it: at most this many bytes,
# well inside the sender's MAXMSGSIZE (a longer one is not announced, and the generator says so)
MAX_ACK_SCHEMA_BYTES = 32 << 10
MAX_ACK_INFO_BYTES = MAX_ACK_SCHEMA_BYTES + 4096  # an acknowledgement's payload is read only up to this
MAX_ACK_MESSAGE = 64 << 10  # MAXMSGSIZE of a sender's socket: it receives only acknowledgements


# The payload of an acknowledgement that refuses a hello: the sender id already numbered tuples
# on this factory's spool, so a second run under it would reuse its tuple ids.
REFUSED_SENDER_IN_USE = b"sender_id_in_use"


class FactoryUnavailable(ConnectionError):
    """No factory acknowledged the sender's hello (or its end of stream) in time."""


class SenderIdInUse(ValueError):
    """The factory refused the hello: its spool already holds tuples of this sender id."""


@dataclass(frozen=True, slots=True)
class AckInfo:
    """What an acknowledgement said beyond "acknowledged"; None: not said (an older factory).

    ``max_frame_bytes``: the largest payload the factory accepts (a hello's answer).
    ``accepted_tuples``, ``accepted_buckets``: what the factory's front end accepted of this sender
    (an end of stream's answer). ``credit_seq``: the seq the sender may send up to, exclusive (the
    answer to a hello that asked for credit, and a credit acknowledgement). ``workload`` (its name)
    and ``schema`` (its payload fields as Spark DDL, NDJSON workloads only): the answer to a hello
    that asked for the factory's schema (``cp_source.wire.workload_id.hello_payload``).
    """

    max_frame_bytes: int | None = None
    accepted_tuples: int | None = None
    accepted_buckets: int | None = None
    credit_seq: int | None = None
    workload: str | None = None
    schema: str | None = None

    def to_json(self) -> bytes:
        fields = {k: getattr(self, k) for k in (*_ACK_FIELDS, *_ACK_TEXTS) if getattr(self, k) is not None}
        return orjson.dumps({"v": ACK_INFO_VERSION, **fields})


_ACK_FIELDS = ("max_frame_bytes", "accepted_tuples", "accepted_buckets", "credit_seq")
_ACK_TEXTS = {"workload": 64, "schema": MAX_ACK_SCHEMA_BYTES}  # text fields and their bounds (characters)
_ACK_FIELD_MAX = 1 << 62


def parse_ack_info(payload: bytes) -> AckInfo:
    """An acknowledgement's payload read as :class:`AckInfo`, bounded; anything else says nothing.

    Unknown keys are ignored (a newer factory may say more); a known key that is not an integer in
    range is left unsaid, so a wrong value can never make a sender refuse or doubt a run.
    """
    if not payload or len(payload) > MAX_ACK_INFO_BYTES:
        return AckInfo()
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return AckInfo()
    if not isinstance(doc, dict) or doc.get("v") != ACK_INFO_VERSION:
        return AckInfo()
    got: dict[str, Any] = {}
    for k in _ACK_FIELDS:
        v = doc.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _ACK_FIELD_MAX:
            got[k] = v
    for k, most in _ACK_TEXTS.items():
        v = doc.get(k)
        if isinstance(v, str) and 0 < len(v) <= most and v.isprintable():
            got[k] = v
    if got.get("max_frame_bytes") == 0:
        del got["max_frame_bytes"]
    return AckInfo(**got)


def ack_frames(h: bk.Header, refusal: bytes = b"", info: AckInfo | None = None) -> list[bytes]:
    """The acknowledgement of ``h`` (a hello or an end-of-stream): an ACK header naming its kind and seq.

    A non-empty ``refusal`` (a reason code such as ``REFUSED_SENDER_IN_USE``) turns it into a refusal;
    otherwise ``info`` (if any) is its payload.
    """
    payload = refusal or (info.to_json() if info is not None else b"")
    ack = bk.Header(
        bk.KIND_ACK, h.sender_id, h.seq, h.kind, 0, len(payload), native_tsc.now(), time.time_ns(), ""
    )
    return [bk.pack_header(ack), payload]


def answer_control(
    sock: zmq.Socket, ident: bytes, h: bk.Header, refusal: bytes = b"", info: AckInfo | None = None
) -> None:
    """Acknowledge (or refuse) a hello or end-of-stream on a ROUTER socket; a gone peer gets nothing."""
    with contextlib.suppress(zmq.ZMQError):
        sock.send_multipart([ident, *ack_frames(h, refusal, info)], zmq.NOBLOCK)


def credit_frames(sender_id: int, seq_next: int, credit_seq: int) -> list[bytes]:
    """A credit: an acknowledgement of ``sender_id``'s data up to ``seq_next`` (exclusive) that lets
    it send up to ``credit_seq`` (exclusive)."""
    h = bk.Header(bk.KIND_DATA, sender_id, seq_next, 0, 0, 0, 0, 0, "")
    return ack_frames(h, info=AckInfo(credit_seq=credit_seq))


def read_credit(sock: zmq.Socket, sender_id: int, timeout_ms: int = 0) -> int | None:
    """The largest credit among the acknowledgements waiting on ``sock`` (waiting up to ``timeout_ms``
    for the first); None when none came. Other messages are dropped: a sender reads its socket
    only here, for a hello's answer and for its end of stream's."""
    best: int | None = None
    while sock.poll(timeout_ms, zmq.POLLIN):
        timeout_ms = 0
        frames = sock.recv_multipart()
        try:
            h = bk.parse_header(frames[0])
        except bk.BucketError:
            continue
        if (
            h.kind != bk.KIND_ACK
            or h.sender_id != sender_id
            or h.first_id != bk.KIND_DATA
            or len(frames) != 2
        ):
            continue
        c = parse_ack_info(bytes(frames[1])).credit_seq
        if c is not None and (best is None or c > best):
            best = c
    return best


def _control(packer: bk.HeaderPacker, kind: int, seq: int, payload: bytes) -> list[Any]:
    hdr = packer.pack(kind, seq, 0, 0, len(payload), native_tsc.now(), time.time_ns())
    return [bytes(hdr), payload]


def await_ack(sock: zmq.Socket, sender_id: int, kind: int, seq: int, timeout_s: float) -> bool:
    """Wait for the acknowledgement of (kind, seq); other messages are skipped. False on timeout."""
    return await_ack_info(sock, sender_id, kind, seq, timeout_s) is not None


def await_ack_info(sock: zmq.Socket, sender_id: int, kind: int, seq: int, timeout_s: float) -> AckInfo | None:
    """Wait for the acknowledgement of (kind, seq) and read what it says; None on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
            return None
        frames = sock.recv_multipart()
        try:
            h = bk.parse_header(frames[0])
        except bk.BucketError:
            continue
        if h.kind == bk.KIND_ACK and h.sender_id == sender_id and h.first_id == kind and h.seq == seq:
            theirs = refused_by(frames[1]) if len(frames) > 1 else None
            if theirs is not None:
                raise WorkloadMismatch(f"the factory takes {theirs.describe()}")
            if len(frames) > 1 and frames[1] == REFUSED_SENDER_IN_USE:
                raise SenderIdInUse(
                    f"the factory refused sender id {sender_id}: its spool already holds tuples of that "
                    "sender (an earlier run with the same --sender-base); leave --sender-base unset for a "
                    "fresh random one, or pick another"
                )
            return parse_ack_info(bytes(frames[1])) if len(frames) > 1 else AckInfo()


def open_link(
    ctx: zmq.Context,
    endpoint: str,
    packer: bk.HeaderPacker,
    hwm: int,
    timeout_s: float,
    curve_keys: str | None = None,
    workload: WorkloadId | None = None,
    credit: bool = False,
    schema: bool = False,
) -> tuple[zmq.Socket, AckInfo]:
    """A DEALER connected to ``endpoint`` whose hello a factory acknowledged within ``timeout_s``,
    and what the factory's answer to the hello said (its frame cap, with ``credit`` the sender's
    first credit when the factory does flow control, with ``schema`` the factory's workload and
    schema).

    ``workload``: the sender's, named in its hello; a factory of another workload refuses it
    (``WorkloadMismatch``, one line naming both).

    With ``curve_keys`` the socket speaks CURVE with the client key in that directory. A factory
    refuses a wrong or missing key without a word: the handshake watch names that failure in the
    ``FactoryUnavailable`` message instead of a bare timeout.
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_ACK_MESSAGE)  # a sender receives only acknowledgements
    try:
        if curve_keys:
            ck.client_secure(sock, curve_keys)
    except BaseException:
        sock.close(0)
        raise
    watch = ck.HandshakeWatch(sock)
    try:
        hello = hello_payload(workload, credit, schema)
        return _hello(sock, watch, endpoint, packer, timeout_s, bool(curve_keys), hello, workload)
    finally:
        watch.close()


def _hello(
    sock: zmq.Socket,
    watch: ck.HandshakeWatch,
    endpoint: str,
    packer: bk.HeaderPacker,
    timeout_s: float,
    keyed: bool,
    hello: bytes,
    workload: WorkloadId | None = None,
) -> tuple[zmq.Socket, AckInfo]:
    """Connect, say hello and wait for its acknowledgement; the socket is closed on failure."""
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close(0)
        raise ValueError(
            f"invalid endpoint {endpoint!r}: {e.strerror} (expected e.g. tcp://127.0.0.1:5555)"
        ) from None
    started = time.monotonic()
    info = None
    if send_within(sock, _control(packer, bk.KIND_HELLO, 0, hello), timeout_s):
        mark(f"sender {packer.sender_id}: hello sent")
        left = timeout_s - (time.monotonic() - started)
        info = _hello_answer(sock, packer.sender_id, left, endpoint, workload)
    if info is None:
        hint = ck.refusal_hint(watch, keyed)
        sock.close(0)
        if hint:
            raise FactoryUnavailable(
                f"no factory answered the hello at {endpoint} within {timeout_s:g} s{hint}"
            )
        raise FactoryUnavailable(
            f"no factory answered at {endpoint} within {timeout_s:g} s: start the factory (or the query "
            "whose cloudprofiler source embeds it) first, or wait longer (--wait-ready)"
        )
    mark(f"sender {packer.sender_id}: hello acknowledged")
    return sock, info


def _hello_answer(
    sock: zmq.Socket, sender_id: int, timeout_s: float, endpoint: str, workload: WorkloadId | None
) -> AckInfo | None:
    """The factory's answer to the hello (None when none came in time); the socket is closed when
    the factory refused the sender."""
    try:
        return await_ack_info(sock, sender_id, bk.KIND_HELLO, 0, timeout_s)
    except SenderIdInUse:
        sock.close(0)
        raise
    except WorkloadMismatch as e:
        sock.close(0)
        assert workload is not None  # only a hello naming a workload is refused for it
        raise WorkloadMismatch(
            f"{e} at {endpoint}, but this generator sends {workload.describe()}: start the generator "
            f"with the factory's workload (and schema), or the factory with the generator's"
        ) from None


def close_stream(sock: zmq.Socket, packer: bk.HeaderPacker, seq: int, eos: bytes, timeout_s: float) -> bool:
    """Send the end-of-stream totals and wait for their acknowledgement; True only if acknowledged."""
    return close_stream_info(sock, packer, seq, eos, timeout_s) is not None


def close_stream_info(
    sock: zmq.Socket, packer: bk.HeaderPacker, seq: int, eos: bytes, timeout_s: float
) -> AckInfo | None:
    """Send the end-of-stream totals and wait for their acknowledgement; what it said, None if none came.

    One connection keeps order, so the totals arrive after every data bucket that
    was sent. They are sent again every ``RESEND_S`` until acknowledged: a factory
    restarted on the same endpoint and spool still receives them (the socket
    reconnects by itself), and a duplicate only repeats the same totals.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        with contextlib.suppress(zmq.Again):  # a full queue: the next round tries again
            sock.send_multipart(_control(packer, bk.KIND_EOS, seq, eos), zmq.NOBLOCK)
        info = await_ack_info(sock, packer.sender_id, bk.KIND_EOS, seq, min(left, RESEND_S))
        if info is not None:
            return info


_WATCHES = itertools.count()


class DisconnectWatch:
    """Counts the connections of a sender's socket that dropped (a monitor read only when asked).

    ZeroMQ reconnects by itself and says nothing to the sender; the messages that were in flight
    are gone. A factory drops a connection that sends a frame past its hard cap, and a factory that
    stops or restarts drops them all.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        addr = f"inproc://cp-sender-watch-{next(_WATCHES)}"
        sock.monitor(addr, zmq.EVENT_DISCONNECTED)
        # unbounded queue: ZeroMQ blocks the socket's own thread on a full monitor queue, and the
        # count is read only at the end of the run (an event is a few bytes)
        self._mon: zmq.Socket | None = sock.context.socket(zmq.PAIR)
        self._mon.setsockopt(zmq.RCVHWM, 0)
        self._mon.connect(addr)
        self.disconnects = 0

    def count(self) -> int:
        """Dropped connections so far."""
        while self._mon is not None and self._mon.poll(0):
            try:
                self._mon.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            self.disconnects += 1
        return self.disconnects

    def close(self) -> int:
        """Stop watching (the socket stays open); the count."""
        n = self.count()
        if self._mon is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._mon.close(0)
            self._mon = None
        return n
