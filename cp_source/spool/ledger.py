"""The spool's ledger: what the factory accepted, published, rejected and lost, per sender.

Every tuple id a generator assigned ends in exactly one of: published in a
segment, dropped by the generator (its end-of-stream lists the ranges),
rejected by the factory (header valid, payload not; or one row of a bucket
whose other rows were published), or lost in transit (a gap the factory can
prove from the senders' gapless bucket sequence numbers).

A record is a bucket's id range or a piece of it: a bucket with rejected rows
has a published record per run of good rows and a rejected record per run of
bad ones, all with its seq. So a bucket is one seq, and a record is a
duplicate when its id range repeats an earlier record's (``duplicate_buckets``
counts those records; a sender's records never overlap in part, so these are
the records whose first id an earlier record covers).

This module reads the worker directories of a spool and does that
bookkeeping; it is also the one place that decides whether a factory has
published everything it received (:meth:`SpoolStats.drained`).

A long run's bucket records do not stay on disk: what has been committed is
folded into ``compacted.json`` (:class:`LedgerSummary`, per sender merged id
and sequence ranges and counts) and dropped from the worker files
(``cp_source.spool.compact``). The ledger is the summary plus the records not
yet folded, and it is the same with or without compaction.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from cp_source.spool.front_records import read_front_ledger
from cp_source.spool.id_ranges import complement, count_below, in_ranges, new_pieces, ranges_of, split_lost
from cp_source.wire.bucket import merge_ranges, sender_of

REC_FIELDS = 5  # segment, sender, seq, first_id, count
REC_BYTES = REC_FIELDS * 8
STATS_FILE = "stats.json"
EOS_FILE = "eos.ndjson"
BUCKETS_FILE = "buckets.bin"
REJECTED_FILE = "rejected.bin"
SUMMARY_FILE = "compacted.json"  # at the spool root: the ledger of compacted records (LedgerSummary)
# A worker rewrites its stats every 0.2 s; one silent this long has stopped or died.
STALE_S = 1.0


def read_records(path: Path) -> np.ndarray:
    """Bucket records (n, 5) of a ``buckets.bin``/``rejected.bin``; a record cut by a crash is ignored."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return np.empty((0, REC_FIELDS), dtype=np.int64)
    usable = len(raw) - len(raw) % REC_BYTES
    return np.frombuffer(raw[:usable], dtype="<i8").reshape(-1, REC_FIELDS)


def read_ndjson(path: Path) -> list[dict[str, Any]]:
    """The complete, parseable lines of an NDJSON file (a torn last line is skipped)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        if line:
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
    return out


@dataclass
class SenderSummary:
    """One sender's compacted records: merged id and seq ranges ([first, count]) and how many records."""

    published: list[list[int]] = field(default_factory=list)
    rejected: list[list[int]] = field(default_factory=list)
    seqs: list[list[int]] = field(default_factory=list)  # distinct seqs of published and rejected buckets
    records: int = 0  # published and rejected records folded, duplicates included
    pieces: int = 0  # records folded with distinct first ids: records - pieces are duplicates

    def seq_count(self) -> int:
        return int(sum(c for _, c in self.seqs))

    def seq_top(self) -> int:
        """The highest seq folded, -1 if none."""
        return self.seqs[-1][0] + self.seqs[-1][1] - 1 if self.seqs else -1


