"""What a cloudprofiler source holds and has lost, read from its spool: the call behind "watching a query".

PySpark's Python data source API (4.3) gives a streaming reader no way to
report custom source metrics or a description to ``lastProgress`` (the JVM
side, ``PythonMicroBatchStream``, does not implement ``ReportsSourceMetrics``
and its runner protocol has no call for it; see docs/reader.md). So the
numbers a user wants while a query runs are read here from the spool's own
files, through the same readers the source uses (``Spool``, its ledger,
``_reader.json``). Everything is read-only: a running query and its factory
are never disturbed, and files they replace while being read are read again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal, TypedDict

from cp_common.process_times import process_start_ticks
from cp_source.hosts.links import FactoryHostStatus, HostsReady
from cp_source.klink.reports import KlinkReport
from cp_source.reader.state import read_reader_state
from cp_source.ready.frontier import ReadyReport
from cp_source.spool.demand import DemandCounts, read_counts
from cp_source.spool.ledger import SpoolStats, WorkerState
from cp_source.spool.names import WORKER_RE
from cp_source.spool.segments import SPOOL_FILE, Spool, SpoolMismatchError

READ_ATTEMPTS = 3  # a commit or compaction between two reads makes them disagree: read again


class PublishedCounts(TypedDict):
    rows: int
    buckets: int
    segments: int


class SegmentCounts(TypedDict):
    """Segments published in a range of each worker's segment numbers, and their rows and bytes."""

    segments: int
    rows: int
    bytes: int


class Losses(TypedDict):
    """Tuples that did not reach the spool: dropped by the generator, lost in transit (all, and by
    reason: ``in_factory``, ``before_factory``), rejected; senders finished and still open."""

    dropped_by_generator: int
    lost_in_transit: int
    lost_by_reason: dict[str, int]
    rejected: int
    senders_finished: int
    senders_open: int


class Offsets(TypedDict):
    """Per worker, the last segment committed, planned and published; ``query_end``: the query's
    last end offset (None without a query or before its first batch)."""

    committed: dict[str, int]
    planned: dict[str, int]
    latest: dict[str, int]
    query_end: dict[str, int] | None


class WorkerStatus(TypedDict):
    pid: int | None
    live: bool  # fresh stats and a running process
    ready: bool
    paused: bool
    paused_reason: str | None
    pending_rows: int


FactoryState = Literal["ready", "starting", "paused", "stopped", "failed"]


class FactoryStatus(TypedDict):
    """The factory's ``state`` and ``why``, its kind (embedded, external), where its endpoint and
    segment server listen (None unless its reader runs), and each worker's state."""

    state: FactoryState
    why: str | None
    kind: str | None
    endpoint: str | None
    segment_server: str | None
    workers: dict[str, WorkerStatus]


class ReadyStatus(ReadyReport):
    """``ordering=ready``: the frontier's report, and the rows that arrived behind the frontier."""

    behind_frontier_rows: int


class SourceStatus(TypedDict):
    """``source_status`` of a spool; its JSON form is an object of these keys (docs/reader.md,
    "Watching a query", lists them)."""

    spool: str
    spool_id: str | None
    published: PublishedCounts
    backlog: SegmentCounts  # published, not committed
    unread: SegmentCounts  # published, not planned into a micro-batch
    spool_bytes: int
    dead_letters: dict[str, int]  # per reason
    dead_letters_total: int
    losses: Losses
    offsets: Offsets
    factory: FactoryStatus
    ready: ReadyStatus | None  # ordering=ready only
    klink: KlinkReport | None  # scheduling=klink only
    demand: DemandCounts  # the flush on request: its bounds, and the batches a late worker missed


class FactoriesStatus(TypedDict):
    """``source_status`` of a query over factory hosts (its ``statusDir``); JSON: an object of these
    keys (docs/reader.md, "Watching a query"). ``query_end``: per factory spool id, its workers'
    positions in the query's last end offset."""

    status_dir: str
    reader_live: bool
    written_wall: float | None
    factory_timeout: float | None
    factories: list[FactoryHostStatus]
    waiting: list[str]
    ready: HostsReady | None  # ordering=ready only
    query_end: dict[str, dict[str, int]] | None
    failed: str | None


def _check_spool(path: Path) -> None:
    """One line naming the path when it is not a spool."""
    if not path.exists():
        raise ValueError(f"spool {path} does not exist: pass the `spool` option of the query's source")
    if not path.is_dir():
        raise ValueError(f"spool {path} is not a directory: pass the `spool` option of the query's source")
    names = os.listdir(path)
    if SPOOL_FILE not in names and not any(WORKER_RE.match(n) for n in names):
        raise ValueError(
            f"{path} is not a cloudprofiler spool (it has no {SPOOL_FILE} and no worker directories)"
        )


