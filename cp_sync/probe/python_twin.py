"""Pure-Python probe loops: the twin of ``cp_sync.probe.native`` (same API, same wire format as the C loops).

The comparison baseline for the C-timed probes, and the labelled path for a
process on the pure-Python clock. Between the send and receive stamps runs the
interpreter, so its round trips include Python overhead. Stamps come from
``native_tsc.now()``, so they are already in this process's domain.
"""

from __future__ import annotations

import ipaddress
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import Self

import numpy as np

import native_tsc
from cp_sync.probe.api import ProbeResult, initiator_address
from cp_sync.probe.background import StartedInWith, start_daemon
from native_tsc import probe_loops

LABEL = "python"

_PACKET = struct.Struct("<IBBHIIQq")  # magic, version, type, 0, seq, 0, probe id, stamp
_TAG = struct.Struct("<Q")  # keyed packets: SipHash-2-4 of the 32 bytes before it
_MAGIC = 0x42525043
_VERSION, _VERSION_KEYED = 1, 2
_REQUEST, _REPLY = 1, 2
_KEYED_SIZE = _PACKET.size + _TAG.size
_RECV = _KEYED_SIZE + 1  # one byte more, so an oversized datagram shows as the wrong size
_M64 = (1 << 64) - 1

__all__ = ["LABEL", "ProbeResult", "Responder", "initiate", "siphash24"]


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def _rounds(v: list[int], n: int) -> None:
    v0, v1, v2, v3 = v
    for _ in range(n):
        v0 = (v0 + v1) & _M64
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _M64
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _M64
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _M64
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    v[:] = v0, v1, v2, v3


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of ``data`` under the 16-byte ``key`` (the twin of the C tag of keyed probes)."""
    if len(key) != probe_loops.KEY_SIZE:
        raise ValueError(f"SipHash key must be {probe_loops.KEY_SIZE} bytes")
    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    full = len(data) - len(data) % 8
    # The leftover bytes, and the length's low byte in the top byte, make the last block.
    last = int.from_bytes(data[full:], "little") | ((len(data) & 0xFF) << 56)
    for m in [*struct.unpack_from(f"<{full // 8}Q", data), last]:
        v[3] ^= m
        _rounds(v, 2)
        v[0] ^= m
    v[2] ^= 0xFF
    _rounds(v, 4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def _seal(body: bytes, key: bytes | None) -> bytes:
    """A packet as sent: the 32 bytes, with their tag when keyed."""
    return body if key is None else body + _TAG.pack(siphash24(key, body))


def _unseal(data: bytes, key: bytes | None) -> tuple[int, ...] | None:
    """The fields of a packet of this side's version (its tag valid when keyed), or None."""
    size, version = (_PACKET.size, _VERSION) if key is None else (_KEYED_SIZE, _VERSION_KEYED)
    if len(data) != size:
        return None
    fields = _PACKET.unpack_from(data)
    if fields[0] != _MAGIC or fields[1] != version:
        return None
    if key is not None and _TAG.unpack_from(data, _PACKET.size)[0] != siphash24(key, data[: _PACKET.size]):
        return None
    return fields


