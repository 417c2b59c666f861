"""MinRTT probes timed in C (``native_tsc.probe_loops``): a UDP responder thread and an initiator call.

Each answered probe gives (c_i, c_j, c_k): c_i and c_k on the initiator, in its
domain; c_j on the responder, in the responder's domain. ``native_tsc.probe_loops``
applies each side's virtual transform (the initiator's after the loop, the
responder's in C before the reply leaves). The pure-Python twin with the same
API is ``cp_sync.probe.python_twin`` (``cp_sync.probe.api`` holds the shared Protocols).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable
from typing import Self

import native_tsc
from cp_sync.probe.api import ProbeResult, initiator_address
from cp_sync.probe.background import StartedInWith, start_daemon
from native_tsc import probe_loops

LABEL = "c"

__all__ = ["LABEL", "ProbeResult", "ProbeUnavailable", "Responder", "initiate", "require_c_backend"]


class ProbeUnavailable(probe_loops.ProbeLoopsUnavailable):
    """The C probe loops cannot be used in this process (the pure-Python clock, or no extension)."""


def require_c_backend() -> None:
    """Refuse to probe when the C loops cannot stamp this process's clock."""
    why = probe_loops.unavailable_reason()
    if why is not None:
        raise ProbeUnavailable(
            f"{why}; use cp_sync.probe.python_twin (pure-Python probes, labelled so) instead"
        )


class Responder(StartedInWith):
    """Answers probes on a UDP socket from a background thread (the loop runs in C without the GIL).

    ``allow``: the IPv4 sources it answers (None: any, for tests and benchmarks; an empty list: nobody).
    ``key``: 16 bytes to answer only keyed probes with a valid tag. ``set_allowed`` and ``set_key``
    change them while it runs. ``refused`` counts requests from other sources or without a valid tag.
    """

    def __init__(
        self,
        bind: str = "127.0.0.1",
        port: int = 0,
        spin_us: int = 2000,
        *,
        allow: Iterable[str] | None = None,
        key: bytes | None = None,
    ) -> None:
        require_c_backend()
        # Busy-poll this long after each answer: the rest of a burst skips the scheduler's wake-up.
        self.spin_us = spin_us
        self._allow = None if allow is None else tuple(allow)
        probe_loops.pack_allow(self._allow)  # refuse a bad list here, not in the thread
        self._key = probe_loops.check_key(key)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((bind, port))
        self._stop_r, self._stop_w = os.pipe()
        os.set_blocking(self._stop_r, False)
        self._thread: threading.Thread | None = None
        self._params: probe_loops.TransformParams | None = None
        self._cpu_done = 0  # CPU of the loop threads that have ended (each change of the lists ends one)
        self._lock = threading.Lock()
        self.served = 0
        self.ignored = 0
        self.refused = 0
        self.error: BaseException | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the responder listens on."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def allowed(self) -> tuple[str, ...] | None:
        """The sources answered now (None: any)."""
        return self._allow

    def cpu_ns(self) -> int | None:
        """CPU time the responder has used so far (its loop, including the busy-poll), or None."""
        t = self._thread
        if t is None or t.ident is None:
            return None
        try:
            return self._cpu_done + time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):  # the thread has ended, or no per-thread clocks here
            return None

    def start(self) -> Self:
        """Start answering in a daemon thread, in the virtual domain in force now."""
        self._params = native_tsc.clock.transform_params()
        self._launch()
        return self

    def _launch(self) -> None:
        params, allow, key = self._params, self._allow, self._key

        def loop() -> None:
            try:
                served, ignored, refused, _ = probe_loops.respond(
                    self._sock.fileno(),
                    self._stop_r,
                    spin_us=self.spin_us,
                    params=params,
                    allow=allow,
                    key=key,
                )
                self.served += served
                self.ignored += ignored
                self.refused += refused
            except BaseException as e:  # kept for close() to re-raise in the owner's thread
                self.error = e
            finally:
                self._cpu_done += time.thread_time_ns()

        self._thread = start_daemon(loop, "cp-sync-responder")

    def _halt(self) -> None:
        """Stop the loop thread and take back the stop byte, so a new loop can start on the same socket."""
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(5.0)
        self._thread = None
        with contextlib.suppress(BlockingIOError):
            os.read(self._stop_r, 64)

    def _reconfigure(self, allow: tuple[str, ...] | None, key: bytes | None) -> None:
        # The socket stays bound while the loop restarts: probes that arrive meanwhile wait in its buffer.
        with self._lock:
            running = self._thread is not None
            self._halt()
            self._allow, self._key = allow, key
            if running:
                self._launch()

    def set_allowed(self, hosts: Iterable[str] | None) -> None:
        """Answer only these IPv4 sources from now on (None: any); ValueError names a bad entry."""
        allow = None if hosts is None else tuple(hosts)
        probe_loops.pack_allow(allow)
        if allow != self._allow:
            self._reconfigure(allow, self._key)

    def set_key(self, key: bytes | None) -> None:
        """Answer only probes tagged with this 16-byte key from now on (None: unkeyed probes)."""
        if probe_loops.check_key(key) != self._key:
            self._reconfigure(self._allow, key)

    def close(self) -> None:
        """Stop the loop, join the thread and close the socket."""
        with self._lock:
            self._halt()
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stop_r = self._stop_w = -1
        self._sock.close()


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
    """Send ``count`` probes to a responder and return the answered ones, stamps in their domains.

    ``key``: 16 bytes to send keyed probes (for a responder given the same key); replies without a valid
    tag are ignored and counted.
    """
    require_c_backend()
    if not 1 <= count <= probe_loops.MAX_PROBES:
        raise ValueError(f"probe count {count} out of range 1..{probe_loops.MAX_PROBES}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(initiator_address(host, bind))
        rows, lost, ignored = probe_loops.initiate(
            s.fileno(), host, port, count, secrets.randbits(64), timeout_ms, gap_us, spin, key
        )
    return ProbeResult.from_rows(rows, lost, ignored)
