"""MinRTT probes timed in C (native_tsc._probe): a UDP responder thread and an initiator call.

Each answered probe gives (c_i, c_j, c_k): c_i and c_k on the initiator, in its
domain; c_j on the responder, in the responder's domain. The C loops stamp raw
counter values; the initiator's are transformed here with this process's
virtual transform (native_tsc's exact integer arithmetic), the responder's in C
with the same transform before the reply leaves.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
from dataclasses import dataclass

import numpy as np

import native_tsc

_FALLBACK_PREFIX = "fallback"


class ProbeUnavailable(RuntimeError):
    """The C probe loops need the C clock backend."""


def require_c_backend() -> None:
    """Refuse to probe on the fallback clock: its counter is not the one the C loops read."""
    if native_tsc.BACKEND.startswith(_FALLBACK_PREFIX):
        raise ProbeUnavailable(
            f"C-timed probes need the native TSC backend, this process uses {native_tsc.BACKEND!r}; "
            "use cp_sync.pyprobe (pure-Python probes, labelled as such) instead"
        )


def _c_probe():  # imported lazily so the fallback path never needs the extension
    from native_tsc import _probe

    return _probe


def transform_params() -> tuple[bool, int, int]:
    """(virtual_on, skew_e12, offset) of this process's clock, for the C responder."""
    v = native_tsc.clock.virtual()
    return (False, 0, 0) if v is None else (True, v.skew_e12, v.offset)


@dataclass(frozen=True)
class ProbeResult:
    """Answered probes of one initiator -> responder run (int64 arrays, one entry per probe)."""

    seq: np.ndarray
    c_i: np.ndarray
    c_j: np.ndarray
    c_k: np.ndarray
    ns_i: np.ndarray
    lost: int
    ignored: int

    @property
    def rtt(self) -> np.ndarray:
        """Round trips in initiator cycles."""
        return self.c_k - self.c_i


class Responder:
    """Answers probes on a UDP socket from a background thread (the loop runs in C without the GIL)."""

    def __init__(self, bind: str = "127.0.0.1", port: int = 0, spin_us: int = 2000) -> None:
        require_c_backend()
        # Busy-poll this long after each answer: the rest of a burst skips the scheduler's wake-up.
        self.spin_us = spin_us
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((bind, port))
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None
        self.served = 0
        self.ignored = 0
        self.error: BaseException | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the responder listens on."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    def start(self) -> Responder:
        """Start answering in a daemon thread."""
        on, skew, off = transform_params()
        probe = _c_probe()

        def loop() -> None:
            try:
                self.served, self.ignored, _ = probe.respond(
                    self._sock.fileno(), self._stop_r, -1, 0, on, skew, off, self.spin_us
                )
            except BaseException as e:  # kept for close() to re-raise in the owner's thread
                self.error = e

        self._thread = threading.Thread(target=loop, name="cp-sync-responder", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the loop, join the thread and close the socket."""
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join(5.0)
            self._thread = None
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stop_r = self._stop_w = -1
        self._sock.close()

    def __enter__(self) -> Responder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def initiate(
    host: str,
    port: int,
    count: int,
    timeout_ms: int = 200,
    gap_us: int = 50,
    spin: bool = False,
    bind: str | None = None,
) -> ProbeResult:
    """Send ``count`` probes to a responder and return the answered ones, stamps in their domains."""
    require_c_backend()
    if not 1 <= count <= 1_000_000:
        raise ValueError(f"probe count {count} out of range 1..1000000")
    probe = _c_probe()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((bind or ("127.0.0.1" if host.startswith("127.") else "0.0.0.0"), 0))
        data, lost, ignored = probe.initiate(
            s.fileno(), host, port, count, secrets.randbits(64), timeout_ms, gap_us, spin
        )
    rows = np.frombuffer(data, dtype=np.int64).reshape(-1, probe.ROW_FIELDS)
    tf = native_tsc.clock.backend.transform
    c_i = np.fromiter((tf(int(v)) for v in rows[:, 1]), dtype=np.int64, count=len(rows))
    c_k = np.fromiter((tf(int(v)) for v in rows[:, 3]), dtype=np.int64, count=len(rows))
    return ProbeResult(
        seq=rows[:, 0].copy(),
        c_i=c_i,
        c_j=rows[:, 2].copy(),
        c_k=c_k,
        ns_i=rows[:, 4].copy(),
        lost=int(lost),
        ignored=int(ignored),
    )
