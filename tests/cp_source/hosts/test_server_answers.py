"""Every answer of a factory host's segment server has the keys its TypedDict documents (real spool,
real server over ZeroMQ on loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import zmq

from cp_source.hosts.segment_client import ask_servers, fetch_segment
from cp_source.hosts.segment_server import SegmentServer, SpoolControl
from cp_source.hosts.server_answers import (
    CommittedAnswer,
    ErrorAnswer,
    LatestAnswer,
    ReadyAnswer,
    ReadyCommitAnswer,
    ReadyPlanAnswer,
    SegmentHeader,
    StatsAnswer,
)
from cp_source.spool.segments import Spool
from cp_source.wire.workload_id import identify
from tests.helpers.filled_spool import fill_spool
from tests.helpers.typed_keys import assert_keys


def _raw(endpoint: str, request: dict[str, Any]) -> list[bytes]:
    ctx = zmq.Context.instance()
    with ctx.socket(zmq.REQ) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(orjson.dumps(request))
        assert sock.poll(10_000), f"no answer to {request}"
        return sock.recv_multipart()


def test_each_answer_has_its_documented_keys(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    ids = fill_spool(root, {"w0": [5, 3], "w1": [4]})
    spool = Spool(str(root))
    control = SpoolControl(spool, identify("ysb", None))
    server = SegmentServer(control.lookup, root, control=control)
    try:
        ep = server.endpoint
        latest = ask_servers({ep: {"op": "latest"}}, 10.0, zmq.Context.instance())[ep]
        assert_keys(latest, LatestAnswer, "latest")
        sid = latest["spool"]
        assert {w: len(v["segments"]) for w, v in latest["workers"].items()} == {"w0": 2, "w1": 1}
        assert_keys(_json(ep, {"op": "plan", "spool": sid, "offsets": {"w0": 0}}), CommittedAnswer, "plan")
        ready = _json(ep, {"op": "ready", "spool": sid, "floor": 0, "timeout": 1})
        assert_keys(ready, ReadyAnswer, "ready")
        span = {"spool": sid, "lo": 0, "hi": ready["frontier"], "offsets": {"w0": 1, "w1": 0}}
        assert_keys(_json(ep, {"op": "ready_plan", **span}), ReadyPlanAnswer, "ready_plan")
        commit = {"spool": sid, "frontier": ready["frontier"], "offsets": {"w0": 0}}
        assert_keys(_json(ep, {"op": "ready_commit", **commit}), ReadyCommitAnswer, "ready_commit")
        done = _json(ep, {"op": "commit", "spool": sid, "offsets": {"w1": 0}})
        assert_keys(done, CommittedAnswer, "commit")
        assert_keys(_json(ep, {"op": "commit", "spool": "0" * 8, "offsets": {}}), ErrorAnswer, "refused")
        head, body = _raw(ep, {"op": "segment", "worker": "w0", "number": 1})
        assert_keys(orjson.loads(head), SegmentHeader, "segment")
        assert orjson.loads(head)["rows"] == 3 and fetch_segment(ep, "w0", 1) == body and len(ids) == 12
        assert_keys(_json(ep, {"op": "segment", "worker": "w0", "number": 9}), ErrorAnswer, "missing")
        stats = _json(ep, {"op": "stats"})
        assert_keys(stats, StatsAnswer, "stats")
        assert stats["segments_served"] == 2 and stats["control_errors"] == 1
    finally:
        server.stop()


def _json(endpoint: str, request: dict[str, Any]) -> Any:
    (frame,) = _raw(endpoint, request)
    return orjson.loads(frame)
