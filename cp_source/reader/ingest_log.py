"""The ingest log: what each micro-batch of the source handed to Spark, one row per bucket.

With the reader option ``progressLog=DIR`` (a path or URI: ``s3://``, ``s3a://``, ``gs://``,
``hdfs://``, ...) every partition an executor reads
writes one Parquet file under ``DIR/ingest/`` when it has handed all its rows to
Spark. A row is one bucket (one sender's tuples that share a ``gen`` stamp and an
event time): its tuple count, first tuple id, event time range, and its ``gen``,
``factory`` and ``source`` stamps. The file names the micro-batch by
``batch_key``: a digest of the batch's end offset, which Spark also writes to the
query's checkpoint (``offsets/<batchId>``), so the log joins the checkpoint
without the reader knowing batch ids. Windowed queries aggregate the tuples
away; this log is what keeps their generation and ingestion times
(``cloudprofiler progress``, docs/progress.md).

A file appears whole or not at all (write-then-rename locally, one upload on an
object store), so a task that dies leaves none; a retried task writes another
file for the same buckets, and ``read_ingest_log`` keeps one row per bucket (the
last attempt's: files are ordered by modification time, then by the time in
their name, as an object store's times are whole seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cp_common.printable import first_line
from cp_common.stamp_columns import FACTORY, GEN, SOURCE, node_column, tsc_column
from cp_store.location import Location, check_writable, resolve
from cp_store.tables import HIDDEN, parent, write_parquet

INGEST_DIR = "ingest"
MAX_LOG_FILES = 1_000_000  # bounds what read_ingest_log will open

INGEST_SCHEMA = pa.schema(
    [
        ("batch_key", pa.string()),
        ("sender_id", pa.int32()),
        ("first_tuple_id", pa.int64()),
        ("count", pa.int64()),
        ("event_ms_min", pa.int64()),
        ("event_ms_max", pa.int64()),
        (tsc_column(GEN), pa.int64()),
        (node_column(GEN), pa.string()),
        (tsc_column(FACTORY), pa.int64()),
        (node_column(FACTORY), pa.string()),
        (tsc_column(SOURCE), pa.int64()),
        (node_column(SOURCE), pa.string()),
    ]
)
_KEYS = ["sender_id", tsc_column(GEN), node_column(GEN)]


def batch_key(end_offset: Mapping[str, Any] | str) -> str:
    """The digest of a micro-batch's end offset (a dict, or its JSON as Spark's checkpoint holds it)."""
    value = json.loads(end_offset) if isinstance(end_offset, str) else dict(end_offset)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class IngestLogger:
    """Collects one partition's buckets as its batches go to Spark; ``close`` publishes the file."""

    def __init__(self, log_dir: str, key: str) -> None:
        self._log_dir = log_dir  # the raw path or URI (credentials and all): resolved, never printed
        self.key = key
        self.parts: list[pa.Table] = []

    def observe(self, batch: pa.RecordBatch) -> None:
        """Aggregate one stamped batch (segment columns plus the source stamp) per bucket."""
        t = pa.Table.from_batches([batch])
        ev = pc.cast(t.column("event_time"), pa.int64())  # timestamp[us] -> us
        t = t.append_column("event_ms", pc.divide(ev, 1000))
        g = t.group_by(_KEYS, use_threads=False).aggregate(
            [
                ("tuple_id", "count"),
                ("tuple_id", "min"),
                ("event_ms", "min"),
                ("event_ms", "max"),
                (tsc_column(FACTORY), "min"),
                (node_column(FACTORY), "min"),
                (tsc_column(SOURCE), "min"),
                (node_column(SOURCE), "min"),
            ]
        )
        self.parts.append(g)

    def close(self) -> None:
        """Write the partition's buckets (nothing when it read none)."""
        if not self.parts:
            return
        t = pa.concat_tables(self.parts)
        # a bucket split over two Arrow batches: one row, the earlier source stamp
        g = t.group_by(_KEYS, use_threads=False).aggregate(
            [
                ("tuple_id_count", "sum"),
                ("tuple_id_min", "min"),
                ("event_ms_min", "min"),
                ("event_ms_max", "max"),
                (tsc_column(FACTORY) + "_min", "min"),
                (node_column(FACTORY) + "_min", "min"),
                (tsc_column(SOURCE) + "_min", "min"),
                (node_column(SOURCE) + "_min", "min"),
            ]
        )
        n = g.num_rows
        out = pa.table(
            {
                "batch_key": pa.repeat(pa.scalar(self.key, pa.string()), n),
                "sender_id": g.column("sender_id").cast(pa.int32()),
                "first_tuple_id": g.column("tuple_id_min_min"),
                "count": g.column("tuple_id_count_sum"),
                "event_ms_min": g.column("event_ms_min_min"),
                "event_ms_max": g.column("event_ms_max_max"),
                tsc_column(GEN): g.column(tsc_column(GEN)),
                node_column(GEN): g.column(node_column(GEN)).cast(pa.string()),
                tsc_column(FACTORY): g.column(tsc_column(FACTORY) + "_min_min"),
                node_column(FACTORY): g.column(node_column(FACTORY) + "_min_min").cast(pa.string()),
                tsc_column(SOURCE): g.column(tsc_column(SOURCE) + "_min_min"),
                node_column(SOURCE): g.column(node_column(SOURCE) + "_min_min").cast(pa.string()),
            },
            schema=INGEST_SCHEMA,
        )
        name = f"{self.key}-{time.time_ns():020d}-{uuid.uuid4().hex}.parquet"
        try:
            write_parquet(out, log_location(self._log_dir).join(name))
        except OSError as e:
            # the task fails and Spark retries it: its rows are not taken without their log
            raise OSError(e.errno, f"option progressLog: cannot write the ingest log: {e}") from None


