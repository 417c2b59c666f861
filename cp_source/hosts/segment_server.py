"""Serve spool segments over ZeroMQ to executors that cannot see the spool directory.

The server runs next to the spool (in the driver-side stream reader process,
or beside a factory host's spool: ``cloudprofiler factory --serve``).
An executor sends one small JSON request naming a worker and a segment
number; the server looks the segment up in the spool's manifest (never by a
path taken from the request) and answers with a JSON header frame and the
segment's Arrow IPC bytes as they are on disk. Nothing read from the wire is
unpickled or evaluated, and every size is bounded.

On a factory host the server also answers the control ops a remote reader
needs (``SpoolControl``): ``latest`` (the spool id, and per worker the
committed and latest segment numbers with the rows and first tuple id of the
segments after a given position), ``commit`` and ``plan`` (the spool's own
``commit`` and ``mark_planned``, refused for another spool id), and the
``ordering=ready`` ops (``cp_source.hosts.ready_ops``). Each answer names the host's workload
(``cp_source.wire.workload_id``), so a query of another workload refuses the host at start.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import zmq

from cp_common import curve_keys as ck
from cp_common.zmq_bounds import recv_bounded, while_serving
from cp_source.hosts.ready_ops import READY_OPS, ReadyControl, event_ms, plan_after, sender_timeout
from cp_source.hosts.server_answers import (
    ControlAnswer,
    ErrorAnswer,
    LatestAnswer,
    ReadyAnswer,
    ReadyCommitAnswer,
    ReadyPlanAnswer,
    SegmentHeader,
    ServerStats,
    StatsAnswer,
    WorkerSegments,
    WorkloadFields,
)
from cp_source.spool.names import SPOOL_ID_RE, WIRE_WORKER_RE
from cp_source.wire.workload_id import WorkloadId
from cp_store.atomic_files import atomic_write

# A request is a tiny JSON object; anything longer is refused by ZeroMQ itself.
MAX_REQUEST_BYTES = 512
# Replies queued per peer: a REQ client has one request in flight, so a peer that sends many
# without reading only loses replies past this (counted as replies_dropped), never grows memory.
REPLY_HWM = 2
REQUEST_HWM = 64  # requests queued per peer before ZeroMQ stops reading its connection
MAX_FRAMES = 3  # identity, delimiter, request: frames past this are read and dropped
# A segment larger than this is never sent (the factory writes far smaller ones).
MAX_SEGMENT_BYTES = 1 << 30
MAX_SEGMENT_NUMBER = 1 << 62
# A control request carries up to two offsets of 64 workers: it is bounded by the socket's frame size.
MAX_CONTROL_BYTES = MAX_REQUEST_BYTES * 16
MAX_OFFSET_WORKERS = 64
CONTROL_OPS = ("latest", "commit", "plan", *READY_OPS)
# A latest answer lists at most this many segments (about 40 bytes each); the reader asks again.
MAX_LISTED = 16_384
MAX_CONTROL_REPLY = 8 << 20  # what a control client accepts per frame
_OP_COUNTERS = {
    "latest": "latest_requests",
    "commit": "commits",
    "plan": "plans",
    "ready": "ready_requests",
    "ready_plan": "plans",
    "ready_commit": "commits",
}


def _refuse(why: str) -> list[bytes]:
    return [orjson.dumps(ErrorAnswer(ok=False, error=why))]


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


class SpoolControl:
    """The control ops of a factory host, answered through the spool's own methods (``Spool``).

    Used by the server's one thread only (a ``Spool`` caches manifests and is not thread-safe).
    """

    def __init__(self, spool: Any, workload: WorkloadId | None = None) -> None:
        self.spool = spool
        self.ready = ReadyControl(spool)
        # said in every answer
        self.workload = cast(WorkloadFields, workload.to_json()) if workload is not None else None

    def lookup(self, worker: str, number: int) -> SegmentRef | None:
        """A published, uncommitted segment of this spool (the manifest's own facts)."""
        if worker not in self.spool.workers():
            return None
        for seg in self.spool.segments(worker, number - 1, number):
            if seg.number == number:
                return SegmentRef(seg.path, seg.rows, seg.nbytes)
        return None

    def answer(self, req: ControlRequest) -> ControlAnswer:
        """The reply to one control op (never raises for a bad request: an error reply instead),
        with this host's workload: a query of another workload refuses it at start."""
        reply = self._answer_op(req)
        if self.workload is not None and reply["ok"]:
            reply["workload"] = self.workload
        return reply

    def _answer_op(self, req: ControlRequest) -> ControlAnswer:
        sid = self.spool.ensure_spool_id()
        if req.op == "latest":
            return self._latest(sid, req.offsets)
        if req.op == "ready" and req.spool is None:  # the first ask of a query: it learns the id here
            req = ControlRequest(req.op, sid, req.offsets, req.args)
        if req.spool != sid:
            return {
                "ok": False,
                "error": f"{req.op} for spool {req.spool}, but this factory's spool is {sid}: "
                "nothing changed",
            }
        latest = self.spool.latest()
        for w, n in req.offsets.items():
            if n > latest.get(w, -1):
                return {
                    "ok": False,
                    "error": f"{req.op} {w}={n} is beyond the latest published segment {latest.get(w, -1)}",
                }
        if req.op in READY_OPS:
            return self._ready(sid, req)
        if req.op == "commit":
            self.spool.commit(req.offsets, sid)
        else:
            self.spool.mark_planned(req.offsets, sid)
        return {"ok": True, "spool": sid, "committed": self.spool.committed()}

    def _ready(self, sid: str, req: ControlRequest) -> ReadyAnswer | ReadyPlanAnswer | ReadyCommitAnswer:
        a = req.args
        if req.op == "ready":
            return self.ready.ready(sid, a["floor"], a["timeout"], req.offsets, a["cap"])
        if req.op == "ready_plan":
            return self.ready.plan(sid, a["lo"], a["hi"], req.offsets, a["after"])
        return self.ready.commit(sid, a["frontier"], req.offsets, a["since"])

    def _latest(self, sid: str, after: dict[str, int]) -> LatestAnswer:
        """Per worker: committed, latest (gapless, as the local reader's latestOffset), and the segments
        after ``after[w]`` (default: the committed one) as [number, rows, first tuple id]."""
        committed = self.spool.committed()
        latest = self.spool.latest()
        workers = self.spool.workers()
        cap = MAX_LISTED // max(1, len(workers))
        out: dict[str, WorkerSegments] = {}
        for w in workers:
            start = after.get(w, committed.get(w, -1))
            segs = self.spool.segments(w, start, latest.get(w, -1))[:cap]
            out[w] = {
                "committed": committed.get(w, -1),
                "latest": latest.get(w, -1),
                "segments": [[s.number, s.rows, s.tuple_id_min] for s in segs],
            }
        return {"ok": True, "spool": sid, "workers": out}


@dataclass(frozen=True)
class ControlRequest:
    """A validated control op: ``offsets`` is ``after`` for latest and ready, the end offset for
    commit, plan, ready_plan and ready_commit; ``args``: the ready ops' other fields, checked."""

    op: str
    spool: str | None
    offsets: dict[str, int]
    args: dict[str, Any] = field(default_factory=dict)


def _offsets_field(value: Any, name: str) -> dict[str, int]:
    """A ``{"w0": n, ...}`` map from the wire: worker names, -1 <= n < 2**62, at most 64 workers."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not an object")
    if len(value) > MAX_OFFSET_WORKERS:
        raise ValueError(f"{name} names more than {MAX_OFFSET_WORKERS} workers")
    out = {}
    for worker, number in value.items():
        if not isinstance(worker, str) or not WIRE_WORKER_RE.match(worker):
            raise ValueError(f"{name}: bad worker name")
        if isinstance(number, bool) or not isinstance(number, int) or not -1 <= number < MAX_SEGMENT_NUMBER:
            raise ValueError(f"{name}: bad segment number")
        out[worker] = number
    return out


def _json_request(raw: bytes, limit: int) -> Any:
    """The request frame's JSON value, parsed once; ValueError when too large or not JSON."""
    if len(raw) > limit:
        raise ValueError("request too large")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError("request is not JSON") from e


def parse_request(raw: bytes) -> tuple[str, str | None, int | None] | ControlRequest:
    """A segment or stats request (as ``validate_request``) or a control op; ValueError when malformed."""
    msg = _json_request(raw, MAX_CONTROL_BYTES)
    if not isinstance(msg, dict) or msg.get("op") not in CONTROL_OPS:
        if len(raw) > MAX_REQUEST_BYTES:
            raise ValueError("request too large")
        return _segment_request(msg)
    op = msg["op"]
    spool = msg.get("spool")
    if op == "latest":
        after = msg.get("after", {})
        return ControlRequest(op, None, _offsets_field(after, "after"))
    if op == "ready" and spool is None:
        return _ready_request(msg, None)
    if not isinstance(spool, str) or not SPOOL_ID_RE.match(spool):
        raise ValueError("bad spool id")
    if op in READY_OPS:
        return _ready_request(msg, spool)
    return ControlRequest(op, spool, _offsets_field(msg.get("offsets"), "offsets"))


def _ready_request(msg: dict[str, Any], spool: str | None) -> ControlRequest:
    """A ready op's fields, each checked and bounded (``cp_source.hosts.ready_ops``)."""
    op = msg["op"]
    args: dict[str, Any]
    if op == "ready":
        cap = msg.get("cap")
        args = {
            "floor": event_ms(msg.get("floor"), "floor"),
            "timeout": sender_timeout(msg.get("timeout")),
            "cap": None if cap is None else _offsets_field(cap, "cap"),
        }
        return ControlRequest(op, spool, _offsets_field(msg.get("after", {}), "after"), args)
    if op == "ready_plan":
        lo, hi = event_ms(msg.get("lo"), "lo"), event_ms(msg.get("hi"), "hi")
        if hi < lo:
            raise ValueError("hi is below lo")
        args = {"lo": lo, "hi": hi, "after": plan_after(msg.get("after"))}
        return ControlRequest(op, spool, _offsets_field(msg.get("offsets"), "offsets"), args)
    since = msg.get("since")
    args = {
        "frontier": event_ms(msg.get("frontier"), "frontier"),
        "since": None if since is None else event_ms(since, "since"),
    }
    return ControlRequest(op, spool, _offsets_field(msg.get("offsets"), "offsets"), args)


def validate_request(raw: bytes) -> tuple[str, str | None, int | None]:
    """Parse a request frame into (op, worker, number); raise ValueError when it is malformed."""
    return _segment_request(_json_request(raw, MAX_REQUEST_BYTES))


def _segment_request(msg: Any) -> tuple[str, str | None, int | None]:
    if not isinstance(msg, dict):
        raise ValueError("request is not a JSON object")
    op = msg.get("op")
    if op == "stats":
        return "stats", None, None
    if op != "segment":
        raise ValueError("unknown op")
    worker = msg.get("worker")
    number = msg.get("number")
    if not isinstance(worker, str) or not WIRE_WORKER_RE.match(worker):
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
        control: SpoolControl | None = None,
    ) -> None:
        self._lookup = lookup
        self._control = control
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
            "latest_requests": 0,
            "commits": 0,
            "plans": 0,
            "ready_requests": 0,
            "control_errors": 0,
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
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_BYTES)  # per frame; frames: recv_bounded
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

    def stats(self) -> ServerStats:
        """Counters of what was served so far (and, on a factory host, which spool it serves)."""
        with self._lock:
            out = cast(ServerStats, dict(self._counters, endpoint=self.endpoint))
        if self._control is not None:
            out["spool"] = self._control.spool.spool_id()
        return out

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

    def _answer_control(self, req: ControlRequest) -> list[bytes]:
        assert self._control is not None
        self._count(**{_OP_COUNTERS[req.op]: 1})
        try:
            reply = self._control.answer(req)
        except (OSError, ValueError) as e:  # a full disk, a spool replaced under the server
            reply = ErrorAnswer(ok=False, error=f"{req.op}: {e}")
        if not reply["ok"]:
            self._count(control_errors=1)
        return [orjson.dumps(reply)]

    def _answer(self, raw: bytes) -> list[bytes]:
        try:
            if self._control is None:
                req: tuple[str, str | None, int | None] | ControlRequest = validate_request(raw)
            else:
                req = parse_request(raw)
        except ValueError as e:
            self._count(rejected=1)
            return _refuse(str(e))
        if isinstance(req, ControlRequest):
            return self._answer_control(req)
        op, worker, number = req
        if op == "stats":
            return [orjson.dumps(StatsAnswer(ok=True, **self.stats()))]
        assert worker is not None and number is not None
        ref = self._lookup(worker, number)
        if ref is None:
            self._count(missing=1)
            return _refuse(f"segment {worker}/{number} not in the spool")
        path = Path(ref.path).resolve()
        # The manifest is trusted, but a path outside the spool is never served.
        if not path.is_relative_to(self._root):
            self._count(rejected=1)
            return _refuse("segment outside the spool")
        try:
            size = path.stat().st_size
            if size > MAX_SEGMENT_BYTES:
                raise OSError("segment too large to serve")
            body = path.read_bytes()
        except OSError as e:
            self._count(missing=1)
            return _refuse(f"segment {worker}/{number}: {e.strerror or e}")
        return [orjson.dumps(SegmentHeader(ok=True, rows=ref.rows, nbytes=len(body))), body]

    def _serve(self) -> None:
        for _ in while_serving(self._sock, self._stop):
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
    sock, watch = None, None
    try:
        sock, watch = ck.client_socket(ctx, max_bytes + 4096, curve_keys)
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
        if sock is not None:
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


