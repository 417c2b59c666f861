"""Serve spool segments over ZeroMQ to executors that cannot see the spool directory.

The server runs next to the spool (in the driver-side stream reader process).
An executor sends one small JSON request naming a worker and a segment
number; the server looks the segment up in the spool's manifest (never by a
path taken from the request) and answers with a JSON header frame and the
segment's Arrow IPC bytes as they are on disk. Nothing read from the wire is
unpickled or evaluated, and every size is bounded.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zmq

from cp_source.private_dirs import atomic_write
from native_tsc import curve_keys as ck
from native_tsc.zmq_bounds import recv_bounded

# A request is a tiny JSON object; anything longer is refused by ZeroMQ itself.
MAX_REQUEST_BYTES = 512
# Replies queued per peer: a REQ client has one request in flight, so a peer that sends many
# without reading only loses replies past this (counted as replies_dropped), never grows memory.
REPLY_HWM = 2
REQUEST_HWM = 64  # requests queued per peer before ZeroMQ stops reading its connection
MAX_FRAMES = 3  # identity, delimiter, request: frames past this are read and dropped
# A segment larger than this is never sent (the factory writes far smaller ones).
MAX_SEGMENT_BYTES = 1 << 30
WORKER_NAME = re.compile(r"^w[0-9]{1,4}$")
MAX_SEGMENT_NUMBER = 1 << 62


class FetchError(RuntimeError):
    """A segment could not be fetched from the segment server."""


@dataclass(frozen=True)
class SegmentRef:
    """Where one segment lives: the spool path and its manifest facts."""

    path: str
    rows: int
    nbytes: int


# Looks up (worker, number) in the spool; returns None when it is unknown or already committed.
Lookup = Callable[[str, int], SegmentRef | None]


def validate_request(raw: bytes) -> tuple[str, str | None, int | None]:
    """Parse a request frame into (op, worker, number); raise ValueError when it is malformed."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise ValueError("request too large")
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError("request is not JSON") from e
    if not isinstance(msg, dict):
        raise ValueError("request is not a JSON object")
    op = msg.get("op")
    if op == "stats":
        return "stats", None, None
    if op != "segment":
        raise ValueError("unknown op")
    worker = msg.get("worker")
    number = msg.get("number")
    if not isinstance(worker, str) or not WORKER_NAME.match(worker):
        raise ValueError("bad worker name")
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < MAX_SEGMENT_NUMBER:
        raise ValueError("bad segment number")
    return "segment", worker, number