def _segments(spool: Spool, after: dict[str, int], upto: dict[str, int]) -> SegmentCounts | None:
    """Segments, rows and bytes published in (after[w], upto[w]]; None when the manifest has moved on."""
    out: SegmentCounts = {"segments": 0, "rows": 0, "bytes": 0}
    for w, hi in upto.items():
        lo = after.get(w, -1)
        segs = spool.segments(w, lo, hi)
        if [s.number for s in segs] != list(range(lo + 1, hi + 1)):
            return None  # committed and compacted meanwhile
        out["segments"] += len(segs)
        out["rows"] += sum(s.rows for s in segs)
        out["bytes"] += sum(s.nbytes for s in segs)
    return out


def _why_query_failed(query: Any) -> str | None:
    """The line of a dead query's exception that says why (the factory's own line when there is one)."""
    if query is None or query.isActive:
        return None
    err = query.exception()
    if err is None:
        return None
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    for ln in lines:
        if "factory failed" in ln:
            return ln
    return lines[0] if lines else type(err).__name__


def _factory(spool: Spool, per_worker: dict[str, WorkerState], query: Any) -> FactoryStatus:
    """The factory's state (ready, starting, paused, stopped or failed, with why) and each worker's."""
    now = time.time()
    workers: dict[str, WorkerStatus] = {
        w: {
            "pid": s.pid,
            # fresh stats and a running process: a worker's last report stays fresh for a second
            "live": s.live(now) and (s.pid is None or process_start_ticks(s.pid) is not None),
            "ready": s.ready,
            "paused": s.paused,
            "paused_reason": s.counters.get("paused_reason"),
            "pending_rows": s.pending_rows,
        }
        for w, s in per_worker.items()
    }
    reader = read_reader_state(spool.root)
    reader_live = reader is not None and reader.owner_alive()
    failed = _why_query_failed(query)
    paused = [f"{w}: {d['paused_reason'] or 'the spool is full (maxSpoolBytes)'}" for w, d in workers.items()
              if d["live"] and d["paused"]]  # fmt: skip
    live = [w for w, d in workers.items() if d["live"]]
    state: FactoryState
    why: str | None
    if failed:
        state, why = "failed", failed
    elif paused:
        state, why = "paused", "; ".join(paused)
    elif live and all(workers[w]["ready"] for w in live):
        # a spool may keep directories of an earlier factory's extra workers: named, not waited for
        idle = [w for w in workers if w not in live]
        state, why = "ready", f"not running: {', '.join(idle)}" if idle else None
    elif reader_live or live:
        waiting = [w for w, d in workers.items() if not (d["live"] and d["ready"])]
        state, why = "starting", f"workers not ready yet: {', '.join(waiting) or 'none started'}"
    else:
        state, why = "stopped", "no live reader or factory worker on this spool"
    return {
        "state": state,
        "why": why,
        "kind": reader.factory if reader else None,
        "endpoint": reader.factory_endpoint if reader_live and reader else None,
        "segment_server": reader.segment_server if reader_live and reader else None,
        "workers": workers,
    }


def _losses(stats: SpoolStats) -> Losses:
    """Tuples that did not reach the spool, by where they were lost (exact counts, see SpoolStats)."""
    by_reason: dict[str, int] = {"in_factory": 0, "before_factory": 0}
    for reasons in stats.lost_reasons.values():
        for reason, ranges in reasons.items():
            by_reason[reason] = by_reason.get(reason, 0) + sum(c for _, c in ranges)
    return {
        "dropped_by_generator": sum(int(e.get("dropped", 0)) for e in stats.end_of_stream.values()),
        "lost_in_transit": stats.lost_in_transit_total,
        "lost_by_reason": by_reason,
        "rejected": sum(c for _, c in stats.rejected_ranges),
        "senders_finished": len(stats.end_of_stream),
        "senders_open": len(stats.open_senders),
    }


def source_end_offset(query: Any, source: int = 0) -> dict[str, int] | None:
    """The end offset of a streaming query's ``source``-th source in its last progress, or None.

    For the cloudprofiler source this is the per-worker segment number the last
    micro-batch read up to (the offset's spool id left out); compare it with
    ``Spool.latest()`` to know the query has read everything published.
    """
    from cp_source.ready.offsets import SPOOL_KEY

    prog = query.lastProgress
    if not prog or len(prog["sources"]) <= source:
        return None
    end = prog["sources"][source]["endOffset"]
    parsed = json.loads(end) if isinstance(end, str) else end
    return {k: v for k, v in parsed.items() if k != SPOOL_KEY} if isinstance(parsed, dict) else None


def _offsets(stats: SpoolStats, planned: dict[str, int], query: Any) -> Offsets:
    return {
        "committed": stats.committed,
        "planned": planned,
        "latest": stats.latest,
        "query_end": source_end_offset(query) if query is not None else None,
    }


