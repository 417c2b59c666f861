"""The spool: per-worker Arrow IPC segments, published atomically, deleted only after commit.

Layout under the spool root::

    spool.json                the spool's identity {"spool_id": ...}, created once (ensure_spool_id)
    skipped.ndjson            segments a query chose not to read (startingOffsets=latest), with their ids
    committed.json            committed offsets {"w0": 12, ...} (written by Spool.commit)
    planned.json              offsets the stream reader has put into a micro-batch (Spool.mark_planned)
    compacted.json            the ledger of compacted records (cp_source.spool.compact)
    w0/                       one directory per factory worker
      lock                    held (flock) by the worker process that writes here
      seg-000000000012.arrow  a published segment (Arrow IPC file); *.tmp are unpublished
      manifest.ndjson         one line per published segment, in segment order
      buckets.bin             int64 records (segment, sender, seq, first_id, count) per bucket published
      rejected.bin            same records for buckets whose header was valid but whose payload was not
      eos.ndjson              end-of-stream totals received by this worker
      stats.json              the worker's counters (replaced atomically)
      deadletter.bin          rejected messages, raw frames (see cp_source.factory.deadletter)

A segment is published by writing ``seg-N.arrow.tmp``, renaming it to
``seg-N.arrow``, appending its bucket records, then its manifest line. The
manifest line is the publication point: ``latest`` and ``segments`` read only
the manifest. A worker that restarts removes tmp files and adopts a renamed
segment whose manifest line is missing (its metadata carries everything the
line needs), so numbering continues and nothing is published twice.

The spool id in ``spool.json`` names this spool, not its path: the stream
reader puts it in every offset and every segment carries it in its metadata,
so a checkpoint or a segment file of another spool is recognised and refused
instead of being read as this one's.

Committed manifest lines and bucket records do not stay: the reader folds them
into ``compacted.json`` and each worker then drops them from its files
(``cp_source.spool.compact``), so a long run's files stay small and its ledger exact.

This module holds the layout and the reading side (:class:`Spool`); a worker writes through
``cp_source.spool.segment_writer.SegmentWriter``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from cp_common.faces import deprecated_names
from cp_source.spool.compact import (
    ABSORB_MIN_SEGMENTS,
    MANIFEST_KEEP,
    ManifestTail,
    fold,
    folded_targets,
)
from cp_source.spool.durability import check_durability
from cp_source.spool.front_records import FRONT_DIR, LEDGER_FILE
from cp_source.spool.ledger import (
    LedgerTails,
    SpoolStats,
    WorkerState,
    read_end_of_stream,
    read_ledger,
    read_ndjson,
    read_records,
    workers_drained,
)
from cp_source.spool.names import WORKER_RE, worker_order
from cp_source.wire.bucket import merge_ranges
from cp_store.atomic_files import atomic_write, fsync_dirs, fsync_path
from cp_store.private_dirs import ensure_private_dir

SEG_RE = re.compile(r"^seg-(\d{12})\.arrow$")
META_KEY = b"cp_segment"
SPOOL_FILE = "spool.json"
SKIPPED_FILE = "skipped.ndjson"
# how long after the end-of-streams a bucket the front end accepted may still be on its way to a worker
IN_FACTORY_SETTLE_S = 2.0


class SpoolMismatchError(ValueError):
    """Offsets or a segment that belong to another spool than the one at hand."""


def read_spool_id(root: str | os.PathLike[str]) -> str | None:
    """The id in ``root/spool.json``; None when the spool has none yet."""
    path = Path(root) / SPOOL_FILE
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as e:
        raise SpoolMismatchError(f"{path} is not a spool identity ({e})") from None
    sid = doc.get("spool_id") if isinstance(doc, dict) else None
    if not isinstance(sid, str) or not sid:
        raise SpoolMismatchError(f"{path} holds no spool_id")
    return sid


def ensure_spool_id(root: str | os.PathLike[str], durable: bool = False) -> str:
    """The spool's id, created now if it has none. Every creator (factory worker, reader) agrees.

    The file appears complete or not at all: it is written under a private name and
    hard-linked into place, which fails when another creator was first (then its id
    wins). Without hard links (some network file systems) it is created with O_EXCL.
    ``durable`` (durability=strict): the file is fsynced before it is named and the spool
    directory (and its parent, which holds a new spool's name) after.
    """
    root = Path(root)
    found = read_spool_id(root)
    if found is not None:
        return found
    ensure_private_dir(root)
    sid = uuid.uuid4().hex
    body = orjson.dumps({"spool_id": sid, "created_wall": time.time(), "created_pid": os.getpid()})
    final = root / SPOOL_FILE
    tmp = root / f"{SPOOL_FILE}.{os.getpid()}.{sid[:8]}.tmp"
    tmp.write_bytes(body)
    try:
        if durable:
            fsync_path(tmp)
        os.link(tmp, final)
    except FileExistsError:
        pass
    except OSError:
        with contextlib.suppress(FileExistsError):
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, body)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dirs(root, root.parent)
    deadline = time.monotonic() + 2.0  # an O_EXCL creator may not have written its id yet
    while True:
        try:
            found = read_spool_id(root)
        except SpoolMismatchError:
            if time.monotonic() > deadline:
                raise
            found = None
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise SpoolMismatchError(f"{final} did not appear")
        time.sleep(0.02)


def segment_meta(schema: pa.Schema) -> dict[str, Any] | None:
    """A segment's own record (``info``, ``buckets``, ``spool``) from its Arrow schema; None if absent."""
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        return None
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) else None


