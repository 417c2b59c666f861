"""The offsets Spark keeps for this source: how they are built and read back, in one place.

Four forms, one per plan source of the stream reader (the JSON text is what a
checkpoint holds, so it never changes shape):

* a spool, ordering=arrival: ``{"spool": id, "w0": 12, "w1": 9}``;
* a spool, ordering=ready: ``{"spool": id, "frontier": F, "w0": 12, ...}``;
* factory hosts, ordering=arrival: ``{"factories": {spool id: {"w0": 12, ...}}}``;
* factory hosts, ordering=ready: ``{"frontier": F, "factories": {...}}``.

Workers are written in worker order and factories by spool id, so an offset's
text is stable. An offset read back is checked before anything is read or
deleted: one of another spool, another form or another ordering is refused
with one line (``SpoolMismatchError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from cp_source.spool.names import SPOOL_ID_RE, WIRE_WORKER_RE, WORKER_RE, worker_order

SPOOL_KEY = "spool"  # the offset key naming the spool; every other key is a worker (or the frontier)
FRONTIER_KEY = "frontier"  # ordering=ready: the event time (ms) the batch ends at
FACTORIES_KEY = "factories"  # over factory hosts: per factory spool id, its workers' positions
MAX_FACTORIES = 64

Positions = dict[str, int]  # worker -> segment number
HostPositions = dict[str, dict[str, int]]  # factory spool id -> worker -> segment number


def _refuse(message: str) -> NoReturn:
    # the spool module (and pyarrow) only once an offset is refused: Spark's planner imports this one
    from cp_source.spool.segments import SpoolMismatchError

    raise SpoolMismatchError(message)


def _in_order(positions: Mapping[str, int]) -> Positions:
    return {w: int(positions[w]) for w in worker_order(positions)}


def spool_offset(spool_id: str, positions: Mapping[str, int]) -> dict[str, Any]:
    """A spool's arrival offset: the spool id first, then each worker's segment number in order."""
    return {SPOOL_KEY: spool_id, **_in_order(positions)}


def spool_ready_offset(spool_id: str, frontier: int, positions: Mapping[str, int]) -> dict[str, Any]:
    """A spool's ready offset: the spool id, the frontier, then the workers in order."""
    return {SPOOL_KEY: spool_id, FRONTIER_KEY: int(frontier), **_in_order(positions)}


def hosts_offset(positions: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """An offset over factory hosts: factories by spool id, workers in order (a stable JSON text)."""
    return {FACTORIES_KEY: {sid: _in_order(pos) for sid, pos in sorted(positions.items())}}


def hosts_ready_offset(frontier: int, positions: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """A ready offset over factory hosts: the frontier, then ``hosts_offset``."""
    return {FRONTIER_KEY: int(frontier), **hosts_offset(positions)}


def check_ordering(offset: Mapping[str, Any], ordering: str) -> None:
    """Refuse an offset written with the other ``ordering`` (a ready offset has a frontier)."""
    was = "ready" if FRONTIER_KEY in offset else "arrival"
    if was != ordering:
        _refuse(
            f"the checkpoint's offsets were written with ordering={was}, this query reads with "
            f"ordering={ordering}: keep the ordering of a checkpoint, or start a new one"
        )


def frontier_of(offset: Mapping[str, Any]) -> int:
    """The frontier (ms) of a ready offset, checked to be an integer."""
    value = offset.get(FRONTIER_KEY)
    if isinstance(value, bool) or not isinstance(value, int):
        _refuse(f"offset frontier {value!r} is not an event time in ms")
    return value


def spool_positions(offset: Mapping[str, Any], spool_id: str, spool: str) -> Positions:
    """Per-worker segment numbers of an offset of spool ``spool_id``; another spool's is refused.

    ``spool`` is the spool's path, for the message. Raises SpoolMismatchError, one line.
    """
    if not isinstance(offset, Mapping):
        _refuse(f"offset {offset!r} is not a cloudprofiler offset")
    got = offset.get(SPOOL_KEY)
    if got is None:
        _refuse(
            f"offset {dict(offset)} names no spool (a checkpoint of an earlier cloudprofiler version "
            f"or of another source); spool {spool} is {spool_id}: start the query with a new checkpoint"
        )
    if got != spool_id:
        _refuse(
            f"the checkpoint's offsets are of spool {got}, but spool {spool} is {spool_id}: "
            f"use the checkpoint with its own spool, or a new checkpoint; nothing was read or deleted"
        )
    positions = {}
    for key, value in offset.items():
        if key in (SPOOL_KEY, FRONTIER_KEY):
            continue
        if not WORKER_RE.match(str(key)) or isinstance(value, bool) or not isinstance(value, int):
            _refuse(f"offset entry {key!r}: {value!r} is not a worker's segment number")
        positions[str(key)] = value
    return positions


def hosts_positions(offset: Any, ordering: str = "arrival") -> HostPositions:
    """Per factory spool id, per worker segment numbers of an offset over factory hosts; another
    kind is refused (one of a query without factories, or written with the other ``ordering``)."""
    if not isinstance(offset, Mapping) or FACTORIES_KEY not in offset:
        _refuse(
            f"offset {offset!r} is not an offset over factories (a checkpoint of a query without "
            f"factories=...): start the query with a new checkpoint; nothing was read or deleted"
        )
    check_ordering(offset, ordering)
    body = offset[FACTORIES_KEY]
    if not isinstance(body, Mapping) or len(body) > MAX_FACTORIES:
        _refuse(f"offset factories {body!r} is not a map of spool ids")
    out: HostPositions = {}
    for sid, pos in body.items():
        if not isinstance(sid, str) or not SPOOL_ID_RE.match(sid) or not isinstance(pos, Mapping):
            _refuse(f"offset entry {sid!r} is not a factory's spool id and positions")
        for w, n in pos.items():
            if not WIRE_WORKER_RE.match(str(w)) or isinstance(n, bool) or not isinstance(n, int) or n < -1:
                _refuse(f"offset entry {sid}/{w!r}: {n!r} is not a segment number")
        out[sid] = {str(w): int(n) for w, n in pos.items()}
    return out


def hosts_ready_positions(offset: Any) -> tuple[int, HostPositions]:
    """The frontier and per-factory positions of a ready offset over factory hosts; others refused."""
    positions = hosts_positions(offset, "ready")
    return frontier_of(offset), positions