def ask_servers(
    requests: dict[str, dict[str, Any]],
    timeout: float,
    ctx: zmq.Context,
    curve_keys: str | None = None,
) -> dict[str, dict[str, Any] | str]:
    """Send one request to each server at once and wait at most ``timeout`` s for all the answers.

    Returns per endpoint the answer (a JSON object with ``ok`` true) or one line saying why there is
    none: no answer in time (a host that is down, stopped or cut off), an error answer, or a
    malformed one. Each request gets a fresh REQ socket, so a late answer is never taken for the
    next request's.
    """
    socks: dict[str, tuple[zmq.Socket, ck.HandshakeWatch]] = {}
    out: dict[str, dict[str, Any] | str] = {}
    poller = zmq.Poller()
    try:
        for endpoint, req in requests.items():
            socks[endpoint] = ck.client_socket(ctx, MAX_CONTROL_REPLY, curve_keys)
            sock = socks[endpoint][0]
            sock.connect(endpoint)
            sock.send(orjson.dumps(req), zmq.NOBLOCK)
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        waiting = {sock: ep for ep, (sock, _) in socks.items()}
        while waiting and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(max(1, int(left * 1000))):
                endpoint = waiting.pop(sock)
                out[endpoint] = _control_reply(endpoint, sock.recv_multipart())
                poller.unregister(sock)
        for endpoint in waiting.values():
            hint = ck.refusal_hint(socks[endpoint][1], bool(curve_keys))
            out[endpoint] = f"no answer from {endpoint} within {timeout:g} s{hint}"
    finally:
        for sock, watch in socks.values():
            watch.close()
            sock.close(0)
    return out


def _control_reply(endpoint: str, frames: list[bytes]) -> dict[str, Any] | str:
    """A control answer as a dict when it is a well-formed ``ok`` one, else one line saying why not."""
    if len(frames) != 1:
        return f"malformed answer from {endpoint}"
    try:
        head = orjson.loads(frames[0])
    except orjson.JSONDecodeError:
        return f"malformed answer from {endpoint}"
    if not isinstance(head, dict):
        return f"malformed answer from {endpoint}"
    if not head.get("ok"):
        return f"{endpoint}: {head.get('error', 'refused')}"
    return head