def log_location(log_dir: str | os.PathLike[str] | Location) -> Location:
    """Where the ingest log of ``progressLog=log_dir`` lives (``<log_dir>/ingest``)."""
    return resolve(log_dir).join(INGEST_DIR)


def check_progress_log(log_dir: str) -> None:
    """Fail at the query's start, in one line naming the option, if ``progressLog`` cannot be written
    (an unknown scheme, an unreachable store, a missing bucket)."""
    try:
        check_writable(log_location(log_dir))
    except OSError as e:
        raise ValueError(f"option progressLog: {e}") from None


def _log_files(root: Location) -> list[Location]:
    """The log's files, oldest first: by modification time, then by the writer's time in the name."""
    try:
        infos = root.fs.get_file_info(pafs.FileSelector(root.path, allow_not_found=True))
    except OSError as e:
        raise ValueError(f"ingest log {root.uri}: {first_line(e)}") from None
    infos = [i for i in infos if i.type == pafs.FileType.File and _is_log_file(i.base_name)]
    if len(infos) > MAX_LOG_FILES:
        raise ValueError(f"{root.uri} holds {len(infos)} log files, more than {MAX_LOG_FILES}")
    infos.sort(key=lambda i: (i.mtime_ns or 0, _written_ns(i.base_name), i.base_name))
    return [root.join(i.base_name) for i in infos]


def _is_log_file(name: str) -> bool:
    return name.endswith(".parquet") and not name.startswith(HIDDEN)


def _written_ns(name: str) -> int:
    """The writer's clock in a file name ``<key>-<ns>-<uuid>.parquet`` (0 for older names)."""
    parts = name.split("-")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


def read_ingest_log(log_dir: str | os.PathLike[str] | Location) -> pa.Table:
    """Every bucket the source handed to Spark, once (a retried partition's last file wins).

    ``log_dir`` is the source's ``progressLog``: a path or URI."""
    root = log_location(log_dir)
    if not root.is_dir():
        where = parent(root).uri
        raise ValueError(f"no ingest log under {where} (the source's option progressLog writes one)")
    files = _log_files(root)
    if not files:
        return INGEST_SCHEMA.empty_table()
    tables = []
    for i, f in enumerate(files):
        try:
            t = pq.read_table(f.path, filesystem=f.fs, schema=INGEST_SCHEMA)
        except (OSError, pa.ArrowInvalid) as e:
            raise ValueError(f"ingest log file {f.uri} is unreadable: {first_line(e)}") from None
        tables.append(t.append_column("_file", pa.repeat(pa.scalar(i, pa.int32()), t.num_rows)))
    t = pa.concat_tables(tables)
    # the last file written for a bucket wins
    last = t.group_by(["sender_id", "first_tuple_id"], use_threads=False).aggregate([("_file", "max")])
    t = t.join(last, ["sender_id", "first_tuple_id"], use_threads=False)
    t = t.filter(pc.equal(t.column("_file"), t.column("_file_max")))
    return t.select(INGEST_SCHEMA.names).sort_by([(tsc_column(SOURCE), "ascending")])
