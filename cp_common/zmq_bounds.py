"""Reading one ZeroMQ message with a cap on its frames, shared by every server (the factory's
front end and workers, the segment server, the sync coordinator, the config server), and a
client's send that waits a bounded time for its peer (:func:`send_within`).

ZeroMQ hands a message over only once its last frame is in, each frame bounded by
``MAXMSGSIZE``; a peer can still send thousands of frames in one message. Keeping only the
first few stops them from being copied into Python objects.

A server that checks its frames against a cap of its own (the factory's ``max_frame_bytes``)
sets ``MAXMSGSIZE`` well above that cap (:func:`frame_hard_cap`): ZeroMQ answers a frame over
``MAXMSGSIZE`` only by dropping the connection, without telling the server why, so a frame
between the two caps is received, rejected and counted by the server under a reason that
names it, and only a frame past the hard cap costs the peer its connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Literal, overload

import zmq

# Room above a server's own frame cap before ZeroMQ itself refuses a frame: at least this much,
# and at least the cap again (a frame twice the cap is still received and counted).
FRAME_SLACK_BYTES = 64 << 20


def frame_hard_cap(max_frame_bytes: int) -> int:
    """The ``MAXMSGSIZE`` of a socket whose frames the server checks against ``max_frame_bytes``."""
    return max_frame_bytes + max(max_frame_bytes, FRAME_SLACK_BYTES)


def cut_frames(frames: list[Any], keep_bytes: int) -> tuple[list[Any], int]:
    """Each frame cut to at most ``keep_bytes`` (zero-copy slices); and how many were cut."""
    out, cut = [], 0
    for f in frames:
        if len(f) > keep_bytes:
            out.append(memoryview(f)[:keep_bytes])
            cut += 1
        else:
            out.append(f)
    return out, cut


@overload
def recv_bounded(sock: zmq.Socket[Any], max_frames: int) -> tuple[list[bytes], int]: ...
@overload
def recv_bounded(
    sock: zmq.Socket[Any], max_frames: int, copy: Literal[False]
) -> tuple[list[zmq.Frame], int]: ...


def recv_bounded(sock: zmq.Socket[Any], max_frames: int, copy: bool = True) -> tuple[list[Any], int]:
    """One message (non-blocking), keeping at most ``max_frames`` frames; the rest are read and
    dropped, counted. ``copy=False``: the frames as ``zmq.Frame`` (no copy of a large payload)."""
    frames = [sock.recv(zmq.NOBLOCK, copy=copy)]
    extra = 0
    while sock.getsockopt(zmq.RCVMORE):
        part = sock.recv(zmq.NOBLOCK, copy=copy)
        if len(frames) < max_frames:
            frames.append(part)
        else:
            extra += 1
    return frames, extra


def send_within(sock: zmq.Socket[Any], frames: list[bytes], timeout_s: float) -> bool:
    """Send one message from a client socket, waiting at most ``timeout_s`` (0: not at all) for a
    pipe to a peer to take it; False when none did.

    A REQ or DEALER socket holds a send until it has a pipe to a peer, and a connection whose
    CurveZMQ handshake was refused (keys missing on one side) can lose that pipe between the
    ``connect`` and the send: a plain send then waits for ever. Measured on loopback against a
    keyed server with no client keys: 24 of 400 sends found no pipe.
    """
    before = sock.getsockopt(zmq.SNDTIMEO)
    sock.setsockopt(zmq.SNDTIMEO, max(0, int(timeout_s * 1000)))
    try:
        sock.send_multipart(frames)
        return True
    except zmq.Again:
        return False
    finally:
        sock.setsockopt(zmq.SNDTIMEO, before)


def while_serving(sock: zmq.Socket[Any], stop: threading.Event, poll_ms: int = 100) -> Iterator[None]:
    """A server's loop: yields each time ``sock`` has a message waiting, until ``stop`` is set
    (looked at every ``poll_ms``, so stopping never waits on a silent peer)."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while not stop.is_set():
        if poller.poll(poll_ms):
            yield
