"""The writing side of the spool: one worker's directory, its segments and ledger files.

A worker process holds ``flock`` on ``wN/lock`` and is the only writer of its directory.
A segment is published by writing it under a private temporary name, renaming it to
``seg-N.arrow``, appending its bucket records, then its manifest line (the publication
point); a restarted worker removes temporary files, repairs torn appends and adopts a
renamed segment whose manifest line is missing. The layout and the reading side are
``cp_source.spool.segments``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from cp_source.spool.compact import TRIM_CHECK_S, summary_stamp, summary_through, trim_worker_files
from cp_source.spool.durability import DurabilityError, check_durability
from cp_source.spool.intended import INTENDED_KEY
from cp_source.spool.ledger import REC_BYTES, REC_FIELDS, LedgerSummary, read_records
from cp_source.spool.names import WORKER_RE
from cp_source.spool.segments import META_KEY, SEG_RE, SegmentInfo, ensure_spool_id, seg_name
from cp_store.atomic_files import atomic_write, fsync_dirs, fsync_path, replacing_path
from cp_store.private_dirs import ensure_private_dir


def _append_all(f: Any, data: bytes) -> None:
    """Append all of ``data`` to an unbuffered file or nothing: a failed write is cut back."""
    start = os.fstat(f.fileno()).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[f.write(view) :]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(f.fileno(), start)
        raise


class SegmentWriter:
    """The writing side of one worker's spool directory (used by exactly one process, under flock)."""

    _compacted = -1  # the summary's through for this worker when its files were last trimmed
    _compact_at = 0.0  # monotonic time of the next look at the summary
    _summary_seen: tuple[int, int, int] | None = None

    def __init__(
        self,
        root: str | os.PathLike,
        worker: str,
        fsync: bool = False,
        lock_timeout: float = 0.0,
        durability: str = "process",
    ) -> None:
        """``durability``: ``process`` or ``strict`` (see cp_source.spool.durability); ``fsync=True`` is the
        older name for ``strict``."""
        if not WORKER_RE.match(worker):
            raise ValueError(f"invalid worker name {worker!r}: expected w<N>")
        self.durability = "strict" if fsync else check_durability(durability)
        self.durable = self.durability == "strict"
        self.root = Path(root)
        self.worker = worker
        self.dir = self.root / worker
        ensure_private_dir(self.root)
        ensure_private_dir(self.dir)
        # the first worker or reader creates it
        self.spool_id = ensure_spool_id(self.root, durable=self.durable)
        self._lock = open(self.dir / "lock", "a+b")  # noqa: SIM115 - held for the writer's lifetime
        deadline = time.monotonic() + lock_timeout
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._lock.close()
                    raise RuntimeError(
                        f"spool directory {self.dir} is in use by another factory worker"
                    ) from None
                time.sleep(0.05)  # e.g. a previous worker still publishing on its way out
        self.next_number = self._recover()
        # unbuffered: an append that fails (a full disk) is cut back at once, never retried by a buffer
        self._buckets = open(self.dir / "buckets.bin", "ab", buffering=0)  # noqa: SIM115
        self._manifest = open(self.dir / "manifest.ndjson", "ab", buffering=0)  # noqa: SIM115
        if self.durable:
            # what recovery repaired or adopted, the ledger files' names and this directory's name
            os.fsync(self._buckets.fileno())
            os.fsync(self._manifest.fileno())
            fsync_dirs(self.dir, self.root)

    def _recover(self) -> int:
        """Remove tmp files, repair torn appends, adopt renamed-but-unlisted segments; next number."""
        for p in self.dir.glob("*.tmp"):
            p.unlink()
        man = self.dir / "manifest.ndjson"
        raw = man.read_bytes() if man.exists() else b""
        if raw and not raw.endswith(b"\n"):
            raw = raw[: raw.rfind(b"\n") + 1]
            man.write_bytes(raw)
        last = summary_through(self.root, self.worker)  # a trimmed manifest may be empty
        for line in raw.split(b"\n"):
            if line:
                last = max(last, int(orjson.loads(line)["number"]))
        recs_path = self.dir / "buckets.bin"
        recs = read_records(recs_path)
        keep = int(np.searchsorted(recs[:, 0], last, side="right")) if len(recs) else 0
        if recs_path.exists() and recs_path.stat().st_size != keep * REC_BYTES:
            with open(recs_path, "r+b") as f:
                f.truncate(keep * REC_BYTES)
        rej = self.dir / "rejected.bin"
        if rej.exists() and rej.stat().st_size % REC_BYTES:
            with open(rej, "r+b") as f:
                f.truncate(rej.stat().st_size - rej.stat().st_size % REC_BYTES)
        numbers = sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := SEG_RE.match(p.name)))
        orphans = [n for n in numbers if n > last]
        for n in orphans:
            path = self.dir / seg_name(n)
            try:
                with pa.memory_map(str(path), "r") as src:
                    meta = orjson.loads(pa.ipc.open_file(src).schema.metadata[META_KEY])
            except (pa.ArrowInvalid, KeyError, OSError, orjson.JSONDecodeError):
                path.unlink()  # cannot be a renamed segment (rename is atomic); never published
                continue
            meta["info"]["nbytes"] = path.stat().st_size
            with open(recs_path, "ab") as f:
                f.write(np.asarray(meta["buckets"], dtype="<i8").reshape(-1, REC_FIELDS).tobytes())
            with open(man, "ab") as f:
                f.write(orjson.dumps(meta["info"]) + b"\n")
            last = n
        return last + 1

    def max_seq_by_sender(self) -> dict[int, int]:
        """Highest bucket seq per sender already published or rejected here (replay protection)."""
        # of compacted records, the summary keeps the highest seq per sender
        out = dict(LedgerSummary.read(self.root).seq_max.get(self.worker, {}))
        for recs in (read_records(self.dir / "buckets.bin"), read_records(self.dir / "rejected.bin")):
            for sender, seq in zip(recs[:, 1].tolist(), recs[:, 2].tolist(), strict=True):
                if seq > out.get(sender, -1):
                    out[sender] = seq
        return out

    def compact(self, force: bool = False) -> int:
        """Drop from this worker's ledger files what the spool's summary holds; bytes removed.

        Looks at the summary at most every TRIM_CHECK_S (unless ``force``) and trims only when
        it moved. Crash-safe at every step: see cp_source.spool.compact.
        """
        now = time.monotonic()
        if not force and now < self._compact_at:
            return 0
        self._compact_at = now + TRIM_CHECK_S
        seen = summary_stamp(self.root)
        if seen is None or (seen == self._summary_seen and not force):
            return 0
        self._summary_seen = seen
        through = summary_through(self.root, self.worker)
        if through <= self._compacted:
            return 0
        try:
            removed = trim_worker_files(self.root, self.dir, through)
        finally:
            # the append handles follow the files' new names, also when a step failed
            for f in (self._buckets, self._manifest):
                f.close()
            self._buckets = open(self.dir / "buckets.bin", "ab", buffering=0)  # noqa: SIM115
            self._manifest = open(self.dir / "manifest.ndjson", "ab", buffering=0)  # noqa: SIM115
        self._compacted = through
        return removed

    def publish(
        self,
        table: pa.Table,
        buckets: np.ndarray,
        event_min: int,
        event_max: int,
        id_min: int,
        id_max: int,
        senders: list[list[int]] | None = None,
        intended: np.ndarray | None = None,
    ) -> SegmentInfo:
        """Write one segment atomically. ``buckets``: int64 (n, 4) rows of sender, seq, first_id, count;
        ``senders``: per sender its lowest and highest seq with their event times (see SegmentInfo);
        ``intended``: per row of ``buckets``, its intended stamp (``cp_source.spool.intended``)."""
        n = self.next_number
        path = self.dir / seg_name(n)
        recs = np.empty((len(buckets), REC_FIELDS), dtype="<i8")
        recs[:, 0] = n
        recs[:, 1:] = buckets
        info = {
            "worker": self.worker,
            "number": n,
            "rows": table.num_rows,
            "nbytes": 0,
            "tuple_id_min": id_min,
            "tuple_id_max": id_max,
            "event_time_min": event_min,
            "event_time_max": event_max,
        }
        if senders is not None:
            info["senders"] = senders
        # The spool id lets a reader tell this file from one of another spool at the same path.
        meta = {"info": info, "buckets": recs.tolist(), "spool": self.spool_id}
        if intended is not None:
            meta[INTENDED_KEY] = np.asarray(intended, np.int64).tolist()
        schema = table.schema.with_metadata({META_KEY: orjson.dumps(meta)})
        # strict: the data before the name, so a renamed segment is never empty; a full disk leaves
        # nothing of this segment (the temp file is removed) and the caller retries
        with (
            replacing_path(path, durable=self.durable, sync_dir=False) as tmp,
            pa.OSFile(str(tmp), "wb") as sink,
            pa.ipc.new_file(sink, schema) as w,
        ):
            w.write_table(table.replace_schema_metadata(schema.metadata), max_chunksize=1 << 16)
        if self.durable:
            try:
                fsync_path(self.dir)  # the rename lasts before any record claims the segment
            except OSError:
                with contextlib.suppress(OSError):
                    path.unlink()  # not in the manifest yet: unpublished, the caller retries
                raise
        info["nbytes"] = path.stat().st_size
        self._append_records(path, recs.tobytes(), orjson.dumps(info) + b"\n")
        self.next_number = n + 1
        return SegmentInfo(path=str(path), **info)

    def _append_records(self, path: Path, recs: bytes, line: bytes) -> None:
        """Append the bucket records, then the manifest line (the publication point), all or nothing.

        A failed append (a full disk) is cut back, and the renamed segment removed: it
        was never published, and a retry publishes it again under the same number.
        Strict: the records are fsynced before the line is appended (a line that lasts
        never lacks its records), the line after it.
        """
        recs_at = os.fstat(self._buckets.fileno()).st_size
        try:
            _append_all(self._buckets, recs)
            if self.durable:
                os.fsync(self._buckets.fileno())
            _append_all(self._manifest, line)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._buckets.fileno(), recs_at)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        if self.durable:
            try:
                os.fsync(self._manifest.fileno())
            except OSError as e:
                # Readers may have seen the line: it cannot be cut back. The worker dies and its
                # restart recovers from disk (a lost line is adopted from the durable segment).
                raise DurabilityError(f"cannot fsync {self.dir / 'manifest.ndjson'}: {e}") from e

    def _append_ledger(self, name: str, data: bytes) -> None:
        """Append to a ledger file of this directory (rejected.bin, eos.ndjson); strict: fsync it."""
        with open(self.dir / name, "ab") as f:
            f.write(data)
            if self.durable:
                f.flush()
                os.fsync(f.fileno())

    def record_rejected(self, sender: int, seq: int, first_id: int, count: int) -> None:
        # first field: the segment being built (never -1), so compaction can tell when it is final
        n = self.next_number
        self._append_ledger("rejected.bin", np.array([[n, sender, seq, first_id, count]], "<i8").tobytes())

    def record_eos(self, totals: dict[str, Any]) -> None:
        self._append_ledger("eos.ndjson", orjson.dumps(totals) + b"\n")

    def write_stats(self, stats: dict[str, Any]) -> None:
        atomic_write(self.dir / "stats.json", orjson.dumps(stats), durable=self.durable)

    def close(self) -> None:
        for f in (self._buckets, self._manifest):
            f.close()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
