"""Pure-Python probe loops: the twin of ``cp_sync.probe`` (same API, same wire format as the C loops).

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

import numpy as np

import native_tsc
from cp_sync.probe_api import ProbeResult
from native_tsc import probe_loops

LABEL = "python"

_PACKET = struct.Struct("<IBBHIIQq")  # magic, version, type, 0, seq, 0, probe id, stamp
_MAGIC = 0x42525043
_VERSION = 1
_REQUEST, _REPLY = 1, 2
_RECV = _PACKET.size + 1  # one byte more, so an oversized datagram shows as the wrong size

__all__ = ["LABEL", "ProbeResult", "Responder", "initiate"]


class Responder:
    """Pure-Python responder thread (stamps c_j with native_tsc.now() after each receive)."""

    def __init__(self, bind: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((bind, port))
        self._sock.settimeout(0.1)  # how often the loop looks at the stop flag
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.served = 0
        self.ignored = 0

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the responder listens on."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    def start(self) -> Responder:
        """Start answering in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="cp-sync-pyresponder", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        now, sock, unpack, pack = native_tsc.now, self._sock, _PACKET.unpack, _PACKET.pack
        while not self._stop.is_set():
            try:
                data, src = sock.recvfrom(_RECV)
            except TimeoutError:
                continue
            except OSError:
                return
            c_j = now()
            if len(data) != _PACKET.size:
                self.ignored += 1
                continue
            magic, ver, typ, _, seq, _, pid, _ = unpack(data)
            if magic != _MAGIC or ver != _VERSION or typ != _REQUEST:
                self.ignored += 1
                continue
            sock.sendto(pack(_MAGIC, _VERSION, _REPLY, 0, seq, 0, pid, c_j), src)
            self.served += 1

    def close(self) -> None:
        """Stop the loop, join the thread and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> Responder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _await_reply(
    s: socket.socket, dst: tuple[str, int], seq: int, pid: int, deadline_ns: int, spin: bool
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
        if src[:2] != dst or len(data) != _PACKET.size:
            ignored += 1
            continue
        magic, ver, typ, _, rseq, _, rpid, c_j = _PACKET.unpack(data)
        if magic != _MAGIC or ver != _VERSION or typ != _REPLY or rpid != pid or rseq != seq:
            ignored += 1
            continue
        return c_k, c_j, ignored


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
) -> ProbeResult:
    """Send ``count`` probes to a responder from Python and return the answered ones."""
    _check(host, port, count, timeout_ms, gap_us)
    now, pack = native_tsc.now, _PACKET.pack
    pid = secrets.randbits(64)
    rows = np.zeros((count, probe_loops.ROW_FIELDS), dtype=np.int64)
    ok = lost = ignored = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((bind or ("127.0.0.1" if host.startswith("127.") else "0.0.0.0"), 0))
        dst = (host, port)
        for seq in range(count):
            req = pack(_MAGIC, _VERSION, _REQUEST, 0, seq, 0, pid, 0)
            ns_i = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
            c_i = now()
            try:
                s.sendto(req, dst)
            except ConnectionRefusedError:
                lost += 1
                continue
            c_k, c_j, skipped = _await_reply(s, dst, seq, pid, ns_i + timeout_ms * 1_000_000, spin)
            ignored += skipped
            if c_k is None:
                lost += 1
            else:
                rows[ok] = (seq, c_i, c_j, c_k, ns_i)
                ok += 1
            if gap_us and seq + 1 < count:
                time.sleep(gap_us / 1e6)
    return ProbeResult.from_rows(rows[:ok], lost, ignored)
