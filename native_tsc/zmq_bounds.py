"""Reading one ZeroMQ message with a cap on its frames, shared by every server.

ZeroMQ hands a message over only once its last frame is in, each frame bounded by
``MAXMSGSIZE``; a peer can still send thousands of frames in one message. Keeping only the
first few stops them from being copied into Python objects.
"""

from __future__ import annotations

from typing import Any

import zmq


def recv_bounded(sock: zmq.Socket[Any], max_frames: int) -> tuple[list[bytes], int]:
    """One message, keeping at most ``max_frames`` frames; the rest are read and dropped, counted."""
    frames = [sock.recv(zmq.NOBLOCK)]
    extra = 0
    while sock.getsockopt(zmq.RCVMORE):
        part = sock.recv(zmq.NOBLOCK)
        if len(frames) < max_frames:
            frames.append(part)
        else:
            extra += 1
    return frames, extra
