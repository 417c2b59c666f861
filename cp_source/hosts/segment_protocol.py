"""The segment server's wire protocol: its bounds, and every request checked before it is served.

A request is one small JSON object: a segment fetch (``worker``, ``number``) or a control op
(``latest``, ``commit``, ``plan`` and the ``ordering=ready`` ops, with their offsets). Nothing
read from the wire is unpickled or evaluated; every size and count is bounded here, in one place,
for the server (``segment_server``) and its clients (``segment_client``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from cp_source.hosts.ready_ops import READY_OPS, event_ms, plan_after, sender_timeout
from cp_source.spool.names import SPOOL_ID_RE, WIRE_WORKER_RE

# A request is a tiny JSON object; anything longer is refused by ZeroMQ itself.
MAX_REQUEST_BYTES = 512
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


class FetchError(RuntimeError):
    """A segment could not be fetched from the segment server."""


@dataclass(frozen=True)
class SegmentRef:
    """Where one segment lives: the spool path and its manifest facts."""

    path: str
    rows: int
    nbytes: int


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
