"""The spool's ledger: what the factory accepted, published, rejected and lost, per sender.

Every tuple id a generator assigned ends in exactly one of: published in a
segment, dropped by the generator (its end-of-stream lists the ranges),
rejected by the factory (header valid, payload not), or lost in transit (a
gap the factory can prove from the senders' gapless bucket sequence numbers).
This module reads the worker directories of a spool and does that
bookkeeping; it is also the one place that decides whether a factory has
published everything it received (:meth:`SpoolStats.drained`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from cp_source.bucket import merge_ranges, sender_of
from cp_source.factory_front import read_front_ledger

REC_FIELDS = 5  # segment, sender, seq, first_id, count
REC_BYTES = REC_FIELDS * 8
STATS_FILE = "stats.json"
EOS_FILE = "eos.ndjson"
BUCKETS_FILE = "buckets.bin"
REJECTED_FILE = "rejected.bin"
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


def _intersect(ranges: list[list[int]], within: list[list[int]]) -> list[list[int]]:
    """The parts of ``ranges`` inside ``within`` (both merged [first, count] lists)."""
    out = []
    for a, c in ranges:
        for b, d in within:
            lo, hi = max(a, b), min(a + c, b + d)
            if lo < hi:
                out.append([lo, hi - lo])
    return merge_ranges(out)


def split_lost(lost: list[list[int]], accepted: list[list[int]]) -> dict[str, list[list[int]]]:
    """Lost ranges by reason: accepted by the factory's front end and never published or rejected
    (``in_factory``: a worker died, a write failed), or never accepted (``before_factory``)."""
    inside = _intersect(lost, accepted)
    before = [r for a, c in lost for r in complement(a, a + c, inside)]
    return {"in_factory": inside, "before_factory": before}


def _sender_ledger(
    pub: np.ndarray, bad: np.ndarray, eos: dict[int, dict[str, Any]], front: dict[int, dict[str, Any]]
) -> tuple[dict[int, list[list[int]]], dict[int, int], dict[int, int], dict[int, dict[str, int]]]:
    """Per sender: lost ranges and lost buckets (closed senders), duplicates, and open senders' gaps."""
    lost: dict[int, list[list[int]]] = {}
    lost_buckets: dict[int, int] = {}
    duplicates: dict[int, int] = {}
    open_senders: dict[int, dict[str, int]] = {}
    for s in sorted(set(pub[:, 1].tolist()) | set(bad[:, 1].tolist()) | set(eos) | set(front)):
        mine = pub[pub[:, 1] == s]
        theirs = bad[bad[:, 1] == s]
        seqs = np.concatenate([mine[:, 2], theirs[:, 2]])
        uniq = np.unique(seqs)
        if len(uniq) != len(seqs):
            duplicates[s] = int(len(seqs) - len(uniq))
        if s in eos:
            e = eos[s]
            sent = int(e["buckets_sent"])
            lost_buckets[s] = int(sent - np.count_nonzero(uniq < sent))
            covered = [[int(a), int(c)] for a, c in np.concatenate([mine[:, 3:5], theirs[:, 3:5]]).tolist()]
            covered += [[int(a), int(c)] for a, c in e["dropped_ranges"]]
            lost[s] = complement(int(e["first_tuple_id"]), int(e["next_tuple_id"]), covered)
        else:
            top = max(int(uniq[-1]) if len(uniq) else -1, int(front.get(s, {}).get("seq_max", -1))) + 1
            open_senders[s] = {"seq_seen_max": top - 1, "seq_gaps": int(top - len(uniq))}
    return lost, lost_buckets, duplicates, open_senders


def read_ledger(
    root: Path, workers: list[str], used_bytes: int, committed: dict[str, int], latest: dict[str, int]
) -> SpoolStats:
    """The ledger of the spool at ``root`` (see :meth:`cp_source.spool.Spool.stats`)."""
    empty = np.empty((0, REC_FIELDS), np.int64)
    pub = np.concatenate([read_records(root / w / BUCKETS_FILE) for w in workers] or [empty])
    bad = np.concatenate([read_records(root / w / REJECTED_FILE) for w in workers] or [empty])
    eos = read_end_of_stream(root, workers)
    front = read_front_ledger(root)
    per_worker = {w: WorkerState.read(root, w) for w in workers}
    dead: dict[str, int] = {}
    for s in per_worker.values():
        for k, v in (s.counters.get("deadletters") or {}).items():
            dead[k] = dead.get(k, 0) + int(v)
    lost, lost_buckets, duplicates, open_senders = _sender_ledger(pub, bad, eos, front)
    reasons = {s: split_lost(r, front.get(s, {}).get("ids", [])) for s, r in lost.items()}
    return SpoolStats(
        workers=workers,
        buckets=int(len(pub)),
        rows=int(pub[:, 4].sum()) if len(pub) else 0,
        rejected_buckets=int(len(bad)),
        rejected_ranges=merge_ranges([[int(a), int(c)] for a, c in bad[:, 3:5].tolist()]),
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


def complement(lo: int, hi: int, covered: list[list[int]]) -> list[list[int]]:
    """Ranges [first, count] of [lo, hi) not covered by ``covered``."""
    out = []
    pos = lo
    for a, c in merge_ranges(covered):
        if a > pos:
            out.append([pos, min(a, hi) - pos])
        pos = max(pos, a + c)
        if pos >= hi:
            break
    if pos < hi:
        out.append([pos, hi - pos])
    return [r for r in out if r[1] > 0]
