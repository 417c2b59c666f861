"""``ordering=ready``: micro-batches cut by the ready frontier instead of by segment.

An offset is ``{"spool": id, "frontier": F, "w0": n0, ...}``: batch ``(start, end]``
holds exactly the tuples whose event time is in ``(start.frontier, end.frontier]``,
read from the segments numbered at most ``end.wN`` that overlap that range, merged
in (event time, sender id, tuple id) order. Every tuple at or below ``end.frontier``
was in those segments when the offset was chosen (``cp_source.ready.frontier``),
so a replayed batch has exactly the same rows, and every tuple of batch k is
earlier than every tuple of batch k + 1.

A segment mixes senders, so its rows may span several batches. ``commit(end)``
deletes only the segments every one of whose rows is at or below the committed
frontier (per worker, the prefix of such segments: the spool's commit is by
prefix), and ``_ready_state.json`` keeps the committed frontier and how far each
worker's segments have been checked for rows that arrived behind it. Such rows
(a sender declared gone that came back, a gap declared lost that arrived after
all) are never read: each commit counts them with their exact tuple ids in
``skipped.ndjson`` (reason ``behind_ready_frontier``), never silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
from pyspark.sql.datasource import InputPartition

from cp_source.ready.frontier import NO_FRONTIER, ReadyReport
from cp_source.wire.bucket import merge_ranges
from cp_store.atomic_files import atomic_write
from cp_store.private_dirs import ensure_private_dir

STATE_FILE = "_ready_state.json"  # committed frontier and late-row scan positions (the driver's)
REPORT_FILE = "_ready.json"  # the frontier's report, replaced on every trigger (for tools)
LATE_REASON = "behind_ready_frontier"
SORT_KEYS = [("event_time", "ascending"), ("sender_id", "ascending"), ("tuple_id", "ascending")]
_US_FLOOR = -(1 << 50)  # event times below this (ms) are below every real one; keeps us in int64

SegmentRef = tuple[str, int, str, int, int]  # worker, number, path, rows, first tuple id


@dataclass
class ReadySlice(InputPartition):
    """One Spark partition of a ready batch: the event times ``(lo, hi]`` (ms) of these segments.

    Partitions of one batch cover consecutive ranges, so reading them in order gives the batch
    in merged order.
    """

    lo: int
    hi: int
    segments: list[SegmentRef] = field(default_factory=list)
    server: str | None = None
    fetch: str = "auto"
    fetch_timeout: float = 60.0
    spool_id: str = ""
    curve_keys: str | None = None
    batch_key: str = ""  # the batch's end offset digest, for the ingest log
    # over factory hosts: per segment, the (segment server, spool id) it is fetched from
    sources: list[tuple[str | None, str]] = field(default_factory=list)
    planned: tuple[int, str] | None = None  # the driver's reading as it offered the batch, and its domain

    def __post_init__(self) -> None:
        super().__init__(f"{self.lo}..{self.hi}")


@dataclass(frozen=True)
class ReadyState:
    """``_ready_state.json``: the committed frontier and, per worker, the segments checked for late rows."""

    frontier: int = NO_FRONTIER
    scanned: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, root: str | Path) -> ReadyState:
        try:
            doc = orjson.loads((Path(root) / STATE_FILE).read_bytes())
        except FileNotFoundError:
            return cls()
        except orjson.JSONDecodeError as e:
            raise ValueError(
                f"{Path(root) / STATE_FILE} is damaged ({e}); the ready frontier is unknown"
            ) from None
        return cls(int(doc["frontier"]), {str(w): int(n) for w, n in doc["scanned"].items()})

    def write(self, root: str | Path, durable: bool) -> None:
        body = orjson.dumps({"frontier": self.frontier, "scanned": self.scanned})
        atomic_write(Path(root) / STATE_FILE, body, durable)


def overlapping(spool: Any, upto: Mapping[str, int], lo: int, hi: int) -> list[Any]:
    """Segments numbered at most ``upto[w]`` holding an event time in ``(lo, hi]``."""
    out = []
    for w, n in upto.items():
        out += [s for s in spool.segments(w, -1, n) if s.event_time_max > lo and s.event_time_min <= hi]
    return out


def cut_slices(segs: list[Any], lo: int, hi: int, rows_per_slice: int) -> list[tuple[int, int, list[Any]]]:
    """``(lo, hi]`` as consecutive event-time slices of about ``rows_per_slice`` rows (estimated from
    whole segments: anything with ``rows``, ``event_time_min`` and ``event_time_max``), each with the
    segments it reads."""
    if not segs:
        return []
    start = max(lo, min(s.event_time_min for s in segs) - 1)
    total = sum(s.rows for s in segs)
    k = max(1, min(-(-total // rows_per_slice), hi - start))
    bounds = [start + (hi - start) * i // k for i in range(k + 1)]
    slices = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        mine = [s for s in segs if s.event_time_max > a and s.event_time_min <= b]
        if mine:
            slices.append((lo if a == start else a, b, mine))
    return slices


def plan_slices(
    spool: Any, upto: Mapping[str, int], lo: int, hi: int, rows_per_slice: int
) -> list[tuple[int, int, list[SegmentRef]]]:
    """The batch ``(lo, hi]`` of one spool as slices (``cut_slices``) of segment references."""
    return [
        (a, b, [(s.worker, s.number, s.path, s.rows, s.tuple_id_min) for s in mine])
        for a, b, mine in cut_slices(overlapping(spool, upto, lo, hi), lo, hi, rows_per_slice)
    ]


def select_rows(table: Any, lo: int, hi: int) -> Any:
    """The rows of ``table`` with event time in ``(lo, hi]`` (ms), filtered by Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ev = table.column("event_time")
    hi_s = pa.scalar(hi * 1000, ev.type)
    mask = pc.less_equal(ev, hi_s)
    if lo > _US_FLOOR:
        mask = pc.and_(mask, pc.greater(ev, pa.scalar(lo * 1000, ev.type)))
    return table.filter(mask)


