"""MinRTT probe loops timed in C, stamping this process's clock: the public face of the ``_probe`` extension.

The C loops read the raw counter. This module applies the process's virtual
transform where it belongs: the initiator's own stamps (c_i, c_k) here, with
``native_tsc.transform``; the responder's stamp (c_j) in C before the reply
leaves, with the same exact integer arithmetic. Rows come back with every
stamp in its own side's domain.

The loops read the CPU counter, so they only make sense when ``now()`` does
too: ``unavailable_reason()`` says why they cannot be used in this process
(the pure-Python clock, or the extension missing).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from types import ModuleType

import numpy as np

import native_tsc

# Fixed by the wire format and the C module (tests check these equal the extension's).
PACKET_SIZE = 32
KEYED_PACKET_SIZE = 40  # the 32 bytes and their SipHash-2-4 tag
KEY_SIZE = 16
MAX_ALLOW = 512  # sources on an allow-list: two per agent (reached at, probes from), 256 agents
ROW_FIELDS = 5  # seq, c_i, c_j, c_k, ns_i
MAX_PROBES = 1_000_000

TransformParams = tuple[bool, int, int]  # (virtual_on, skew_e12, offset)


class ProbeLoopsUnavailable(RuntimeError):
    """The C probe loops cannot stamp this process's clock."""


def _extension() -> ModuleType:
    # Imported on first use, so a process on the pure-Python clock never needs the extension.
    from native_tsc import _probe

    return _probe


def unavailable_reason() -> str | None:
    """Why the C loops cannot be used in this process, or None when they can."""
    if not native_tsc.clock.is_native:
        return (
            f"C-timed probes need the native TSC backend, this process uses {native_tsc.BACKEND!r}: "
            "its counter is not the one the C loops read"
        )
    try:
        _extension()
    except ImportError as e:
        return f"the C probe extension is unavailable ({e})"
    return None


def require() -> None:
    """Raise ProbeLoopsUnavailable (with the reason) unless the C loops can be used."""
    why = unavailable_reason()
    if why is not None:
        raise ProbeLoopsUnavailable(why)


def transform_params() -> TransformParams:
    """This process's virtual transform as the C responder takes it."""
    return native_tsc.clock.transform_params()


def c_transform(raw: int, params: TransformParams | None = None) -> int:
    """The transform the C responder applies to its stamps (``params`` default: this process's)."""
    on, skew_e12, offset = params if params is not None else transform_params()
    return int(_extension().transform(raw, on, skew_e12, offset))


def pack_allow(hosts: Iterable[str] | None) -> bytes | None:
    """An allow-list as the C responder takes it: 4 bytes per IPv4 address, network order (None: anyone).

    Raises ValueError naming the first entry that is not an IPv4 address, or when there are more than
    ``MAX_ALLOW`` distinct addresses.
    """
    if hosts is None:
        return None
    packed: dict[bytes, None] = {}  # ordered and without repeats
    for h in hosts:
        try:
            packed[ipaddress.IPv4Address(h).packed] = None
        except ValueError:
            raise ValueError(f"allow-list entry {h!r} is not an IPv4 address") from None
    if len(packed) > MAX_ALLOW:
        raise ValueError(f"allow-list of {len(packed)} addresses, at most {MAX_ALLOW}")
    return b"".join(packed)


def check_key(key: bytes | None) -> bytes | None:
    """``key`` if it is None or a probe key of ``KEY_SIZE`` bytes."""
    if key is not None and (not isinstance(key, bytes) or len(key) != KEY_SIZE):
        raise ValueError(f"probe key must be {KEY_SIZE} bytes")
    return key


def respond(
    fd: int,
    stop_fd: int,
    timeout_ms: int = -1,
    max_packets: int = 0,
    spin_us: int = 0,
    params: TransformParams | None = None,
    allow: Iterable[str] | None = None,
    key: bytes | None = None,
) -> tuple[int, int, int, int]:
    """Answer probes on the bound UDP socket ``fd`` with the GIL released.

    Returns (served, ignored, refused, reason). Stops when ``stop_fd`` is readable (reason 0), after
    ``timeout_ms`` without a packet (1; -1 waits forever) or after ``max_packets`` answers (2; 0 is no
    limit). ``spin_us`` busy-polls that long after each answer. c_j is sent in the domain ``params``
    gives (default: this process's transform now). ``allow``: the IPv4 sources answered (None: any);
    ``key``: 16 bytes to answer only keyed probes with a valid tag. Refused counts requests from other
    sources or without a valid tag; ignored counts malformed datagrams.
    """
    require()
    on, skew_e12, offset = params if params is not None else transform_params()
    served, ignored, refused, reason = _extension().respond(
        fd, stop_fd, timeout_ms, max_packets, on, skew_e12, offset, spin_us, pack_allow(allow), check_key(key)
    )
    return int(served), int(ignored), int(refused), int(reason)


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of ``data`` under the 16-byte ``key``: the tag keyed probes carry (the C code's)."""
    return int(_extension().siphash24(key, data))


def initiate(
    fd: int,
    host: str,
    port: int,
    count: int,
    probe_id: int,
    timeout_ms: int,
    gap_us: int,
    spin: bool,
    key: bytes | None = None,
) -> tuple[np.ndarray, int, int]:
    """Send ``count`` probes from the UDP socket ``fd`` to host:port with the GIL released.

    Returns (rows, lost, ignored): rows is an int64 array of ``ROW_FIELDS`` columns per answered probe,
    [seq, c_i, c_j, c_k, ns_i], c_i and c_k in this process's domain, c_j in the responder's, ns_i the
    CLOCK_MONOTONIC_RAW ns read just before c_i. With ``key`` (16 bytes) the probes are keyed and a reply
    without a valid tag is ignored.
    """
    require()
    data, lost, ignored = _extension().initiate(
        fd, host, port, count, probe_id, timeout_ms, gap_us, spin, check_key(key)
    )
    rows = np.frombuffer(data, dtype=np.int64).reshape(-1, ROW_FIELDS).copy()
    if native_tsc.clock.virtual() is not None:
        # Exact Python integers: the product of a counter value and the skew overflows int64.
        tf = native_tsc.transform
        for col in (1, 3):
            rows[:, col] = np.fromiter((tf(int(v)) for v in rows[:, col]), dtype=np.int64, count=len(rows))
    return rows, int(lost), int(ignored)