@dataclass
class LedgerSummary:
    """``compacted.json``: the ledger of the bucket records compacted away, per sender.

    ``through[w]``: every record of worker ``w`` whose first field (segment number, or for a
    rejected record the segment being built when it was rejected) is at most this is folded in
    here, and no other. Merged ranges stay small: ids and seqs of one sender interleave across
    workers, but their union over all workers is nearly contiguous.
    """

    through: dict[str, int] = field(default_factory=dict)
    seq_max: dict[str, dict[int, int]] = field(default_factory=dict)  # worker -> sender -> highest seq
    buckets: int = 0
    rows: int = 0
    rejected_buckets: int = 0
    senders: dict[int, SenderSummary] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path) -> LedgerSummary:
        """The summary of the spool at ``root``; empty when nothing was compacted.

        It is only ever replaced whole (rename), so a file that does not parse was damaged
        from outside: that raises, since the ledger could no longer be exact.
        """
        try:
            raw = (Path(root) / SUMMARY_FILE).read_bytes()
        except FileNotFoundError:
            return cls()
        try:
            return cls.from_json(orjson.loads(raw))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(
                f"{Path(root) / SUMMARY_FILE} is damaged ({e}): the ledger cannot be read"
            ) from e

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LedgerSummary:
        return cls(
            through={str(w): int(n) for w, n in d["through"].items()},
            seq_max={str(w): {int(s): int(q) for s, q in m.items()} for w, m in d["seq_max"].items()},
            buckets=int(d["buckets"]),
            rows=int(d["rows"]),
            rejected_buckets=int(d["rejected_buckets"]),
            senders={
                int(s): SenderSummary(
                    published=[[int(a), int(c)] for a, c in v["published"]],
                    rejected=[[int(a), int(c)] for a, c in v["rejected"]],
                    seqs=[[int(a), int(c)] for a, c in v["seqs"]],
                    records=int(v["records"]),
                    # written before buckets had pieces: a record per seq, the rest duplicates
                    pieces=int(v.get("pieces", sum(c for _, c in v["seqs"]))),
                )
                for s, v in d["senders"].items()
            },
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "through": self.through,
            "seq_max": {w: {str(s): q for s, q in m.items()} for w, m in self.seq_max.items()},
            "buckets": self.buckets,
            "rows": self.rows,
            "rejected_buckets": self.rejected_buckets,
            "senders": {
                str(s): {
                    "published": v.published,
                    "rejected": v.rejected,
                    "seqs": v.seqs,
                    "records": v.records,
                    "pieces": v.pieces,
                }
                for s, v in sorted(self.senders.items())
            },
        }

    def fold(self, worker: str, pub: np.ndarray, bad: np.ndarray, through: int) -> None:
        """Add worker ``worker``'s records up to ``through`` (those not folded yet) to the summary."""
        self.buckets += len(pub)
        self.rows += int(pub[:, 4].sum()) if len(pub) else 0
        self.rejected_buckets += len(bad)
        top = self.seq_max.setdefault(worker, {})
        for s in sorted(set(pub[:, 1].tolist()) | set(bad[:, 1].tolist())):
            mine, theirs = pub[pub[:, 1] == s], bad[bad[:, 1] == s]
            ss = self.senders.setdefault(int(s), SenderSummary())
            ss.pieces += new_pieces(np.concatenate([mine, theirs]), merge_ranges(ss.published + ss.rejected))
            ss.published = ranges_of(ss.published + ranges_of(mine[:, 3:5]))
            ss.rejected = ranges_of(ss.rejected + ranges_of(theirs[:, 3:5]))
            seqs = np.concatenate([mine[:, 2], theirs[:, 2]])
            ss.seqs = ranges_of(ss.seqs + [[q, 1] for q in np.unique(seqs).tolist()])
            ss.records += len(seqs)
            top[int(s)] = max(top.get(int(s), -1), int(seqs.max()))
        self.through[worker] = max(through, self.through.get(worker, -1))

    def unfolded(self, worker: str, recs: np.ndarray) -> np.ndarray:
        """The records of ``worker`` that are not in the summary."""
        if worker not in self.through:
            return recs
        return recs[recs[:, 0] > self.through[worker]]


