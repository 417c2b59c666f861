"""The "cloudprofiler" streaming sink: stamp, apply a handler, stage Parquet, publish on commit.

Executors (``write``): each Arrow batch gets one sink stamp (``cp_tsc_sink``,
``cp_node_sink``: the batch arrives at the sink as a unit), the handler picks
the tuples to keep, and the records go to Parquet (zstd) in a staging
directory of this task attempt alone. A retried or speculative attempt stages
somewhere else; only attempts whose commit message reaches the driver are
published.

Driver (``commit``): the staged files of all messages move into a fresh
directory under ``_publishing`` together with ``_counts.parquet``, which is then
renamed to ``batch=<id>`` in one step. If ``batch=<id>`` already exists the
batch was published before (a replay after a restart) and the new staging is
dropped. ``abort`` removes the staging of the failed batch.

Window mode (option ``windowColumn``, the ``struct<start, end>`` column of ``F.window``): the
rows of a windowed aggregation have no tuple id; each row is kept whole as a window record
(``window_start_ms``, ``window_end_ms``, its scalar columns and the sink stamp, see
``cp_sink.window_records``) in ``windows-*.parquet``, published the same way.

Options: ``path`` (required), ``handler`` (identity, downsample, xoy, firstlast,
pc, null; default identity; ``id`` is accepted for identity), ``n``, ``x``, ``y``,
``periodMs``, ``tupleIdColumn`` (default ``tuple_id``), ``windowColumn`` and ``durability``;
any other name is refused (a typo such as ``handlr`` would otherwise run the default):

* ``process`` (default): a published batch survives a crash of any process (the
  publication is one rename), but nothing is fsynced: after an OS crash or power
  loss a batch published in the last seconds may be missing or hold empty files.
* ``strict``: also survives an OS crash or power loss. Each task fsyncs its
  Parquet files when it closes them; the driver fsyncs ``_counts.parquet`` and the
  batch directory before the publishing rename and ``path`` after it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from cp_sink.records import (
    COUNTS_FILE,
    COUNTS_SCHEMA,
    PERIODS_PREFIX,
    PERIODS_SCHEMA,
    PUBLISHING,
    RECORDS_PREFIX,
    STAGING,
    TUPLE_ID,
    WINDOWS_PREFIX,
)
from cp_sink.window_records import fsync_path, window_columns, window_counts, window_rows
from native_tsc.stamp_columns import SINK, is_stamp_column, node_column, stamp_columns, tsc_column

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark's micro-batch engine on every task
DURABILITY_LEVELS = ("process", "strict")
ROWS_PER_ROW_GROUP = 1 << 18
# The sink's options as the user spells them; Spark adds checkpointLocation and queryName itself.
SINK_OPTIONS = (
    "path",
    "handler",
    "n",
    "x",
    "y",
    "periodMs",
    "tupleIdColumn",
    "windowColumn",
    "durability",
    "sync",
    "syncEvery",
    "curveKeys",
    "syncPort",
)
_SPARK_OPTIONS = ("checkpointlocation", "queryname")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task attempt staged: its directory, files and counts."""

    staging_dir: str
    files: list[str]
    counts: dict[str, Any] = field(default_factory=dict)
    periods: list[tuple[str, int, int]] = field(default_factory=list)


def _ours(messages: list[WriterCommitMessage | None]) -> list[SinkCommitMessage]:
    """The tasks' messages (None for a task that sent none); anything else is a bug, not skipped."""
    out = []
    for m in messages:
        if m is None:
            continue
        if not isinstance(m, SinkCommitMessage):
            raise TypeError(f"unexpected commit message {type(m).__name__}")
        out.append(m)
    return out