class Responder(StartedInWith):
    """Pure-Python responder thread (stamps c_j with native_tsc.now() after each receive).

    ``allow`` and ``key`` as the C responder's: the IPv4 sources answered (None: any) and a 16-byte key
    for keyed probes; ``refused`` counts requests from other sources or without a valid tag.
    """

    def __init__(
        self,
        bind: str = "127.0.0.1",
        port: int = 0,
        *,
        allow: Iterable[str] | None = None,
        key: bytes | None = None,
    ) -> None:
        self._allow = self._allow_set(allow)
        self._key = probe_loops.check_key(key)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((bind, port))
        self._sock.settimeout(0.1)  # how often the loop looks at the stop flag
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.served = 0
        self.ignored = 0
        self.refused = 0

    @staticmethod
    def _allow_set(hosts: Iterable[str] | None) -> frozenset[str] | None:
        packed = probe_loops.pack_allow(hosts)  # the C responder's checks and limit
        if packed is None:
            return None
        return frozenset(socket.inet_ntoa(packed[i : i + 4]) for i in range(0, len(packed), 4))

    def set_allowed(self, hosts: Iterable[str] | None) -> None:
        """Answer only these IPv4 sources from now on (None: any)."""
        self._allow = self._allow_set(hosts)

    def set_key(self, key: bytes | None) -> None:
        """Answer only probes tagged with this 16-byte key from now on (None: unkeyed probes)."""
        self._key = probe_loops.check_key(key)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the responder listens on."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    def start(self) -> Self:
        """Start answering in a daemon thread."""
        self._thread = start_daemon(self._loop, "cp-sync-pyresponder")
        return self

    def _loop(self) -> None:
        now, sock, pack = native_tsc.now, self._sock, _PACKET.pack
        while not self._stop.is_set():
            try:
                data, src = sock.recvfrom(_RECV)
            except TimeoutError:
                continue
            except OSError:
                return
            c_j = now()
            allow, key = self._allow, self._key  # read once: set_allowed may swap them meanwhile
            if allow is not None and src[0] not in allow:
                self.refused += 1
                continue
            fields = _unseal(data, key)
            if fields is None or fields[2] != _REQUEST:
                # A well-formed request of the other version, or a bad tag, is refused; the rest ignored.
                self.refused += int(key is not None and _is_request(data))
                self.ignored += int(key is None or not _is_request(data))
                continue
            _, ver, _, _, seq, _, pid, _ = fields
            sock.sendto(_seal(pack(_MAGIC, ver, _REPLY, 0, seq, 0, pid, c_j), key), src)
            self.served += 1

    def close(self) -> None:
        """Stop the loop, join the thread and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self._sock.close()


def _await_reply(
    s: socket.socket,
    dst: tuple[str, int],
    seq: int,
    pid: int,
    deadline_ns: int,
    spin: bool,
    key: bytes | None,
) -> tuple[int | None, int, int]:
    """(c_k or None when the probe is lost, c_j, datagrams ignored) for the probe ``seq``."""
    ignored = 0
    while True:
        left = deadline_ns - time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        if left <= 0:
            return None, 0, ignored
        if not select.select([s], [], [], 0 if spin else left / 1e9)[0]:
            continue
        try:
            data, src = s.recvfrom(_RECV)
        except ConnectionRefusedError:  # an ICMP error for an earlier datagram, as the C loop skips it
            continue
        c_k = native_tsc.now()
        fields = _unseal(data, key) if src[:2] == dst else None
        if fields is None:
            ignored += 1
            continue
        _, _, typ, _, rseq, _, rpid, c_j = fields
        if typ != _REPLY or rpid != pid or rseq != seq:
            ignored += 1
            continue
        return c_k, c_j, ignored


def _is_request(data: bytes) -> bool:
    """Whether ``data`` is a well-formed request of either version (its tag unchecked)."""
    for size, version in ((_PACKET.size, _VERSION), (_KEYED_SIZE, _VERSION_KEYED)):
        if len(data) == size:
            magic, ver, typ = _PACKET.unpack_from(data)[:3]
            return magic == _MAGIC and ver == version and typ == _REQUEST
    return False


def _check(host: str, port: int, count: int, timeout_ms: int, gap_us: int) -> None:
    # The same limits the C initiator enforces, with the same kind of error.
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"not an IPv4 address: {host}") from None
    if not 1 <= count <= probe_loops.MAX_PROBES:
        raise ValueError(f"probe count {count} out of range 1..{probe_loops.MAX_PROBES}")
    if not 1 <= port <= 65535 or timeout_ms < 1 or gap_us < 0:
        raise ValueError("invalid port, timeout or gap")


def initiate(
    host: str,
    port: int,
    count: int,
    timeout_ms: int = 200,
    gap_us: int = 50,
    spin: bool = False,
    bind: str | None = None,
    key: bytes | None = None,
) -> ProbeResult:
    """Send ``count`` probes to a responder from Python and return the answered ones (keyed with ``key``)."""
    _check(host, port, count, timeout_ms, gap_us)
    probe_loops.check_key(key)
    version = _VERSION if key is None else _VERSION_KEYED
    now, pack = native_tsc.now, _PACKET.pack
    pid = secrets.randbits(64)
    rows = np.zeros((count, probe_loops.ROW_FIELDS), dtype=np.int64)
    ok = lost = ignored = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(initiator_address(host, bind))
        dst = (host, port)
        for seq in range(count):
            req = _seal(pack(_MAGIC, version, _REQUEST, 0, seq, 0, pid, 0), key)
            ns_i = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
            c_i = now()
            try:
                s.sendto(req, dst)
            except ConnectionRefusedError:
                lost += 1
                continue
            c_k, c_j, skipped = _await_reply(s, dst, seq, pid, ns_i + timeout_ms * 1_000_000, spin, key)
            ignored += skipped
            if c_k is None:
                lost += 1
            else:
                rows[ok] = (seq, c_i, c_j, c_k, ns_i)
                ok += 1
            if gap_us and seq + 1 < count:
                time.sleep(gap_us / 1e6)
    return ProbeResult.from_rows(rows[:ok], lost, ignored)
