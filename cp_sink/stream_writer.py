"""The "cloudprofiler" streaming sink: stamp, apply a handler, write Parquet, publish on commit.

``path`` is a directory or a URI on any store ``pyarrow.fs`` knows (``s3://``, Hadoop's
``s3a://``, ``gs://``, ``hdfs://``, ``abfs://``, ``file://``; see ``cp_store.location``). The
writer keeps the string it was given and resolves it on each process (driver and executors), with
the credentials of that process's standard chain. Publication needs no rename
(``cp_store.batch_log``): files under unique names, one manifest per batch written last.

Executors (``write``): each Arrow batch gets one sink stamp (``cp_tsc_sink``,
``cp_node_sink``: the batch arrives at the sink as a unit), the handler picks
the tuples to keep, and the records go to Parquet (zstd) under ``_attempts/<query id>/batch=<id>/``
(where no plain reader lists), in files named after the partition, the task attempt and a random
part: a retried or speculative attempt never shares a file with another. A file is invisible
until a manifest lists it.

Driver (``commit``): one manifest, ``_commits/<id>.json``, lists the files of exactly the
messages Spark passed with their rows, holds the counts (one row per partition) and names the run
(the query's id and checkpoint); writing it publishes the batch, after which the files move to
``batch=<id>/`` and Spark's file-sink log names them. A path another run published on is
refused. If the manifest exists the batch was published before (a replay after a restart): the
replay's files are deleted and nothing is published again. ``abort`` and every commit delete
the files of attempts that no manifest lists. The location is checked when the query starts
(when Spark creates the writer on the driver): an unknown scheme, an unreachable store or a
missing bucket fails then, in one line naming the path without credentials.

Window mode (option ``windowColumn``, the ``struct<start, end>`` column of ``F.window``): the
rows of a windowed aggregation have no tuple id; each row is kept whole as a window record
(``window_start_ms``, ``window_end_ms``, its scalar columns and the sink stamp, see
``cp_sink.window_records``) in ``windows-*.parquet``, published the same way.

Options: ``path`` (required), ``handler`` (identity, downsample, xoy, firstlast,
pc, null; default identity; ``id`` is accepted for identity), ``n``, ``x``, ``y``,
``periodMs``, ``tupleIdColumn`` (default ``tuple_id``), ``keepColumns`` (query columns carried
into each record beside the stamps: latency by key; with ``pc``, tuples per period and key),
``windowColumn`` and ``durability``; any other name is refused (a typo such as ``handlr`` would
otherwise run the default):

* ``process`` (default): a published batch survives a crash of any process (the
  publication is one all-or-nothing write), but nothing is fsynced: after an OS crash or power
  loss a batch published in the last seconds on a local disk may be missing or hold empty files.
* ``strict``: also survives an OS crash or power loss of a local filesystem. Each task fsyncs
  its Parquet files when it closes them; the driver fsyncs the batch directory and ``path``
  before the manifest, the manifest before its rename and ``_commits/`` after it. On an object
  store a completed upload is durable: the option changes nothing there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from cp_common.options import check_names, flag_option, lower_keys
from cp_common.printable import first_line, redact
from cp_common.stamp_columns import SINK, is_stamp_column, node_column, stamp_columns, tsc_column
from cp_sink.records import (
    PERIODS_PREFIX,
    PERIODS_SCHEMA,
    RECORDS_PREFIX,
    TUPLE_ID,
    WINDOWS_PREFIX,
    CommitCounts,
    sink_input_columns,
)
from cp_sink.window_records import parquet_options, window_columns, window_counts, window_rows
from cp_store import batch_log
from cp_store.location import Location, StoreError, check_writable, resolve

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark's micro-batch engine on every task
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # the query's id, kept in its checkpoint across restarts
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
    "keepColumns",
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
    """What one task attempt wrote: its files (relative to ``path``, each written under ``staged``
    until the commit publishes it) with their row counts, its counts row and its query's id."""

    files: list[str]
    counts: CommitCounts
    rows: list[int] = field(default_factory=list)
    query_id: str | None = None
    staged: str | None = None


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


def check_sink_options(options: dict[str, str]) -> None:
    """Refuse option names the sink does not know, in one line naming each (with the nearest valid
    name) and listing the valid ones; Spark's own (checkpointLocation, queryName) pass."""
    given = [k for k in options if str(k).lower() not in _SPARK_OPTIONS]
    check_names(given, SINK_OPTIONS, "the cloudprofiler sink")