def seg_name(number: int) -> str:
    return f"seg-{number:012d}.arrow"


@dataclass(frozen=True)
class SegmentInfo:
    """One published segment. Event times are epoch milliseconds; ``path`` is resolved on read."""

    worker: str
    number: int
    rows: int
    nbytes: int
    path: str
    tuple_id_min: int
    tuple_id_max: int
    event_time_min: int
    event_time_max: int
    # per sender in the segment: [sender, lowest seq, its event time, highest seq, its event time]
    # (ms); what the ready frontier reads (cp_source.ready.frontier). None in earlier segments.
    senders: list[list[int]] | None = None

    def manifest_line(self) -> bytes:
        d = asdict(self)
        d.pop("path")
        return orjson.dumps(d) + b"\n"


def read_segment(path: str | os.PathLike) -> pa.Table:
    """A segment as an Arrow table, memory-mapped (no copy of the column data)."""
    with pa.memory_map(str(path), "r") as src:
        return pa.ipc.open_file(src).read_all()


def _read_offsets(path: Path) -> dict[str, int]:
    with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
        return {str(k): int(v) for k, v in orjson.loads(path.read_bytes()).items()}
    return {}


def spool_bytes(root: str | os.PathLike[str]) -> int:
    """Bytes of segments no micro-batch has taken yet (the quantity the spool bound limits).

    Segments the reader has already put into a micro-batch do not count: Spark
    commits a batch (and so frees its segments) only when it plans the next batch
    with data, so counting them could pause the factory for good. The disk held is
    therefore at most the bound plus the batch in flight.
    """
    planned = _read_offsets(Path(root) / "planned.json")
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for wd in os.scandir(os.fspath(root)):
            if wd.is_dir() and WORKER_RE.match(wd.name):
                taken = planned.get(wd.name, -1)
                with contextlib.suppress(FileNotFoundError):
                    for e in os.scandir(wd.path):
                        if not e.name.startswith("seg-"):
                            continue
                        m = SEG_RE.match(e.name)
                        if m and int(m.group(1)) <= taken:
                            continue
                        # tmp files count too: they are about to publish
                        with contextlib.suppress(FileNotFoundError):
                            total += e.stat().st_size
    return total


