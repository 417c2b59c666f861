"""Compaction: a long run's ledger files stay small while the ledger stays exact.

Each worker appends, per published segment, a manifest line and its bucket
records, and a record per rejected bucket. Left alone these files grow with
the run (about 0.2 KB of manifest and 2 KB of records per segment). What has
been committed is compacted in two steps, each done by the process that owns
what it changes:

1. **Fold** (the reader, in ``Spool.commit``, under ``commit.lock``): when one
   worker's committed segments not yet folded reach ``ABSORB_MIN_SEGMENTS``,
   every worker's records up to its ``K = min(committed, last segment in its
   manifest)`` are folded into ``compacted.json`` at the spool root
   (:class:`cp_source.spool.ledger.LedgerSummary`: per sender merged id ranges
   of published and of rejected buckets, merged seq ranges, record counts; per
   worker ``through = K`` and the highest seq per sender). The summary is
   written under a private name, fsynced, renamed, and the directory fsynced.
   It is one file for all workers because a sender's buckets alternate between
   workers: per worker its ids and seqs do not merge, over all workers they do.
2. **Trim** (the worker, which holds ``flock`` on ``wN/lock`` and is the only
   writer of its files): at most every ``TRIM_CHECK_S`` it reads ``through``
   from the summary and, if it moved, rewrites ``buckets.bin``,
   ``rejected.bin`` and ``manifest.ndjson`` without what is at or below it
   (write ``*.compact.tmp``, fsync, rename over the file, fsync the directory;
   then it reopens its append handles).

A record "is at or below K" by its first field: the segment number for a
bucket record; for a rejected record, the number of the segment being built
when it was rejected (non-decreasing in the file). Both are final once segment
K is in the manifest: records of segment n are appended before its manifest
line, and after segment K is published the worker's next segment number is
above K. So the fold reads a part of each file that no longer changes.

**Why the ledger stays exact.** The ledger is the summary plus the records
each file holds above the summary's ``through``; a record is in exactly one of
them whatever the state of the trim. Readers read the files before the
summary: a file loses records only after the summary holding them was
renamed into place (the worker read it; summaries only grow), so a summary
read later holds whatever the file no longer had.

**Crash safety, step by step** (a SIGKILL or a power loss at any point):

* fold, before the rename: the old summary stands, the files are untouched;
  the next fold starts over (private temp files of a dead fold are removed).
  After the rename: the new summary stands, the files still hold the folded
  records, which readers skip (at or below ``through``).
* trim: each file is replaced by rename, so each is either whole-old or
  whole-new, and both are right (readers skip folded records anyway); a
  crash between the files leaves some trimmed and some not, also right.
  The new file is fsynced before its rename, so a rename that survives a
  power loss never names a file without its records, and the worker fsyncs
  the spool directory (making the summary's rename durable) before it trims.
  A left-over ``*.compact.tmp`` is removed by the worker's recovery (``*.tmp``).
* a restarted worker numbers its next segment after the higher of its
  manifest's last line and ``through`` (the manifest may be trimmed empty),
  and takes its replay protection (highest seq per sender) from the summary too.

Readers of the manifest (``ManifestTail``) and of the records
(``cp_source.spool.ledger.RecordTail``) read incrementally and notice a file
replaced by a trim, then read the new one from its start.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import orjson

from cp_source.spool.ledger import (
    BUCKETS_FILE,
    REC_BYTES,
    REJECTED_FILE,
    SUMMARY_FILE,
    LedgerSummary,
    read_records,
)
from cp_store.atomic_files import atomic_write, fsync_path

MANIFEST_FILE = "manifest.ndjson"
# Fold a worker's committed records once this many committed segments are not yet folded
# (about 25 s at the default flush of 200 ms per worker): a fold then reads a few hundred KB.
ABSORB_MIN_SEGMENTS = 128
TRIM_CHECK_S = 1.0  # how often a worker looks whether the summary moved
MANIFEST_KEEP = 128  # a reader drops committed manifest lines once it holds more than this many


def write_summary(root: Path, summary: LedgerSummary) -> None:
    """Replace ``compacted.json`` durably (call with ``commit.lock`` held)."""
    for stale in root.glob(f"{SUMMARY_FILE}.*.tmp"):  # a fold that died; only folds write these
        with contextlib.suppress(OSError):
            stale.unlink()
    atomic_write(
        root / SUMMARY_FILE, orjson.dumps(summary.to_json()), durable=True, suffix=f".{os.getpid()}.tmp"
    )


def fold(root: Path, targets: dict[str, int]) -> LedgerSummary:
    """Fold into the summary each worker's records up to ``targets[w]`` not folded yet.

    ``targets[w]`` must be a published segment (at most the manifest's last line);
    call with ``commit.lock`` held. The summary is written only when something moved.
    """
    summary = LedgerSummary.read(root)
    moved = False
    for w, k in sorted(targets.items()):
        if k <= summary.through.get(w, -1):
            continue
        parts = []
        for name in (BUCKETS_FILE, REJECTED_FILE):
            recs = summary.unfolded(w, read_records(root / w / name))
            parts.append(recs[recs[:, 0] <= k])
        summary.fold(w, parts[0], parts[1], k)
        moved = True
    if moved:
        write_summary(root, summary)
    return summary


def summary_through(root: Path, worker: str) -> int:
    """The summary's ``through`` for ``worker`` (-1 when none of its records is folded)."""
    return LedgerSummary.read(root).through.get(worker, -1)


def summary_stamp(root: Path) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of the summary, None when there is none: a cheap "did it move"."""
    try:
        st = os.stat(root / SUMMARY_FILE)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _replace(path: Path, data: bytes, tmp_suffix: str) -> None:
    """Replace a worker's ledger file, fsynced before the rename; its directory is fsynced once
    after all of them (``trim_worker_files``)."""
    atomic_write(path, data, durable=True, sync_dir=False, suffix=tmp_suffix)


def _manifest_number(line: bytes) -> int:
    return int(orjson.loads(line)["number"])


def trim_worker_files(root: Path, wdir: Path, through: int) -> int:
    """Drop what is at or below ``through`` from a worker's ledger files; bytes removed.

    Only the worker that holds the directory's lock may call this (it is the only
    appender). Each file is replaced by rename; any crash leaves a correct spool.
    """
    fsync_path(root)  # the summary's rename lasts before any record it holds leaves a file
    removed = 0
    for name in (BUCKETS_FILE, REJECTED_FILE):
        path = wdir / name
        recs = read_records(path)
        keep = recs[recs[:, 0] > through]
        if len(keep) < len(recs):
            before = path.stat().st_size
            _replace(path, keep.tobytes(), ".compact.tmp")
            removed += before - len(keep) * REC_BYTES
    path = wdir / MANIFEST_FILE
    with contextlib.suppress(FileNotFoundError):
        raw = path.read_bytes()
        lines = raw[: raw.rfind(b"\n") + 1].split(b"\n")[:-1]
        kept = [ln for ln in lines if _manifest_number(ln) > through]
        if len(kept) < len(lines):
            body = b"".join(ln + b"\n" for ln in kept) + raw[raw.rfind(b"\n") + 1 :]
            _replace(path, body, ".compact.tmp")
            removed += len(raw) - len(body)
    if removed:
        fsync_path(wdir)
    return removed


class ManifestTail:
    """One worker's manifest as a reader sees it, read incrementally, holding few lines.

    Only lines appended since the last read are parsed. Lines of committed segments
    are dropped (``drop_through``); ``last`` remembers the highest number seen, and
    a manifest the worker trimmed (a new, shorter file) is noticed and read from its
    start, its floor taken from the summary (a manifest may be trimmed empty).
    """

    def __init__(self, root: Path, worker: str) -> None:
        self.root = root
        self.worker = worker
        self.path = root / worker / MANIFEST_FILE
        self.pos = 0
        self.ino = -1
        self.last = -1  # highest segment number known to be published
        self.lines: list[dict[str, Any]] = []  # consecutive numbers, the cache

    def _read(self) -> tuple[bytes, int, int]:
        """(bytes from the read position, that position, inode); from 0 if the file was replaced."""
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            pos = self.pos if st.st_ino == self.ino and st.st_size >= self.pos else 0
            f.seek(pos)
            return f.read(), pos, st.st_ino

    def refresh(self) -> list[dict[str, Any]]:
        """Read the lines appended since the last call; the cached lines."""
        for _ in range(2):
            try:
                chunk, pos, ino = self._read()
            except FileNotFoundError:
                return self.lines
            end = chunk.rfind(b"\n") + 1
            try:
                new = [orjson.loads(ln) for ln in chunk[:end].split(b"\n") if ln]
            except orjson.JSONDecodeError:
                if not pos:
                    raise
                new = None  # read from the middle of a line: the file is another one
            if pos and (new is None or (new and int(new[0]["number"]) != self.last + 1)):
                self.ino = -1  # not the file read so far (an inode reused): read it from its start
                continue
            self._take(new or [], pos, pos + end, ino)
            break
        return self.lines

    def _take(self, new: list[dict[str, Any]], pos: int, end: int, ino: int) -> None:
        self.ino, self.pos = ino, end
        if pos == 0:  # the whole file: keep cached lines only where they lead up to it
            first = int(new[0]["number"]) if new else self.last + 1
            if self.lines and int(self.lines[-1]["number"]) + 1 >= first:
                self.lines = [ln for ln in self.lines if int(ln["number"]) < first]
            else:
                self.lines = []
            # read after the manifest: a trim to T follows a summary with through >= T
            self.last = max(self.last, summary_through(self.root, self.worker))
        self.lines += new
        if new:
            self.last = max(self.last, int(new[-1]["number"]))

    def drop_through(self, committed: int) -> None:
        """Forget lines of segments at or below ``committed``."""
        if self.lines and int(self.lines[0]["number"]) <= committed:
            self.lines = [ln for ln in self.lines if int(ln["number"]) > committed]


def folded_targets(
    committed: dict[str, int], latest: dict[str, int], summary: LedgerSummary, min_segments: int
) -> dict[str, int]:
    """Per worker, how far to fold (committed and published); nothing until one worker is at least
    ``min_segments`` on. Then every worker folds as far as it can: a sender's buckets alternate
    between workers, so its ranges merge in the summary only where all workers are folded."""
    out = {}
    for w, c in committed.items():
        k = min(c, latest.get(w, -1))
        if k > summary.through.get(w, -1):
            out[w] = k
    if any(k - summary.through.get(w, -1) >= max(1, min_segments) for w, k in out.items()):
        return out
    return {}


def ledger_file_bytes(wdir: Path) -> dict[str, int]:
    """Sizes of a worker's ledger files (for reports)."""
    out = {}
    for name in (MANIFEST_FILE, BUCKETS_FILE, REJECTED_FILE):
        try:
            out[name] = (wdir / name).stat().st_size
        except FileNotFoundError:
            out[name] = 0
    return out
