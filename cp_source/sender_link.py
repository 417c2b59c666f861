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
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import zmq

import native_tsc
from cp_source import bucket as bk
from cp_source.startup_trace import mark
from native_tsc import curve_keys as ck

DEFAULT_READY_TIMEOUT_S = 10.0
RESEND_S = 1.0


# The payload of an acknowledgement that refuses a hello: the sender id already numbered tuples
# on this factory's spool, so a second run under it would reuse its tuple ids.
REFUSED_SENDER_IN_USE = b"sender_id_in_use"


class FactoryUnavailable(ConnectionError):
    """No factory acknowledged the sender's hello (or its end of stream) in time."""


class SenderIdInUse(ValueError):
    """The factory refused the hello: its spool already holds tuples of this sender id."""


def ack_frames(h: bk.Header, refusal: bytes = b"") -> list[bytes]:
    """The acknowledgement of ``h`` (a hello or an end-of-stream): an ACK header naming its kind and seq.

    A non-empty ``refusal`` (a reason code such as ``REFUSED_SENDER_IN_USE``) turns it into a refusal.
    """
    ack = bk.Header(
        bk.KIND_ACK, h.sender_id, h.seq, h.kind, 0, len(refusal), native_tsc.now(), time.time_ns(), ""
    )
    return [bk.pack_header(ack), refusal]


def answer_control(sock: zmq.Socket, ident: bytes, h: bk.Header, refusal: bytes = b"") -> None:
    """Acknowledge (or refuse) a hello or end-of-stream on a ROUTER socket; a gone peer gets nothing."""
    with contextlib.suppress(zmq.ZMQError):
        sock.send_multipart([ident, *ack_frames(h, refusal)], zmq.NOBLOCK)


def _control(packer: bk.HeaderPacker, kind: int, seq: int, payload: bytes) -> list[Any]:
    hdr = packer.pack(kind, seq, 0, 0, len(payload), native_tsc.now(), time.time_ns())
    return [bytes(hdr), payload]


def await_ack(sock: zmq.Socket, sender_id: int, kind: int, seq: int, timeout_s: float) -> bool:
    """Wait for the acknowledgement of (kind, seq); other messages are skipped. False on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
            return False
        frames = sock.recv_multipart()
        try:
            h = bk.parse_header(frames[0])
        except bk.BucketError:
            continue
        if h.kind == bk.KIND_ACK and h.sender_id == sender_id and h.first_id == kind and h.seq == seq:
            if len(frames) > 1 and frames[1] == REFUSED_SENDER_IN_USE:
                raise SenderIdInUse(
                    f"the factory refused sender id {sender_id}: its spool already holds tuples of that "
                    "sender (an earlier run with the same --sender-base); leave --sender-base unset for a "
                    "fresh random one, or pick another"
                )
            return True


def open_link(
    ctx: zmq.Context,
    endpoint: str,
    packer: bk.HeaderPacker,
    hwm: int,
    timeout_s: float,
    curve_keys: str | None = None,
) -> zmq.Socket:
    """A DEALER connected to ``endpoint`` whose hello a factory acknowledged within ``timeout_s``.

    With ``curve_keys`` the socket speaks CURVE with the client key in that directory. A factory
    refuses a wrong or missing key without a word: the handshake watch names that failure in the
    ``FactoryUnavailable`` message instead of a bare timeout.
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if curve_keys:
            ck.client_secure(sock, curve_keys)
    except BaseException:
        sock.close(0)
        raise
    watch = ck.HandshakeWatch(sock)
    try:
        return _hello(sock, watch, endpoint, packer, timeout_s, bool(curve_keys))
    finally:
        watch.close()


def _hello(
    sock: zmq.Socket,
    watch: ck.HandshakeWatch,
    endpoint: str,
    packer: bk.HeaderPacker,
    timeout_s: float,
    keyed: bool,
) -> zmq.Socket:
    """Connect, say hello and wait for its acknowledgement; the socket is closed on failure."""
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close(0)
        raise ValueError(
            f"invalid endpoint {endpoint!r}: {e.strerror} (expected e.g. tcp://127.0.0.1:5555)"
        ) from None
    sock.send_multipart(_control(packer, bk.KIND_HELLO, 0, b""))
    mark(f"sender {packer.sender_id}: hello sent")
    try:
        acked = await_ack(sock, packer.sender_id, bk.KIND_HELLO, 0, timeout_s)
    except SenderIdInUse:
        sock.close(0)
        raise
    if not acked:
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
    return sock


def close_stream(sock: zmq.Socket, packer: bk.HeaderPacker, seq: int, eos: bytes, timeout_s: float) -> bool:
    """Send the end-of-stream totals and wait for their acknowledgement; True only if acknowledged.

    One connection keeps order, so the totals arrive after every data bucket that
    was sent. They are sent again every ``RESEND_S`` until acknowledged: a factory
    restarted on the same endpoint and spool still receives them (the socket
    reconnects by itself), and a duplicate only repeats the same totals.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(zmq.Again):  # a full queue: the next round tries again
            sock.send_multipart(_control(packer, bk.KIND_EOS, seq, eos), zmq.NOBLOCK)
        if await_ack(sock, packer.sender_id, bk.KIND_EOS, seq, min(left, RESEND_S)):
            return True