def merge_sorted(tables: list[Any]) -> Any:
    """The rows of ``tables`` in (event time, sender id, tuple id) order (Arrow's sort, no Python rows)."""
    import pyarrow as pa

    if not tables:
        return None
    return pa.concat_tables(tables).sort_by(SORT_KEYS)


def consumed_prefix(spool: Any, upto: Mapping[str, int], frontier: int) -> dict[str, int]:
    """Per worker the highest n such that every segment up to n (of those up to ``upto[w]``) holds only
    event times at or below ``frontier``: what a commit at that frontier may delete."""
    committed = spool.committed()
    out = {}
    for w, n in upto.items():
        top = committed.get(w, -1)
        for s in spool.segments(w, top, n):
            if s.event_time_max > frontier:
                break
            top = s.number
        out[w] = top
    return out


def _late_ranges(spool: Any, scanned: Mapping[str, int], upto: Mapping[str, int], frontier: int) -> Any:
    """(rows, tuple-id ranges) in segments first seen since ``scanned`` with event times at or below
    ``frontier``: they arrived after the frontier passed them."""
    from cp_source.spool.segments import read_segment

    rows = 0
    ranges: list[list[int]] = []
    for w, n in upto.items():
        for s in spool.segments(w, scanned.get(w, -1), n):
            if s.event_time_min > frontier or frontier <= NO_FRONTIER:
                continue
            t = read_segment(s.path)
            late = select_rows(t, NO_FRONTIER, frontier)
            ids = np.sort(late.column("tuple_id").to_numpy())
            rows += len(ids)
            ranges += id_ranges(ids)
    return rows, merge_ranges(ranges)


def id_ranges(ids: np.ndarray) -> list[list[int]]:
    """Sorted distinct ids as merged [first, count] ranges."""
    if not len(ids):
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(ids)]])
    return [[int(ids[a]), int(b - a)] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _last_late_record(root: Path) -> dict[str, Any] | None:
    from cp_source.spool.ledger import read_ndjson

    recs = [r for r in read_ndjson(root / "skipped.ndjson") if r.get("reason") == LATE_REASON]
    return recs[-1] if recs else None


def commit_ready(
    spool: Any, spool_id: str, upto: dict[str, int], frontier: int, since: int | None = None
) -> dict[str, int]:
    """Commit a ready batch ending at (``frontier``, ``upto``): count late rows, record the frontier,
    delete what every later batch is past. Idempotent (Spark may commit an end again after a restart).

    ``since``: the batch's start frontier when known. Rows at or below it in segments no batch had
    planned are late even when this spool's own committed frontier is lower (a factory host that
    joined a query past its frontier).
    """
    root = Path(spool.root)
    ensure_private_dir(root)
    with open(root / "commit.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = ReadyState.read(root)
        if frontier > state.frontier or any(n > state.scanned.get(w, -1) for w, n in upto.items()):
            behind = state.frontier if since is None else max(state.frontier, since)
            rows, ranges = _late_ranges(spool, state.scanned, upto, behind)
            last = _last_late_record(root)
            key = {"frontier_ms": behind, "upto": upto}
            if rows and not (last and {k: last.get(k) for k in key} == key):
                rec = {
                    "wall": time.time(),
                    "reason": LATE_REASON,
                    "spool": spool_id,
                    **key,
                    "rows": rows,
                    "rows_never_planned": rows,
                    "ranges": ranges,
                }
                with open(root / "skipped.ndjson", "ab") as f:
                    f.write(orjson.dumps(rec) + b"\n")
            scanned = {w: max(n, state.scanned.get(w, -1)) for w, n in upto.items()}
            ReadyState(max(frontier, state.frontier), {**state.scanned, **scanned}).write(root, spool.durable)
    prefix = consumed_prefix(spool, upto, frontier)
    spool.commit(prefix, spool_id)
    return prefix


def write_report(root: str | Path, report: ReadyReport) -> None:
    """Replace ``_ready.json`` (the frontier's report); a failed write only leaves the last one."""
    with contextlib.suppress(OSError):
        atomic_write(Path(root) / REPORT_FILE, orjson.dumps({**report, "updated_wall": time.time()}))


def read_report(root: str | Path) -> ReadyReport | None:
    """The last ``_ready.json``, None when no ready query ran on the spool."""
    try:
        doc = orjson.loads((Path(root) / REPORT_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    # the object write_report wrote (a file of another shape is not a ready report: None)
    return cast(ReadyReport, doc) if isinstance(doc, dict) else None