def _options(options: dict[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def check_sink_options(options: dict[str, str]) -> None:
    """Refuse option names the sink does not know, in one line naming them and listing the valid ones."""
    known = {o.lower() for o in SINK_OPTIONS} | set(_SPARK_OPTIONS)
    unknown = sorted(str(k) for k in options if str(k).lower() not in known)
    if unknown:
        raise ValueError(
            f"unknown option(s) for the cloudprofiler sink: {', '.join(unknown)} "
            f"(valid: {', '.join(SINK_OPTIONS)})"
        )


def _durable(opts: dict[str, str]) -> bool:
    """The ``durability`` option as "fsync or not"; a bad value raises one line naming it."""
    raw = opts.get("durability", "process").strip().lower()
    if raw not in DURABILITY_LEVELS:
        raise ValueError(f"option durability={raw!r}: expected one of {', '.join(DURABILITY_LEVELS)}")
    return raw == "strict"


def _task_identity() -> tuple[int, int, str]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # called outside Spark (a unit test driving write() directly)
        return 0, 0, "x"
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    return ctx.partitionId(), ctx.taskAttemptId(), batch if batch and batch.isdigit() else "x"


class _RecordFile:
    """A Parquet file in the staging directory, opened on the first rows."""

    def __init__(self, path: Path, durable: bool = False) -> None:
        self.path = path
        self.durable = durable
        self._writer: Any = None
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._pending.append(batch)
        self._rows += batch.num_rows
        if self._rows >= ROWS_PER_ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending)
        if self._writer is None:
            # Stamps and ids grow slowly, so delta bit-packing shrinks them ~50x and is cheaper to
            # write than dictionaries; node ids are few strings, so they get a dictionary.
            ints = [f.name for f in table.schema if pa.types.is_integer(f.type)]
            self._writer = pq.ParquetWriter(
                self.path,
                table.schema,
                compression="zstd",
                use_dictionary=[f.name for f in table.schema if f.name not in ints],
                column_encoding=dict.fromkeys(ints, "DELTA_BINARY_PACKED"),
            )
        self._writer.write_table(table, row_group_size=ROWS_PER_ROW_GROUP)
        self._pending, self._rows = [], 0

    def close(self) -> bool:
        """Write what is pending; True if the file exists."""
        self._flush()
        if self._writer is None:
            return False
        self._writer.close()
        if self.durable:
            fsync_path(self.path)  # on the executor that wrote it, before the driver may publish it
        return True


@dataclass
class _Tally:
    """The tuple ids a task saw and the sink stamps of its first and last batch."""

    seen: int = 0
    first_id: int | None = None
    last_id: int | None = None
    min_id: int | None = None
    max_id: int | None = None
    first_tsc: int | None = None
    last_tsc: int | None = None

    def add(self, ids: np.ndarray, tsc: int) -> None:
        self.seen += len(ids)
        if self.first_id is None:
            self.first_id, self.first_tsc = int(ids[0]), tsc
        lo, hi = int(ids.min()), int(ids.max())
        self.min_id = lo if self.min_id is None else min(self.min_id, lo)
        self.max_id = hi if self.max_id is None else max(self.max_id, hi)
        self.last_id, self.last_tsc = int(ids[-1]), tsc

    def counts(self, written: int) -> dict[str, Any]:
        return {
            "seen": self.seen,
            "written": written,
            "first_tuple_id": self.first_id,
            "last_tuple_id": self.last_id,
            "min_tuple_id": self.min_id,
            "max_tuple_id": self.max_id,
        }


def _add_first_last(records: _RecordFile, seen: int, first: pa.RecordBatch, last: pa.RecordBatch) -> int:
    """firstlast: add the first and last record, with their role (one "only" row if the task saw one)."""
    roles = ["only"] if seen == 1 else ["first", "last"]
    rows = [first] if seen == 1 else [first, last]
    for role, row in zip(roles, rows, strict=True):
        records.add(row.append_column("role", pa.array([role])))
    return len(rows)


class CloudprofilerStreamWriter(DataSourceStreamArrowWriter):
    """Arrow stream writer of latency records (see the module docstring)."""

    def __init__(self, schema: Any, options: dict[str, str], overwrite: bool) -> None:
        from cp_sink.handlers import parse_handler

        opts = _options(options)
        check_sink_options(opts)
        if not opts.get("path"):
            raise ValueError("the cloudprofiler sink needs option 'path'")
        self.path = os.path.abspath(opts["path"])  # workers may not share the driver's cwd
        self.spec = parse_handler(opts.get("handler", "identity"), opts)
        self.durable = _durable(opts)
        self._root_synced = False  # strict: the parent of path is fsynced once, on the first commit
        self.overwrite = overwrite
        self.window_column = opts.get("windowcolumn")
        if self.window_column is not None:
            self.keep = self._window_mode(schema, opts)
            return
        self.id_column = opts.get("tupleidcolumn", TUPLE_ID)
        names = list(schema.fieldNames()) if schema is not None else []
        if self.id_column not in names:
            raise ValueError(
                f"the cloudprofiler sink needs a tuple id column {self.id_column!r} (option tupleIdColumn); "
                f"the query has {names}"
            )
        # Keep tuple id and stamps only; the sink stamp is added per batch.
        self.keep = [self.id_column] + [
            n for n in names if is_stamp_column(n) and n not in stamp_columns(SINK)
        ]

    def _window_mode(self, schema: Any, opts: dict[str, str]) -> list[str]:
        """Check the options and schema of window mode; the scalar columns to keep."""
        if not self.window_column:
            raise ValueError("option windowColumn is empty: name the query's window column (e.g. window)")
        if "tupleidcolumn" in opts:
            raise ValueError(
                "option tupleIdColumn cannot be combined with windowColumn: window results have no tuple id"
            )
        if self.spec.name != "identity":
            raise ValueError(
                f"option handler={opts['handler']!r} cannot be combined with windowColumn: "
                f"every window result is kept (handler identity)"
            )
        if schema is None:
            raise ValueError(f"option windowColumn={self.window_column!r}: the query has no schema")
        return window_columns(schema, self.window_column)

    # ---- executors -------------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        import native_tsc
        from cp_sink.handlers import selected_positions

        partition, attempt, batch_tag = _task_identity()
        staging = Path(self.path) / STAGING / f"b{batch_tag}-p{partition}-a{attempt}-{uuid.uuid4().hex[:12]}"
        staging.mkdir(parents=True, exist_ok=False)
        node = native_tsc.domain_id()
        if self.window_column is not None:
            return self._write_windows(iterator, staging, partition, attempt, node)
        spec = self.spec
        records = _RecordFile(staging / f"{RECORDS_PREFIX}p{partition}-a{attempt}.parquet", self.durable)
        tally = _Tally()
        written = 0
        fl_first: pa.RecordBatch | None = None
        fl_last: pa.RecordBatch | None = None
        batch_tscs: list[int] = []  # pc: one sink stamp and row count per Arrow batch
        batch_rows: list[int] = []
        period_cycles = spec.params.get("periodMs", 0) * native_tsc.frequency_hz() / 1000.0

        for batch in iterator:
            tsc = native_tsc.now()
            n = batch.num_rows
            if n == 0:
                continue
            ids = self._ids(batch)
            tally.add(ids, tsc)
            if spec.name == "pc":
                batch_tscs.append(tsc)
                batch_rows.append(n)
                continue
            if spec.name == "null":
                continue
            if spec.name == "firstlast":
                if fl_first is None:
                    fl_first = self._record_batch(batch.slice(0, 1), ids[:1], tsc, node, partition)
                fl_last = self._record_batch(batch.slice(n - 1, 1), ids[n - 1 :], tsc, node, partition)
                continue
            out = self._record_batch(batch, ids, tsc, node, partition)
            pos = selected_positions(spec, ids)
            if pos is not None:
                out = out.take(pa.array(pos))
            written += out.num_rows
            records.add(out)

        if fl_first is not None and fl_last is not None:
            written += _add_first_last(records, tally.seen, fl_first, fl_last)
        files = [records.path.name] if records.close() else []
        counts = {
            "partition": partition,
            "task_attempt": attempt,
            "handler": spec.describe(),
            **tally.counts(written),
            node_column(SINK): node,
            "first_tsc_sink": tally.first_tsc,
            "last_tsc_sink": tally.last_tsc,
        }
        name = f"{PERIODS_PREFIX}p{partition}-a{attempt}.parquet"
        if self._write_periods(staging / name, partition, node, period_cycles, batch_tscs, batch_rows):
            files.append(name)
        return SinkCommitMessage(staging_dir=str(staging), files=files, counts=counts)

    def _write_windows(
        self, iterator: Iterator[pa.RecordBatch], staging: Path, partition: int, attempt: int, node: str
    ) -> SinkCommitMessage:
        """Window mode: every row as a window record with the sink stamp of its Arrow batch."""
        import native_tsc

        assert self.window_column is not None
        out = _RecordFile(staging / f"{WINDOWS_PREFIX}p{partition}-a{attempt}.parquet", self.durable)
        node_dict = pa.array([node])
        seen = 0
        tscs: list[int] = []
        for batch in iterator:
            tsc = native_tsc.now()
            n = batch.num_rows
            if n == 0:
                continue
            stamped = batch.select(self.keep + [self.window_column])
            stamped = stamped.append_column(tsc_column(SINK), pa.array(np.full(n, tsc, np.int64)))
            stamped = stamped.append_column(
                node_column(SINK), pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), node_dict)
            )
            out.add(window_rows(stamped, self.window_column, self.keep + list(stamp_columns(SINK))))
            seen += n
            tscs.append(tsc)
        files = [out.path.name] if out.close() else []
        counts = window_counts(seen, node, tscs, partition, attempt)
        return SinkCommitMessage(staging_dir=str(staging), files=files, counts=counts)

    def _ids(self, batch: pa.RecordBatch) -> np.ndarray:
        ids = batch.column(self.id_column)
        if ids.null_count:
            raise ValueError(f"tuple id column {self.id_column!r} has nulls")
        return ids.cast(pa.int64()).to_numpy(zero_copy_only=False)

    def _write_periods(
        self,
        path: Path,
        partition: int,
        node: str,
        period_cycles: float,
        batch_tscs: list[int],
        batch_rows: list[int],
    ) -> bool:
        """pc: write the task's row count per period to ``path``; False if it has none."""
        from cp_sink.handlers import period_counts

        periods = period_counts(np.array(batch_tscs, np.int64), period_cycles, np.array(batch_rows, np.int64))
        if not periods:
            return False
        table = pa.table(
            {
                "partition": pa.array([partition] * len(periods), pa.int32()),
                node_column(SINK): pa.array([node] * len(periods)),
                "period": pa.array(list(periods), pa.int64()),
                "period_ms": pa.array([self.spec.period_ms] * len(periods), pa.int64()),
                "period_cycles": pa.array([period_cycles] * len(periods), pa.float64()),
                "count": pa.array(list(periods.values()), pa.int64()),
            },
            schema=PERIODS_SCHEMA,
        )
        import pyarrow.parquet as pq

        pq.write_table(table, path, compression="zstd")
        if self.durable:
            fsync_path(path)
        return True

    def _record_batch(
        self, batch: pa.RecordBatch, ids: np.ndarray, tsc: int, node: str, partition: int
    ) -> pa.RecordBatch:
        n = batch.num_rows
        cols = [pa.array(ids, pa.int64())] + [_dictionary(batch.column(c)) for c in self.keep[1:]]
        names = [TUPLE_ID] + self.keep[1:]
        cols += [
            pa.array(np.full(n, tsc, np.int64)),
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([node])),
            pa.array(np.full(n, partition, np.int32)),
        ]
        names += [*stamp_columns(SINK), "partition"]
        return pa.RecordBatch.from_arrays(cols, names=names)

    # ---- driver ----------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the staged output of ``batchId`` atomically, once."""
        import pyarrow.parquet as pq

        root = Path(self.path)
        final = root / f"batch={batchId}"
        msgs = _ours(messages)
        if final.exists():
            # Published before the restart that replays it: the replayed copy is dropped.
            self._remove_staging(msgs)
            self._sweep(batchId)
            return
        tmp = root / PUBLISHING / f"batch={batchId}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir(parents=True)
        rows = []
        for m in msgs:
            for name in m.files:
                os.replace(Path(m.staging_dir) / name, tmp / name)
            rows.append({"batch_id": batchId, **m.counts})
        counts = pa.Table.from_pylist(rows, schema=COUNTS_SCHEMA)
        pq.write_table(counts, tmp / COUNTS_FILE, compression="zstd")
        self._publish(tmp, final)
        self._remove_staging(msgs)
        self._sweep(batchId)

    def _publish(self, tmp: Path, final: Path) -> None:
        """Rename the batch directory into place. Strict: its files (the tasks fsynced theirs) and
        the directory itself are on disk before the rename, and the rename is before we return."""
        if self.durable:
            fsync_path(tmp / COUNTS_FILE)
            fsync_path(tmp)
        os.rename(tmp, final)  # the publication: atomic on one filesystem
        if self.durable:
            fsync_path(final.parent)
            if not self._root_synced:  # path itself may be new: its name lives in its parent
                fsync_path(final.parent.parent)
                self._root_synced = True

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Remove what the tasks of a failed micro-batch staged."""
        self._remove_staging(_ours(messages))
        self._sweep(batchId, include_current=True)

    @staticmethod
    def _remove_staging(msgs: list[SinkCommitMessage]) -> None:
        for m in msgs:
            shutil.rmtree(m.staging_dir, ignore_errors=True)

    def _sweep(self, batch_id: int, include_current: bool = True) -> None:
        # Attempts that never reached commit (failed, retried, speculative) leave staging behind;
        # so does a publication cut short by a crash.
        root = Path(self.path)
        for d in (root / STAGING).glob("b*-p*"):
            tag = d.name[1 : d.name.index("-")]
            if tag.isdigit() and (int(tag) < batch_id or (include_current and int(tag) == batch_id)):
                shutil.rmtree(d, ignore_errors=True)
        for d in (root / PUBLISHING).glob(f"batch={batch_id}-*"):
            shutil.rmtree(d, ignore_errors=True)


def _dictionary(col: pa.Array) -> pa.Array:
    # Node id columns hold a handful of distinct strings: encode once here, not per Parquet page.
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        import pyarrow.compute as pc

        return pc.dictionary_encode(col)
    return col