class Spool:
    """The reading side: offsets, segment lists, commit and counters. Safe to create anywhere."""

    def __init__(
        self, root: str | os.PathLike, max_bytes: int = 2 << 30, durability: str = "process"
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        # strict: this side's writes (spool.json, committed.json, planned.json) are fsynced too
        self.durable = check_durability(durability) == "strict"
        self._tails: dict[str, ManifestTail] = {}  # worker -> manifest lines after the committed offset
        self._ledger = LedgerTails(self.root)  # bucket records not compacted yet, read incrementally
        self._id: str | None = None

    def spool_id(self) -> str | None:
        """The spool's identity (``spool.json``), None while nobody has created it."""
        if self._id is None:
            self._id = read_spool_id(self.root)
        return self._id

    def ensure_spool_id(self) -> str:
        """The spool's identity, created now if the spool has none yet."""
        if self._id is None:
            self._id = ensure_spool_id(self.root, durable=self.durable)
        return self._id

    def _check_id(self, spool_id: str | None) -> None:
        """Refuse offsets of another spool (checked under commit.lock, against the file, not a cache)."""
        if spool_id is None:
            return
        actual = read_spool_id(self.root)
        if actual != spool_id:
            raise SpoolMismatchError(
                f"offsets of spool {spool_id} do not belong to spool {self.root} (id {actual}); "
                f"nothing was changed"
            )

    def workers(self) -> list[str]:
        """Worker directories, in worker order (w0, w1, ...)."""
        try:
            names = [e.name for e in os.scandir(self.root) if e.is_dir() and WORKER_RE.match(e.name)]
        except FileNotFoundError:
            return []
        return worker_order(names)

    def _manifest(self, worker: str) -> ManifestTail:
        """The worker's manifest, read incrementally; only lines after the committed offset stay."""
        tail = self._tails.get(worker)
        if tail is None:
            tail = self._tails[worker] = ManifestTail(self.root, worker)
        if len(tail.refresh()) > MANIFEST_KEEP:  # committed segments are never read again
            tail.drop_through(_read_offsets(self.root / "committed.json").get(worker, -1))
        return tail

    def latest(self) -> dict[str, int]:
        """Per worker the highest published segment number (all lower ones are published); -1 if none."""
        out = {}
        for w in self.workers():
            out[w] = self._manifest(w).last
        return out

    def segments(self, worker: str, after: int, upto: int) -> list[SegmentInfo]:
        """Published segments of ``worker`` with after < number <= upto, in order."""
        lines = self._manifest(worker).lines  # from the committed offset on
        base = int(lines[0]["number"]) if lines else 0  # numbers are consecutive in the manifest
        lo = max(after + 1 - base, 0)
        hi = max(upto + 1 - base, 0)
        wdir = self.root / worker
        return [SegmentInfo(path=str(wdir / seg_name(int(d["number"]))), **d) for d in lines[lo:hi]]

    def committed(self) -> dict[str, int]:
        """Committed offsets per worker (-1 when nothing was committed)."""
        out = {w: -1 for w in self.workers()}
        out.update(_read_offsets(self.root / "committed.json"))  # an empty or torn file reads as none
        return out

    def planned(self) -> dict[str, int]:
        """Offsets the stream reader has put into a micro-batch, per worker (-1 when none)."""
        out = {w: -1 for w in self.workers()}
        out.update(_read_offsets(self.root / "planned.json"))
        return out

    def _advance(self, name: str, offsets: dict[str, int]) -> dict[str, int]:
        """Move the offsets in file ``name`` forward to ``offsets`` (never back); the merged offsets.

        Call with ``commit.lock`` held: the reader's driver and tools may write at once.
        """
        cur = _read_offsets(self.root / name)
        merged = dict(cur)
        for w, n in offsets.items():
            if not WORKER_RE.match(w):
                raise ValueError(f"invalid worker name {w!r}")
            merged[w] = max(int(n), cur.get(w, -1))
        if merged != cur:
            # strict: on disk before commit deletes the segments it covers
            atomic_write(self.root / name, orjson.dumps(merged), durable=self.durable)
        return merged

    def mark_planned(self, offsets: dict[str, int], spool_id: str | None = None) -> None:
        """Record that a micro-batch reads up to ``offsets`` (never moving one back); see spool_bytes.

        ``spool_id``: the spool the offsets were taken from; another spool's are refused.
        """
        ensure_private_dir(self.root)
        with open(self.root / "commit.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._check_id(spool_id)
            self._advance("planned.json", offsets)

    def commit(self, offsets: dict[str, int], spool_id: str | None = None) -> None:
        """Record offsets as committed (never moving one back) and delete the segments they cover.

        ``spool_id``: the spool the offsets were taken from; another spool's are refused and
        nothing is deleted.
        """
        ensure_private_dir(self.root)
        with open(self.root / "commit.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._check_id(spool_id)
            merged = self._advance("committed.json", offsets)
            for w, n in merged.items():
                wdir = self.root / w
                with contextlib.suppress(FileNotFoundError):
                    for e in os.scandir(wdir):
                        m = SEG_RE.match(e.name)
                        if m and int(m.group(1)) <= n:
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(e.path)
            with contextlib.suppress(OSError):  # only an optimisation: a full disk retries later
                self._fold(merged, ABSORB_MIN_SEGMENTS)

    def _fold(self, committed: dict[str, int], min_segments: int) -> dict[str, int]:
        """Fold committed records into the ledger summary (``commit.lock`` held); its through."""
        summary = self._ledger.summary()
        targets = folded_targets(committed, self.latest(), summary, min_segments)
        if targets:
            summary = fold(self.root, targets)
        return dict(summary.through)

    def compact(self) -> dict[str, int]:
        """Fold every committed segment's records into ``compacted.json`` now; per worker how far.

        ``commit`` does this by itself every ABSORB_MIN_SEGMENTS segments; each worker then
        drops what was folded from its files (``SegmentWriter.compact``).
        """
        ensure_private_dir(self.root)
        with open(self.root / "commit.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._fold(self.committed(), 1)

    def used_bytes(self) -> int:
        return spool_bytes(self.root)

    def record_skip(self, after: dict[str, int], upto: dict[str, int], reason: str) -> dict[str, Any]:
        """Record that a query will not read the segments in ``(after[w], upto[w]]``; the record.

        The record counts the rows, how many of them no micro-batch had taken yet
        (``planned.json``: the others were in an earlier query's batch), and their exact
        tuple-id ranges from the bucket records, so a skip is counted, never silent.
        """
        planned = self.planned()
        rows = fresh = 0
        ranges: list[list[int]] = []
        for w, hi in upto.items():
            lo = after.get(w, -1)
            for seg in self.segments(w, lo, hi):
                rows += seg.rows
                fresh += seg.rows if seg.number > planned.get(w, -1) else 0
            recs = read_records(self.root / w / "buckets.bin")
            mine = recs[(recs[:, 0] > lo) & (recs[:, 0] <= hi)]
            ranges += [[int(a), int(c)] for a, c in mine[:, 3:5].tolist()]
        rec = {
            "wall": time.time(),
            "reason": reason,
            "spool": self.spool_id(),
            "after": after,
            "upto": upto,
            "rows": rows,
            "rows_never_planned": fresh,
            "ranges": merge_ranges(ranges),
        }
        with open(self.root / SKIPPED_FILE, "ab") as f:
            f.write(orjson.dumps(rec) + b"\n")
        return rec

    def skipped(self) -> list[dict[str, Any]]:
        """Every skip recorded by :meth:`record_skip`, oldest first."""
        return read_ndjson(self.root / SKIPPED_FILE)

    def stats(self) -> SpoolStats:
        """The ledger over all workers: published, rejected, dropped and lost tuples per sender.

        ``lost_in_transit`` lists, per sender whose end-of-stream arrived, the exact
        tuple-id ranges that were neither published, rejected, nor dropped by the
        generator. Senders without end-of-stream are in ``open_senders`` with their
        seq gaps so far.
        """
        workers = self.workers()
        latest = self.latest()  # before the records: only published segments' records count
        return read_ledger(self.root, workers, self.used_bytes(), self.committed(), latest, self._ledger)

    def worker_states(self) -> dict[str, WorkerState]:
        """Each worker's last report, without reading the bucket records (cheap enough to poll)."""
        return {w: WorkerState.read(self.root, w) for w in self.workers()}

    def drained(
        self, senders: Iterable[int] | None = None, quiet_s: float = 0.5, since_wall: float | None = None
    ) -> bool:
        """True once every given sender's end-of-stream arrived and every worker has published all it
        received: live (reported within the last second), nothing pending, not paused, and quiet for
        ``quiet_s`` before its report. ``since_wall``: only reports written after it count.

        The one definition of "the factory has drained"; a dead worker is never drained.
        """
        states = self.worker_states()
        if senders is not None:
            eos = read_end_of_stream(self.root, states)
            if any(int(s) not in eos for s in senders):
                return False
        if not workers_drained(states.values(), quiet_s, since_wall):
            return False
        return senders is None or self._accepted_landed({int(s) for s in senders}, states)

    def _accepted_landed(self, senders: set[int], states: dict[str, WorkerState]) -> bool:
        """Every tuple of ``senders`` the front end accepted is published or rejected, or has been
        missing through ``IN_FACTORY_SETTLE_S`` of worker reports after the end-of-streams.

        A settled worker report does not prove that no bucket is on its way to that worker: on a
        loaded machine the front end forwards a bucket, the sender's end-of-stream is recorded, and
        the worker's last report (still fresh) predates the bucket. Counting then would call the
        bucket lost. The front end's record is exact: its accepted ranges (on file before the
        end-of-stream is) must all be at a worker. One still missing once every worker reported well
        after the end-of-streams was lost with a worker (``in_factory``), and waiting longer would
        not bring it back.
        """
        stats = self.stats()
        if not any(stats.lost_reasons.get(s, {}).get("in_factory") for s in senders):
            return True
        with contextlib.suppress(OSError):
            recorded = (self.root / FRONT_DIR / LEDGER_FILE).stat().st_mtime
            return all(w.updated_wall >= recorded + IN_FACTORY_SETTLE_S for w in states.values())
        return False


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["Spool", "read_segment"])