def _read_once(spool: Spool, query: Any) -> SourceStatus | None:
    stats = spool.stats()
    workers = list(stats.latest)
    committed = {w: stats.committed.get(w, -1) for w in workers}
    planned_all = spool.planned()
    planned = {w: planned_all.get(w, -1) for w in workers}
    backlog = _segments(spool, committed, {w: max(stats.latest[w], committed[w]) for w in workers})
    unread = _segments(spool, planned, {w: max(stats.latest[w], planned[w]) for w in workers})
    if backlog is None or unread is None:
        return None
    return {
        "spool": str(spool.root),
        "spool_id": spool.spool_id(),
        "published": {
            "rows": stats.rows,
            "buckets": stats.buckets,
            "segments": sum(n + 1 for n in stats.latest.values()),
        },
        "backlog": backlog,
        "unread": unread,
        "spool_bytes": stats.used_bytes,
        "dead_letters": dict(sorted(stats.deadletters.items())),
        "dead_letters_total": stats.deadletters_total,
        "losses": _losses(stats),
        "offsets": _offsets(stats, planned_all, query),
        "factory": _factory(spool, stats.per_worker, query),
        "ready": _ready(spool),
        "klink": _klink(spool),
        "demand": read_counts(spool.root),
    }


def _ready(spool: Spool) -> ReadyStatus | None:
    """With ``ordering=ready``: the frontier, each sender's state, and the tuples that arrived behind
    the frontier (counted, never read); None when no ready query ran on the spool."""
    from cp_source.ready.batch_plan import LATE_REASON, read_report

    report = read_report(spool.root)
    if report is None:
        return None
    late = [r for r in spool.skipped() if r.get("reason") == LATE_REASON]
    return {**report, "behind_frontier_rows": sum(int(r.get("rows", 0)) for r in late)}


def _klink(spool: Spool) -> KlinkReport | None:
    """With ``scheduling=klink``: the reader's ``_klink.json`` (deferrals, slack, prediction, peers)."""
    from cp_source.klink.admission import read_report

    return read_report(spool.root)


def _factories_status(path: Path, query: Any) -> FactoriesStatus | None:
    """A query over factory hosts (``factories=...``): each factory's state, and which ones the query
    is waiting for and since when, from the reader's ``_factories.json``; None when there is none."""
    from cp_source.hosts.links import read_status
    from cp_source.ready.offsets import FACTORIES_KEY

    doc = read_status(path)
    if doc is None:
        return None
    live = bool(doc.get("live"))
    end = None
    prog = query.lastProgress if query is not None else None
    if prog and prog.get("sources"):
        raw = prog["sources"][0].get("endOffset")
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        end = parsed.get(FACTORIES_KEY) if isinstance(parsed, dict) else None
    return {
        "status_dir": str(path),
        "reader_live": live,  # the reader that wrote it still runs: otherwise its waits are over
        "written_wall": doc.get("written_wall"),
        "factory_timeout": doc.get("factory_timeout"),
        "factories": doc.get("factories", []),
        "waiting": doc.get("waiting", []) if live else [],
        "ready": doc.get("ready"),
        "query_end": end,
        "failed": _why_query_failed(query),
    }


def source_status(spool: str | os.PathLike[str], query: Any = None) -> SourceStatus | FactoriesStatus:
    """The state of a cloudprofiler source's spool, for watching a query (read-only, safe while it runs).

    ``spool``: the source's ``spool`` option. ``query`` (a StreamingQuery, optional) adds the
    query's last end offset and, when it died, why. Returns a ``SourceStatus``: what the factory
    published, the backlog and the part no micro-batch took yet (``unread``), dead letters, losses,
    offsets per worker, the factory's state and each worker's, and the ``ready`` and ``klink``
    reports (None unless ``ordering=ready``, ``scheduling=klink``).

    A query over factory hosts (``factories=...``) has no spool: pass its ``statusDir`` instead for a
    ``FactoriesStatus``: each factory host's state, the ones the query waits for, the ready frontier
    over the hosts, the query's end offset and why it failed.

    Both are TypedDicts whose JSON form (``json.dumps``) is an object of their keys; docs/reader.md,
    "Watching a query", lists every key of every section.

    Raises ``ValueError`` naming the path when it is not a spool.
    """
    path = Path(spool)
    hosts = _factories_status(path, query) if path.is_dir() else None
    if hosts is not None:
        return hosts
    _check_spool(path)
    last: Exception | None = None
    for _ in range(READ_ATTEMPTS):
        try:
            status = _read_once(Spool(path), query)
        except SpoolMismatchError as e:
            raise ValueError(f"spool {path}: {e}") from None
        except (FileNotFoundError, ValueError) as e:
            status, last = None, e  # a file replaced or trimmed between two reads
        if status is not None:
            return status
        time.sleep(0.05)
    why = f": {last}" if last else " (committed and compacted while being read)"
    raise RuntimeError(f"spool {path} could not be read consistently in {READ_ATTEMPTS} attempts{why}")
