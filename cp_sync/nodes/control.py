"""The sync control plane's wire format: ZeroMQ multipart, an orjson header frame, optional binary rows.

Every frame is bounded: headers to 64 KiB, probe rows to MAX_ROUNDS rows of
five int64, and ZeroMQ's MAXMSGSIZE refuses anything larger before it is
read into memory.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import numpy as np
import orjson
import zmq

MAX_HEADER = 64 * 1024
MAX_ROUNDS = 100_000
ROW_FIELDS = 5  # seq, c_i, c_j, c_k, ns_i
MAX_MESSAGE = MAX_HEADER + MAX_ROUNDS * ROW_FIELDS * 8 + 1024
MIN_PROBE_PORT = 1024  # probes never go to a system service's port (no use as a reflector)


def endpoint(addr: str) -> str:
    """``host:port`` or a ZeroMQ tcp endpoint -> ``tcp://host:port``."""
    if "://" in addr:
        if not addr.startswith("tcp://"):
            raise ValueError(f"only tcp:// endpoints are supported, got {addr!r}")
        return addr
    if ":" not in addr:
        raise ValueError(f"address {addr!r} needs a port, e.g. 127.0.0.1:5599")
    return f"tcp://{addr}"


def check_ipv4(host: str) -> str:
    """``host`` if it is an IPv4 address literal (probes never resolve names)."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"not an IPv4 address: {host!r}") from None
    return host


def check_probe_host(host: str) -> str:
    """``host`` if probes may be sent to it: a unicast IPv4 address (not 0.0.0.0, broadcast or multicast)."""
    addr = ipaddress.IPv4Address(check_ipv4(host))
    if (
        addr.is_unspecified
        or addr.is_multicast
        or addr.is_reserved
        or addr == ipaddress.IPv4Address("255.255.255.255")
    ):
        raise ValueError(f"probe address {host} is not a unicast host address")
    return host


def configure(sock: zmq.Socket) -> None:
    """Bounded message size and no lingering on close."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
    sock.setsockopt(zmq.LINGER, 0)


def pack(header: dict[str, Any], rows: np.ndarray | None = None) -> list[bytes]:
    """Frames for one message."""
    frames = [orjson.dumps(header)]
    if rows is not None:
        frames.append(np.ascontiguousarray(rows, dtype="<i8").tobytes())
    return frames


def unpack(frames: list[bytes]) -> tuple[dict[str, Any], np.ndarray | None]:
    """Header and rows of one message; ValueError if anything is out of bounds or malformed."""
    if not 1 <= len(frames) <= 2 or len(frames[0]) > MAX_HEADER:
        raise ValueError("malformed control message")
    header = orjson.loads(frames[0])
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ValueError("control message without an op")
    rows = None
    if len(frames) == 2:
        raw = frames[1]
        if len(raw) % (ROW_FIELDS * 8) or len(raw) // (ROW_FIELDS * 8) > MAX_ROUNDS:
            raise ValueError("probe rows frame of a bad size")
        rows = np.frombuffer(raw, dtype="<i8").reshape(-1, ROW_FIELDS).astype(np.int64)
    return header, rows


def int_field(header: dict[str, Any], name: str, lo: int, hi: int) -> int:
    """An integer field within [lo, hi]."""
    v = header.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"field {name!r} must be an integer in {lo}..{hi}")
    return v


def str_field(header: dict[str, Any], name: str, max_len: int = 256) -> str:
    """A non-empty string field of bounded length."""
    v = header.get(name)
    if not isinstance(v, str) or not 0 < len(v) <= max_len:
        raise ValueError(f"field {name!r} must be a string of 1..{max_len} characters")
    return v