@dataclass(frozen=True)
class WorkerState:
    """One factory worker's last report (its ``stats.json``)."""

    worker: str
    pid: int | None = None
    ready: bool = False
    pending_rows: int = -1
    paused: bool = False
    last_recv_wall: float = 0.0
    updated_wall: float = 0.0
    counters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path, worker: str) -> WorkerState:
        try:
            s = orjson.loads((root / worker / STATS_FILE).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return cls(worker)
        if not isinstance(s, dict):
            return cls(worker)
        return cls(
            worker=worker,
            pid=int(s["pid"]) if isinstance(s.get("pid"), int) else None,
            ready=bool(s.get("ready")),
            pending_rows=int(s.get("pending_rows", -1)),
            paused=bool(s.get("paused")),
            last_recv_wall=float(s.get("last_recv_wall", 0.0)),
            updated_wall=float(s.get("updated_wall", 0.0)),
            counters=s,
        )

    def live(self, now: float, stale_s: float = STALE_S) -> bool:
        """Reported within ``stale_s`` of ``now`` (wall clock): the worker is running."""
        return now - self.updated_wall <= stale_s

    def settled(self, quiet_s: float) -> bool:
        """Holds no unpublished rows, is not paused, and received nothing for ``quiet_s`` before reporting."""
        return (
            self.pending_rows == 0 and not self.paused and self.updated_wall - self.last_recv_wall >= quiet_s
        )


def workers_drained(
    states: Iterable[WorkerState],
    quiet_s: float = 0.5,
    since_wall: float | None = None,
    now: float | None = None,
) -> bool:
    """Every worker is live and settled; with ``since_wall``, its report was written after that time.

    ``since_wall`` lets a caller ignore reports written before a message it
    sent could have arrived. No worker at all is not drained.
    """
    now = time.time() if now is None else now
    states = list(states)
    return bool(states) and all(
        s.live(now) and s.settled(quiet_s) and (since_wall is None or s.updated_wall >= since_wall)
        for s in states
    )


@dataclass(frozen=True)
class SpoolStats:
    """The ledger of a spool over all its workers. Sender ids are ints; ranges are [first_id, count]."""

    workers: list[str]
    buckets: int
    rows: int
    rejected_buckets: int
    rejected_ranges: list[list[int]]
    deadletters: dict[str, int]
    lost_in_transit: dict[int, list[list[int]]]  # senders whose end-of-stream arrived
    lost_reasons: dict[int, dict[str, list[list[int]]]]  # the same ranges by reason (see split_lost)
    lost_buckets: dict[int, int]
    duplicate_buckets: dict[int, int]
    end_of_stream: dict[int, dict[str, Any]]
    open_senders: dict[int, dict[str, int]]  # no end-of-stream yet: highest seq seen and gaps so far
    per_worker: dict[str, WorkerState]
    used_bytes: int
    committed: dict[str, int]
    latest: dict[str, int]

    @property
    def deadletters_total(self) -> int:
        return int(sum(self.deadletters.values()))

    @property
    def lost_in_transit_total(self) -> int:
        return int(sum(c for r in self.lost_in_transit.values() for _, c in r))

    def senders(self) -> set[int]:
        """Every sender the factory has seen a bucket or an end-of-stream of."""
        return set(self.lost_in_transit) | set(self.open_senders) | set(self.end_of_stream)

    @property
    def rejected_rows(self) -> int:
        """Tuples rejected: of whole buckets, and rows rejected alone."""
        return int(sum(c for _, c in self.rejected_ranges))

    def rejected_of(self, senders: Iterable[int]) -> int:
        """Tuples of these senders whose buckets the factory rejected."""
        want = set(senders)
        return sum(c for first, c in self.rejected_ranges if sender_of(first) in want)

    def lost_of(self, senders: Iterable[int]) -> int | None:
        """Tuples of these senders lost in transit or rejected; None until all their end-of-streams came."""
        want = set(senders)
        if any(s not in self.end_of_stream for s in want):
            return None
        return sum(c for s in want for _, c in self.lost_in_transit.get(s, [])) + self.rejected_of(want)

    def drained(self, senders: Iterable[int] | None = None, quiet_s: float = 0.5) -> bool:
        """Every given sender's end-of-stream arrived and every worker is live and has published all."""
        if senders is not None and any(s not in self.end_of_stream for s in senders):
            return False
        return workers_drained(self.per_worker.values(), quiet_s)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (sender ids as strings), for summaries and ``factory --json``."""

        def keyed(d: dict[int, Any]) -> dict[str, Any]:
            return {str(k): v for k, v in sorted(d.items())}

        return {
            "workers": self.workers,
            "buckets": self.buckets,
            "rows": self.rows,
            "rejected_buckets": self.rejected_buckets,
            "rejected_ranges": self.rejected_ranges,
            "rejected_rows": self.rejected_rows,
            "deadletters": self.deadletters,
            "deadletters_total": self.deadletters_total,
            "lost_in_transit": keyed(self.lost_in_transit),
            "lost_in_transit_total": self.lost_in_transit_total,
            "lost_reasons": keyed(self.lost_reasons),
            "lost_buckets": keyed(self.lost_buckets),
            "duplicate_buckets": keyed(self.duplicate_buckets),
            "end_of_stream": keyed(self.end_of_stream),
            "open_senders": keyed(self.open_senders),
            "per_worker": {w: s.counters for w, s in self.per_worker.items()},
            "used_bytes": self.used_bytes,
            "committed": self.committed,
            "latest": self.latest,
        }


def read_end_of_stream(root: Path, workers: Iterable[str]) -> dict[int, dict[str, Any]]:
    """End-of-stream totals per sender, as the front end recorded them (or a worker, on older spools)."""
    eos: dict[int, dict[str, Any]] = {
        s: f["eos"] for s, f in read_front_ledger(root).items() if f["eos"] is not None
    }
    for w in workers:
        for d in read_ndjson(root / w / EOS_FILE):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                eos.setdefault(int(d["sender_id"]), d)
    return eos


def _by_sender(recs: np.ndarray) -> dict[int, np.ndarray]:
    """Records grouped by sender (one sort, not one scan per sender)."""
    if not len(recs):
        return {}
    recs = recs[np.argsort(recs[:, 1], kind="stable")]
    senders, first = np.unique(recs[:, 1], return_index=True)
    return {int(s): part for s, part in zip(senders.tolist(), np.split(recs, first[1:]), strict=True)}


_NONE = np.empty((0, REC_FIELDS), np.int64)


def _seq_counts(mine: np.ndarray, theirs: np.ndarray, ss: SenderSummary) -> tuple[np.ndarray, int, int]:
    """Seqs not in the summary (distinct, sorted), distinct seqs in all, and duplicate records in all."""
    both = np.concatenate([mine, theirs])
    new = np.unique(both[:, 2])
    new = new[~in_ranges(new, ss.seqs)]
    covered = merge_ranges(ss.published + ss.rejected)
    duplicates = len(both) + ss.records - new_pieces(both, covered) - ss.pieces
    return new, len(new) + ss.seq_count(), duplicates


def _sender_ledger(
    pub: np.ndarray,
    bad: np.ndarray,
    eos: dict[int, dict[str, Any]],
    front: dict[int, dict[str, Any]],
    summary: LedgerSummary,
) -> tuple[dict[int, list[list[int]]], dict[int, int], dict[int, int], dict[int, dict[str, int]]]:
    """Per sender: lost ranges and lost buckets (closed senders), duplicates, and open senders' gaps.

    Over the summary's records and the records not compacted yet, exactly as over all records.
    """
    lost: dict[int, list[list[int]]] = {}
    lost_buckets: dict[int, int] = {}
    duplicates: dict[int, int] = {}
    open_senders: dict[int, dict[str, int]] = {}
    pubs, bads = _by_sender(pub), _by_sender(bad)
    for s in sorted(set(pubs) | set(bads) | set(eos) | set(front) | set(summary.senders)):
        mine, theirs = pubs.get(s, _NONE), bads.get(s, _NONE)
        ss = summary.senders.get(s, SenderSummary())
        new, distinct, dup = _seq_counts(mine, theirs, ss)
        if dup:
            duplicates[s] = dup
        if s in eos:
            e = eos[s]
            sent = int(e["buckets_sent"])
            lost_buckets[s] = sent - int(np.count_nonzero(new < sent)) - count_below(ss.seqs, sent)
            covered = [[int(a), int(c)] for a, c in np.concatenate([mine[:, 3:5], theirs[:, 3:5]]).tolist()]
            covered += ss.published + ss.rejected + [[int(a), int(c)] for a, c in e["dropped_ranges"]]
            lost[s] = complement(int(e["first_tuple_id"]), int(e["next_tuple_id"]), covered)
        else:
            seen = max(int(new[-1]) if len(new) else -1, ss.seq_top())
            top = max(seen, int(front.get(s, {}).get("seq_max", -1))) + 1
            open_senders[s] = {"seq_seen_max": top - 1, "seq_gaps": top - distinct}
    return lost, lost_buckets, duplicates, open_senders


def read_ledger(
    root: Path,
    workers: list[str],
    used_bytes: int,
    committed: dict[str, int],
    latest: dict[str, int],
    tails: LedgerTails | None = None,
) -> SpoolStats:
    """The ledger of the spool at ``root`` (see :meth:`cp_source.spool.segments.Spool.stats`).

    ``latest``: per worker the last segment in its manifest, read before this call (only
    records of published segments count). ``tails``: the records read by an earlier call,
    so only what was appended since is read.
    """
    pub, bad, summary = (tails or LedgerTails(root)).read(workers, latest)
    eos = read_end_of_stream(root, workers)
    front = read_front_ledger(root)
    per_worker = {w: WorkerState.read(root, w) for w in workers}
    dead: dict[str, int] = {}
    for s in per_worker.values():
        for k, v in (s.counters.get("deadletters") or {}).items():
            dead[k] = dead.get(k, 0) + int(v)
    lost, lost_buckets, duplicates, open_senders = _sender_ledger(pub, bad, eos, front, summary)
    reasons = {s: split_lost(r, front.get(s, {}).get("ids", [])) for s, r in lost.items()}
    rejected = [[int(a), int(c)] for a, c in bad[:, 3:5].tolist()]
    return SpoolStats(
        workers=workers,
        buckets=int(len(pub)) + summary.buckets,
        rows=(int(pub[:, 4].sum()) if len(pub) else 0) + summary.rows,
        rejected_buckets=int(len(bad)) + summary.rejected_buckets,
        rejected_ranges=merge_ranges(rejected + [r for v in summary.senders.values() for r in v.rejected]),
        deadletters=dead,
        lost_in_transit=lost,
        lost_reasons=reasons,
        lost_buckets=lost_buckets,
        duplicate_buckets=duplicates,
        end_of_stream=eos,
        open_senders=open_senders,
        per_worker=per_worker,
        used_bytes=used_bytes,
        committed=committed,
        latest=latest,
    )


class RecordTail:
    """A records file (``buckets.bin``, ``rejected.bin``) read incrementally.

    Only complete records appended since the last read are read. Compaction replaces
    the file by a shorter copy (a new inode); that is noticed (inode, size, and the
    last record read no longer just before the read position) and the new file is
    read from its start. Records are unique within a worker's file, so the last
    record read sitting just before the position means the file is the one read so far.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.ino = -1
        self.last = b""  # the last record read, as bytes
        self.records = _NONE

    def _continues(self, f: Any, st: os.stat_result) -> bool:
        if st.st_ino != self.ino or st.st_size < self.pos:
            return False
        f.seek(self.pos - REC_BYTES)
        return bool(f.read(REC_BYTES) == self.last)

    def refresh(self, upto: int | None = None) -> np.ndarray:
        """Read what was appended; with ``upto``, only records whose first field is at most it."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return self.records
        with f:
            st = os.fstat(f.fileno())
            if self.pos and not self._continues(f, st):
                self.pos, self.last, self.records = 0, b"", _NONE  # replaced: read the new file whole
            f.seek(self.pos)
            raw = f.read()
        self.ino = st.st_ino
        new = np.frombuffer(raw[: len(raw) - len(raw) % REC_BYTES], dtype="<i8").reshape(-1, REC_FIELDS)
        if upto is not None:  # records are in segment order; later ones are read next time
            new = new[: int(np.searchsorted(new[:, 0], upto, side="right"))]
        if len(new):
            self.records = np.concatenate([self.records, new]) if len(self.records) else new.copy()
            self.pos += len(new) * REC_BYTES
            self.last = new[-1].tobytes()
        return self.records

    def drop_through(self, through: int) -> None:
        """Forget records whose first field is at most ``through`` (they are in the summary)."""
        keep = self.records[:, 0] > through
        if not keep.all():
            self.records = self.records[keep].copy()


class LedgerTails:
    """Per worker, the bucket and rejected records not yet compacted, read incrementally.

    Memory stays bounded: records folded into the summary are forgotten.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._tails: dict[tuple[str, str], RecordTail] = {}
        self._summary: tuple[tuple[int, int, int], LedgerSummary] | None = None

    def _tail(self, worker: str, name: str) -> RecordTail:
        key = (worker, name)
        if key not in self._tails:
            self._tails[key] = RecordTail(self.root / worker / name)
        return self._tails[key]

    def summary(self) -> LedgerSummary:
        """The summary file, parsed again only when it was replaced."""
        try:
            st = os.stat(self.root / SUMMARY_FILE)
        except FileNotFoundError:
            return LedgerSummary()
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._summary is None or self._summary[0] != stamp:
            self._summary = (stamp, LedgerSummary.read(self.root))
        return self._summary[1]

    def read(
        self, workers: list[str], latest: dict[str, int]
    ) -> tuple[np.ndarray, np.ndarray, LedgerSummary]:
        """(published records, rejected records, summary): the records not in the summary.

        The files are read before the summary: a worker drops records from its files only
        after the summary holding them was written, so whatever a file no longer has, a
        summary read after it has, and the records it has past that summary are counted once.
        """
        for w in workers:
            self._tail(w, BUCKETS_FILE).refresh(latest.get(w, -1))
            self._tail(w, REJECTED_FILE).refresh()
        summary = self.summary()
        pubs: list[np.ndarray] = []
        bads: list[np.ndarray] = []
        for w in workers:
            for name, out in ((BUCKETS_FILE, pubs), (REJECTED_FILE, bads)):
                tail = self._tail(w, name)
                if w in summary.through:
                    tail.drop_through(summary.through[w])
                out.append(tail.records)
        return np.concatenate(pubs or [_NONE]), np.concatenate(bads or [_NONE]), summary