class SegmentServer:
    """A ROUTER socket on a background thread answering segment requests from a spool.

    ``bind`` is ``tcp://HOST:PORT`` (port ``*`` or 0 picks a free one); the
    default host is 127.0.0.1 so nothing is exposed unless asked for.
    ``advertise_host`` is the host name executors use to connect (defaults to
    the bind host, or this machine's name when bound to all interfaces).
    """

    def __init__(
        self,
        lookup: Lookup,
        root: str | os.PathLike[str],
        bind: str = "tcp://127.0.0.1:*",
        advertise_host: str | None = None,
        stats_path: str | os.PathLike[str] | None = None,
        curve_keys: str | None = None,
    ) -> None:
        self._lookup = lookup
        self._root = Path(root).resolve()
        self._stats_path = Path(stats_path) if stats_path is not None else None
        self._ctx = zmq.Context()
        self._sock = self._make_socket(bind, curve_keys)
        bound = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        host, port = bound.rsplit(":", 1)
        host = host.removeprefix("tcp://")
        if advertise_host is None:
            advertise_host = os.uname().nodename if host in ("0.0.0.0", "*") else host
        self.endpoint = f"tcp://{advertise_host}:{port}"
        self.bound = bound
        self._lock = threading.Lock()
        self._counters = {
            "requests": 0,
            "segments_served": 0,
            "rows_served": 0,
            "bytes_served": 0,
            "rejected": 0,
            "missing": 0,
            "stats_write_errors": 0,
            "replies_dropped": 0,
            "failures": 0,
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cp-segment-server", daemon=True)
        self._thread.start()

    def _make_socket(self, bind: str, curve_keys: str | None) -> zmq.Socket:
        """The server's one socket, bound: every option bounding what a peer can make it hold is here.

        With ``curve_keys`` it speaks CURVE and accepts only the clients in ``DIR/authorized``.
        """
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES * 4)  # per frame; frames: recv_bounded
        sock.setsockopt(zmq.RCVHWM, REQUEST_HWM)
        sock.setsockopt(zmq.SNDHWM, REPLY_HWM)
        # a full peer pipe raises EAGAIN on a non-blocking send instead of a silent drop, so it is counted
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            if curve_keys:
                ck.server_secure(sock, curve_keys)
            sock.bind(bind[:-2] + ":*" if bind.endswith(":0") else bind)
        except BaseException:
            sock.close(0)
            ck.release(self._ctx)
            raise
        return sock

    def stats(self) -> dict[str, Any]:
        """Counters of what was served so far."""
        with self._lock:
            return dict(self._counters, endpoint=self.endpoint)

    def _count(self, **inc: int) -> None:
        with self._lock:
            for k, v in inc.items():
                self._counters[k] += v

    def _write_stats(self) -> None:
        """Replace the stats file; a failed write (a full disk) must not stop the serving thread."""
        if self._stats_path is None:
            return
        try:
            atomic_write(self._stats_path, orjson.dumps(self.stats()))  # a fresh temp name each time
        except OSError:
            self._count(stats_write_errors=1)

    def _answer(self, raw: bytes) -> list[bytes]:
        try:
            op, worker, number = validate_request(raw)
        except ValueError as e:
            self._count(rejected=1)
            return [orjson.dumps({"ok": False, "error": str(e)})]
        if op == "stats":
            return [orjson.dumps({"ok": True, **self.stats()})]
        assert worker is not None and number is not None
        ref = self._lookup(worker, number)
        if ref is None:
            self._count(missing=1)
            return [orjson.dumps({"ok": False, "error": f"segment {worker}/{number} not in the spool"})]
        path = Path(ref.path).resolve()
        # The manifest is trusted, but a path outside the spool is never served.
        if not path.is_relative_to(self._root):
            self._count(rejected=1)
            return [orjson.dumps({"ok": False, "error": "segment outside the spool"})]
        try:
            size = path.stat().st_size
            if size > MAX_SEGMENT_BYTES:
                raise OSError("segment too large to serve")
            body = path.read_bytes()
        except OSError as e:
            self._count(missing=1)
            return [orjson.dumps({"ok": False, "error": f"segment {worker}/{number}: {e.strerror or e}"})]
        return [orjson.dumps({"ok": True, "rows": ref.rows, "nbytes": len(body)}), body]

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                self._serve_one()
            except zmq.Again:
                continue
            except Exception:  # a bug must cost one request, never the server
                self._count(failures=1)

    def _serve_one(self) -> None:
        frames, extra = recv_bounded(self._sock, MAX_FRAMES)
        self._count(requests=1)
        # ROUTER framing from a REQ peer: identity, empty delimiter, request.
        if extra or len(frames) != 3 or frames[1] != b"":
            self._count(rejected=1)
            return
        reply = self._answer(frames[2])
        try:
            self._sock.send_multipart([frames[0], b"", *reply], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self._count(replies_dropped=1)  # the peer has REPLY_HWM replies it has not read
            return
        except zmq.ZMQError:
            return  # the peer went away; it will retry or fail its task
        if len(reply) == 2:  # counted once it is queued for the peer, not when it was dropped
            rows = orjson.loads(reply[0])["rows"]
            self._count(segments_served=1, rows_served=rows, bytes_served=len(reply[1]))
            self._write_stats()

    def stop(self) -> None:
        """Stop serving, write the final counters and close the socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._write_stats()
        self._sock.close(0)
        ck.release(self._ctx)  # the authenticator's socket would keep term() waiting
        self._ctx.term()


def fetch_segment(
    endpoint: str,
    worker: str,
    number: int,
    timeout: float = 30.0,
    max_bytes: int = MAX_SEGMENT_BYTES,
    ctx: zmq.Context | None = None,
    curve_keys: str | None = None,
) -> bytes:
    """Fetch one segment's Arrow IPC bytes from a segment server (``curve_keys``: a keys directory
    when the server runs with keys; a refused key fails with the handshake named)."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + 4096)
    watch = None
    try:
        if curve_keys:
            ck.client_secure(sock, curve_keys)
        watch = ck.HandshakeWatch(sock)
        sock.connect(endpoint)
        sock.send(orjson.dumps({"op": "segment", "worker": worker, "number": number}))
        deadline = time.monotonic() + timeout
        while not sock.poll(100):
            if time.monotonic() > deadline:
                raise FetchError(
                    f"no answer from segment server {endpoint} for {worker}/{number} within {timeout:.0f}s"
                    f"{ck.refusal_hint(watch, bool(curve_keys))}"
                )
        frames = sock.recv_multipart()
    finally:
        if watch is not None:
            watch.close()
        sock.close(0)
        if own:
            ctx.term()
    if not frames or len(frames[0]) > MAX_REQUEST_BYTES * 4:
        raise FetchError("malformed answer from segment server")
    head = orjson.loads(frames[0])
    if not isinstance(head, dict) or not head.get("ok"):
        err = head.get("error") if isinstance(head, dict) else "malformed answer"
        raise FetchError(f"segment server {endpoint}: {err}")
    if len(frames) != 2 or len(frames[1]) != head.get("nbytes"):
        raise FetchError("segment server answer has the wrong size")
    return frames[1]


def server_stats(endpoint: str, timeout: float = 10.0, curve_keys: str | None = None) -> dict[str, Any]:
    """Ask a running segment server for its counters."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if curve_keys:
            ck.client_secure(sock, curve_keys)
        sock.connect(endpoint)
        sock.send(orjson.dumps({"op": "stats"}))
        if not sock.poll(int(timeout * 1000)):
            raise FetchError(f"no answer from segment server {endpoint}")
        head = orjson.loads(sock.recv())
    finally:
        sock.close(0)
        ctx.term()
    return head
