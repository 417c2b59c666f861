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

Requests are parsed and bounded by ``segment_protocol``; the clients that fetch and ask are in
``segment_client``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import zmq

from cp_common import curve_keys as ck
from cp_common.zmq_bounds import recv_bounded, while_serving
from cp_source.hosts.ready_ops import READY_OPS, ReadyControl
from cp_source.hosts.segment_protocol import (
    MAX_CONTROL_BYTES,
    MAX_LISTED,
    MAX_SEGMENT_BYTES,
    ControlRequest,
    SegmentRef,
    parse_request,
    validate_request,
)
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
from cp_source.wire.workload_id import WorkloadId
from cp_store.atomic_files import atomic_write

# Replies queued per peer: a REQ client has one request in flight, so a peer that sends many
# without reading only loses replies past this (counted as replies_dropped), never grows memory.
REPLY_HWM = 2
REQUEST_HWM = 64  # requests queued per peer before ZeroMQ stops reading its connection
MAX_FRAMES = 3  # identity, delimiter, request: frames past this are read and dropped
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