def _task_identity() -> tuple[int, int, str, str | None]:
    """The task's partition, attempt id, batch tag and query id (None outside a streaming query)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # called outside Spark (a unit test driving write() directly)
        return 0, 0, batch_log.UNKNOWN_BATCH, None
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    tag = batch if batch and batch.isdigit() else batch_log.UNKNOWN_BATCH
    return ctx.partitionId(), ctx.taskAttemptId(), tag, ctx.getLocalProperty(QUERY_ID_PROPERTY) or None


# Locations checked by this process: Spark creates a writer on the driver at the query's start
# and again for every commit, and one check per process is enough.
_CHECKED: set[str] = set()  # of Location.identity: the printable URI may name two places


def _check_location(loc: Location) -> None:
    """Check that the store of ``loc`` is reachable and writable, once per process."""
    if loc.identity not in _CHECKED:
        check_writable(loc)
        _CHECKED.add(loc.identity)


class _RecordFile:
    """A Parquet file of one task attempt, opened on the first rows."""

    def __init__(self, loc: Location, rel: str, durable: bool = False) -> None:
        self.loc = loc
        self.rel = rel  # the name the manifest lists: relative to the sink's path
        self.durable = durable
        self._writer: Any = None
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0
        self.total = 0  # rows added: the count the manifest lists for this file

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._pending.append(batch)
        self._rows += batch.num_rows
        self.total += batch.num_rows
        if self._rows >= ROWS_PER_ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending)
        with _store_errors(self.loc):
            if self._writer is None:
                batch_log.prepare(self.loc)
                self._writer = pq.ParquetWriter(
                    self.loc.path, table.schema, filesystem=self.loc.fs, **parquet_options(table.schema)
                )
            self._writer.write_table(table, row_group_size=ROWS_PER_ROW_GROUP)
        self._pending, self._rows = [], 0

    def close(self) -> bool:
        """Write what is pending; True if the file exists."""
        self._flush()
        if self._writer is None:
            return False
        with _store_errors(self.loc):
            self._writer.close()  # on an object store: the upload completes here, all or nothing
            if self.durable:
                batch_log.sync_file(self.loc)  # by the executor that wrote it, before any commit
        return True


@contextmanager
def _store_errors(loc: Location) -> Iterator[None]:
    """A store's failure as one line naming the file (pyarrow's S3 messages run over lines)."""
    try:
        yield
    except StoreError:
        raise
    except OSError as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None


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

    def counts(self, partition: int, attempt: int, handler: str, node: str, written: int) -> CommitCounts:
        """The task's counts row (its manifest lists it)."""
        return {
            "partition": partition,
            "task_attempt": attempt,
            "handler": handler,
            "seen": self.seen,
            "written": written,
            "first_tuple_id": self.first_id,
            "last_tuple_id": self.last_id,
            "min_tuple_id": self.min_id,
            "max_tuple_id": self.max_id,
            "cp_node_sink": node,
            "first_tsc_sink": self.first_tsc,
            "last_tsc_sink": self.last_tsc,
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

        check_sink_options(options)  # the names as given: Spark's are lower-cased, a caller's may not be
        opts = lower_keys(options)
        if not opts.get("path"):
            raise ValueError("the cloudprofiler sink needs option 'path'")
        loc = resolve(opts["path"])  # an unknown scheme: one line naming the path
        # The string as given (it may carry credentials: never printed), resolved on each process
        # with that process's credentials; a plain path made absolute here, on the driver, since
        # executors need not share its working directory (a URI names the same place everywhere).
        self._uri = opts["path"] if "://" in opts["path"] else loc.path
        self._loc: Location | None = None
        # Kept in each manifest with the query's id (Spark's conf may hold it instead: then unknown);
        # a URI's credentials are never stored.
        checkpoint = opts.get("checkpointlocation")
        self._checkpoint = redact(checkpoint) if checkpoint else None
        self._staged = batch_log.staging(None)  # set per task from the query's id
        self._query_id: str | None = None
        self.spec = parse_handler(opts.get("handler", "identity"), opts)
        self.durable = flag_option(opts, "durability", DURABILITY_LEVELS, on="strict")  # strict: fsync
        self.overwrite = overwrite
        self.window_column = opts.get("windowcolumn")
        self.key_columns: list[str] = []
        if self.window_column is not None:
            self.keep = self._window_mode(schema, opts)
        else:
            self.keep = self._tuple_mode(schema, opts)
        # Last, once the options are known good: on the driver, when the query starts, a store
        # that cannot be reached or a missing bucket fails now, in one line naming the path.
        _check_location(loc)

    def _tuple_mode(self, schema: Any, opts: dict[str, str]) -> list[str]:
        """The tuple id column, the kept columns and the stamp columns (the sink stamp is added per batch)."""
        self.id_column = opts.get("tupleidcolumn", TUPLE_ID)
        keep = sink_input_columns(schema, self.id_column, opts.get("keepcolumns"))
        self.key_columns = [c for c in keep[1:] if not is_stamp_column(c)]
        return keep

    @property
    def location(self) -> Location:
        """Where the records go, resolved on this process."""
        if self._loc is None:
            self._loc = resolve(self._uri)
        return self._loc

    @property
    def path(self) -> str:
        """The sink's path as it may be printed (credentials removed)."""
        return self.location.uri

    def __getstate__(self) -> dict[str, Any]:
        # Executors resolve the raw string themselves: a filesystem object is not shipped.
        return {**self.__dict__, "_loc": None}

    def _window_mode(self, schema: Any, opts: dict[str, str]) -> list[str]:
        """Check the options and schema of window mode; the scalar columns to keep."""
        if not self.window_column:
            raise ValueError("option windowColumn is empty: name the query's window column (e.g. window)")
        if "tupleidcolumn" in opts:
            raise ValueError(
                "option tupleIdColumn cannot be combined with windowColumn: window results have no tuple id"
            )
        if "keepcolumns" in opts:
            raise ValueError(
                "option keepColumns cannot be combined with windowColumn: "
                "window mode keeps every scalar column"
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
        """One partition's records, its thread CPU (the batches received included) charged to the
        profiler's own cost (``cp_common.self_cost``): two clock reads per partition."""
        from cp_common import self_cost

        t0 = time.thread_time_ns()
        msg = self._write_partition(iterator)
        used = time.thread_time_ns() - t0
        self_cost.charge(msg.query_id, self_cost.SINK_WRITE, used, int(msg.counts.get("seen") or 0))
        return msg

    def _write_partition(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        import native_tsc
        from cp_sink.handlers import selected_positions

        partition, attempt, batch_tag, query_id = _task_identity()
        base = f"batch={batch_tag}"
        node = native_tsc.domain_id()
        # Until the commit publishes them, this run's files live where no plain reader lists.
        self._staged = batch_log.staging({"query_id": query_id})
        self._query_id = query_id
        if self.window_column is not None:
            return self._write_windows(iterator, base, partition, attempt, node)
        spec = self.spec
        records = self._file(base, RECORDS_PREFIX, partition, attempt)
        tally = _Tally()
        written = 0
        fl_first: pa.RecordBatch | None = None
        fl_last: pa.RecordBatch | None = None
        batch_tscs: list[int] = []  # pc: one sink stamp and row count per Arrow batch
        batch_rows: list[int] = []
        keyed: list[pa.Table] = []  # pc with keepColumns: rows per key of each Arrow batch
        period_cycles = spec.params.get("periodMs", 0) * native_tsc.frequency_hz() / 1000.0

        for batch in iterator:
            tsc = native_tsc.now()
            n = batch.num_rows
            if n == 0:
                continue
            ids = self._ids(batch)
            tally.add(ids, tsc)
            keeps = spec.kind.keeps
            if keeps == "periods":
                batch_tscs.append(tsc)
                batch_rows.append(n)
                if self.key_columns:
                    keyed.append(_rows_per_key(batch, self.key_columns, tsc))
                continue
            if keeps == "none":
                continue
            if keeps == "ends":
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
        files, rows = ([records.rel], [records.total]) if records.close() else ([], [])
        counts = tally.counts(partition, attempt, spec.describe(), node, written)
        name = f"{base}/{batch_log.data_file(PERIODS_PREFIX, partition, attempt)}"
        n_periods = self._write_periods(name, partition, node, period_cycles, batch_tscs, batch_rows, keyed)
        if n_periods:
            files.append(name)
            rows.append(n_periods)
        return self._message(files, rows, counts)

    def _message(self, files: list[str], rows: list[int], counts: CommitCounts) -> SinkCommitMessage:
        return SinkCommitMessage(files, counts, rows, self._query_id, self._staged)

    def _file(self, base: str, prefix: str, partition: int, attempt: int) -> _RecordFile:
        rel = f"{base}/{batch_log.data_file(prefix, partition, attempt)}"
        return _RecordFile(self.location.join(self._staged, rel), rel, self.durable)

    def _write_windows(
        self, iterator: Iterator[pa.RecordBatch], base: str, partition: int, attempt: int, node: str
    ) -> SinkCommitMessage:
        """Window mode: every row as a window record with the sink stamp of its Arrow batch."""
        import native_tsc

        assert self.window_column is not None
        out = self._file(base, WINDOWS_PREFIX, partition, attempt)
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
        files, rows = ([out.rel], [out.total]) if out.close() else ([], [])
        return self._message(files, rows, window_counts(seen, node, tscs, partition, attempt))

    def _ids(self, batch: pa.RecordBatch) -> np.ndarray:
        ids = batch.column(self.id_column)
        if ids.null_count:
            raise ValueError(f"tuple id column {self.id_column!r} has nulls")
        return ids.cast(pa.int64()).to_numpy(zero_copy_only=False)

    def _write_periods(
        self,
        rel: str,
        partition: int,
        node: str,
        period_cycles: float,
        batch_tscs: list[int],
        batch_rows: list[int],
        keyed: list[pa.Table],
    ) -> int:
        """pc: write the task's row count per period (and key) to ``rel``; its rows (0: none written)."""
        from cp_sink.handlers import period_counts

        if keyed:
            table = _periods_by_key(keyed, self.key_columns, period_cycles)
            fixed = {
                "partition": pa.array([partition] * table.num_rows, pa.int32()),
                node_column(SINK): pa.array([node] * table.num_rows),
                "period_ms": pa.array([self.spec.period_ms] * table.num_rows, pa.int64()),
                "period_cycles": pa.array([period_cycles] * table.num_rows, pa.float64()),
            }
            for col, values in fixed.items():
                table = table.append_column(col, values)
            names = [*PERIODS_SCHEMA.names[:-1], *self.key_columns, "count"]
            batch_log.write_parquet(table.select(names), self.location.join(self._staged, rel), self.durable)
            return int(table.num_rows)
        periods = period_counts(np.array(batch_tscs, np.int64), period_cycles, np.array(batch_rows, np.int64))
        if not periods:
            return 0
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
        batch_log.write_parquet(table, self.location.join(self._staged, rel), self.durable)
        return int(table.num_rows)

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
        """Publish what the tasks of ``batchId`` wrote with one manifest, once per batch id, stamped
        with the "committed" point (this process's reading, just before the manifest's write)."""
        import native_tsc

        msgs = _ours(messages)
        files = [f for m in msgs for f in m.files]
        rows = [n for m in msgs for n in m.rows]
        counts = [{"batch_id": batchId, **m.counts} for m in msgs]
        query_id, staged = _run_of(msgs, batchId)
        run = {"query_id": query_id, "checkpoint": self._checkpoint} if query_id else None
        batch_log.commit(
            self.location, batchId, files, counts, self.durable, rows, run, staged, native_tsc.reading
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete what the tasks of a failed micro-batch wrote (never a published file)."""
        msgs = _ours(messages)
        _, staged = _run_of(msgs, batchId)
        batch_log.abort(self.location, batchId, [f for m in msgs for f in m.files], staged)


def _run_of(msgs: list[SinkCommitMessage], batch_id: int) -> tuple[str | None, str | None]:
    """The query id and staging directory the tasks of a batch reported (one of each, or none)."""
    runs = {(m.query_id, m.staged) for m in msgs if m.files or m.query_id}
    if len(runs) > 1:
        raise ValueError(f"batch {batch_id}: tasks of different runs in one commit: {sorted(map(str, runs))}")
    return runs.pop() if runs else (None, None)


def _rows_per_key(batch: pa.RecordBatch, keys: list[str], tsc: int) -> pa.Table:
    """pc with keepColumns: one row per key value of ``batch`` (nulls a key of their own) with its
    row count and the batch's sink stamp."""
    counted = pa.Table.from_batches([batch.select(keys)]).group_by(keys).aggregate([([], "count_all")])
    return counted.append_column("tsc", pa.array(np.full(counted.num_rows, tsc, np.int64)))


def _periods_by_key(keyed: list[pa.Table], keys: list[str], period_cycles: float) -> pa.Table:
    """Rows per (period, key) over a task's batches: ``period``, the keys and ``count``."""
    t = pa.concat_tables(keyed)
    period = np.floor(t["tsc"].to_numpy() / period_cycles).astype(np.int64)
    t = t.append_column("period", pa.array(period))
    g = t.group_by(["period", *keys]).aggregate([("count_all", "sum")])
    return pa.table({"period": g["period"], **{k: g[k] for k in keys}, "count": g["count_all_sum"]})


def _dictionary(col: pa.Array) -> pa.Array:
    # Node id columns hold a handful of distinct strings: encode once here, not per Parquet page.
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        import pyarrow.compute as pc

        return pc.dictionary_encode(col)
    return col
