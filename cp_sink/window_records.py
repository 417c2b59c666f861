"""Window results as latency records: the rows of a windowed aggregation, each with its sink stamp.

A windowed query (``groupBy(F.window("event_time", ...))``) emits one row per window and key, with
no tuple id. Its output latency is the moment each window's result reaches the sink, so the rows
are kept whole: the window bounds as epoch milliseconds, every plain scalar column (keys, counts,
aggregates, stamp columns) and the sink stamp (``cp_tsc_sink``, ``cp_node_sink``). Two writers
produce them in the same layout, read by ``cp_sink.records.read_windows``:

* the cloudprofiler sink with option ``windowColumn`` (``cp_sink.stream_writer``);
* ``record_windows(df, batch_id, path)`` inside ``foreachBatch``: the sink point is stamped on the
  executors, the rows are collected to the driver as Arrow, written as
  ``path/batch=<id>/windows-<uuid>.parquet`` and published by the batch's manifest
  (``cp_store.batch_log.publish``); a batch id already published (a replay after a restart) is
  skipped. ``path`` is a directory or a URI (``s3://bucket/prefix``, ...), as for the sink.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cp_common.faces import deprecated_names
from cp_common.stamp_columns import SINK, node_column, stamp_columns, tsc_column
from cp_sink.records import WINDOWS_PREFIX, CommitCounts
from cp_store import batch_log
from cp_store.location import Location, resolve

WINDOW_START = "window_start_ms"
WINDOW_END = "window_end_ms"
# Names the output (or read_windows) gives itself: a query column of the same name is refused.
RESERVED = (WINDOW_START, WINDOW_END, "batch_id")
# Epoch milliseconds from an Arrow timestamp's integer value: (multiply, floor-divide) per unit.
_TO_MS = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}

T = TypeVar("T", pa.Table, pa.RecordBatch)


def window_columns(schema: Any, window_column: str) -> list[str]:
    """Check a query's Spark schema for window mode; the scalar columns to keep, in schema order.

    ``window_column`` must be a ``struct<start: timestamp, end: timestamp>`` (what ``F.window``
    gives). Kept: every other column of a plain scalar type; nested columns are left out, and so
    are ``cp_tsc_sink``/``cp_node_sink`` (the sink stamps the rows itself).
    """
    from pyspark.sql.types import AtomicType, StructType, TimestampType, VariantType

    names = list(schema.fieldNames())
    if window_column not in names:
        raise ValueError(
            f"option windowColumn={window_column!r}: the query has no such column (it has {names})"
        )
    wtype = schema[window_column].dataType
    bounds = {f.name: f.dataType for f in wtype.fields} if isinstance(wtype, StructType) else {}
    if set(bounds) != {"start", "end"} or not all(isinstance(t, TimestampType) for t in bounds.values()):
        raise ValueError(
            f"option windowColumn={window_column!r}: expected struct<start: timestamp, end: timestamp> "
            f"(the column F.window gives), the column is {wtype.simpleString()}"
        )
    clash = [n for n in names if n in RESERVED]
    if clash:
        raise ValueError(
            f"option windowColumn={window_column!r}: window records name columns {', '.join(RESERVED)} "
            f"themselves; rename the query's {clash}"
        )
    sink = set(stamp_columns(SINK))
    return [
        f.name
        for f in schema.fields
        if f.name != window_column
        and f.name not in sink
        and isinstance(f.dataType, AtomicType)
        and not isinstance(f.dataType, VariantType)
    ]


def _epoch_ms(bounds: Any, field: str, window_column: str) -> np.ndarray:
    """One bound of the window struct as int64 epoch milliseconds (floor)."""
    col = pc.struct_field(bounds, field)
    if col.null_count:
        raise ValueError(f"window column {window_column!r}: {col.null_count} row(s) with a null {field}")
    mul, div = _TO_MS[col.type.unit]
    raw = col.cast(pa.int64()).to_numpy()  # a timestamp's integer value is UTC whatever its zone
    return np.floor_divide(raw * mul, div)


def window_rows(data: T, window_column: str, keep: list[str]) -> T:
    """The window record of each row: ``window_start_ms``, ``window_end_ms``, then ``keep`` in order.

    ``data`` is a RecordBatch (the sink) or a Table (``record_windows``), and comes back as one.
    """
    bounds = data.column(window_column)
    if bounds.null_count:
        raise ValueError(f"window column {window_column!r}: {bounds.null_count} row(s) without a window")
    cols = [pa.array(_epoch_ms(bounds, f, window_column), pa.int64()) for f in ("start", "end")]
    cols += [data.column(c) for c in keep]
    names = [WINDOW_START, WINDOW_END, *keep]
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(cols, names=names)
    return pa.Table.from_arrays(cols, names=names)


def window_counts(
    rows: int, node: str, tscs: list[int], partition: int, task_attempt: int | None
) -> CommitCounts:
    """The counts row of window records (``batch_id`` aside): seen = written = rows,
    no tuple ids, the sink stamps of the first and last batch."""
    return {
        "partition": partition,
        "task_attempt": task_attempt,
        "handler": "identity",
        "seen": rows,
        "written": rows,
        "cp_node_sink": node,
        "first_tsc_sink": tscs[0] if tscs else None,
        "last_tsc_sink": tscs[-1] if tscs else None,
    }


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How latency and window records are encoded: zstd; stamps and ids grow slowly, so delta
    bit-packing shrinks them ~50x and is cheaper to write than dictionaries; the rest (node ids:
    a few strings) gets a dictionary."""
    ints = [f.name for f in schema if pa.types.is_integer(f.type)]
    return {
        "compression": "zstd",
        "use_dictionary": [f.name for f in schema if f.name not in ints],
        "column_encoding": dict.fromkeys(ints, "DELTA_BINARY_PACKED"),
    }


def write_window_file(table: pa.Table, loc: Location, durable: bool = False) -> None:
    """Write window records to one Parquet file at ``loc`` (encoded as the records are)."""
    batch_log.write_parquet(table, loc, durable, **parquet_options(table.schema))


def _driver_counts(rows: pa.Table) -> CommitCounts:
    """record_windows' one counts row: the driver collected every partition (no task attempt)."""
    import native_tsc

    if not rows.num_rows:
        return window_counts(0, native_tsc.domain_id(), [], 0, None)
    tsc = rows.column(tsc_column(SINK))
    node = rows.column(node_column(SINK))[0].as_py()
    return window_counts(rows.num_rows, node, [pc.min(tsc).as_py(), pc.max(tsc).as_py()], 0, None)


def record_windows(
    df: Any,
    batch_id: int,
    path: str | os.PathLike[str],
    window_column: str = "window",
    durability: str = "process",
) -> None:
    """In ``foreachBatch``: stamp the sink point on the executors, collect the window rows to the
    driver and publish them as ``path/batch=<batch_id>/windows-<uuid>.parquet`` (once per batch id).

    Columns as the sink's ``windowColumn`` mode writes them; ``read_windows(path)`` reads both.
    ``path`` is a directory or a URI. ``durability`` as the sink's option: ``strict`` fsyncs the
    file, the directories that name it and the manifest (on a local filesystem).
    """
    from cp_sink.stamp import stamp

    if durability not in ("process", "strict"):
        raise ValueError(f"record_windows: durability={durability!r}: expected one of process, strict")
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ValueError(f"record_windows: batch_id={batch_id!r}: expected a non-negative integer")
    root = resolve(path)
    if batch_log.is_committed(root, batch_id):  # published before a restart replayed this batch
        return
    keep = window_columns(df.schema, window_column) + list(stamp_columns(SINK))
    own = [c for c in stamp_columns(SINK) if c in df.columns]  # replaced by this stamp
    table = stamp(df.drop(*own), SINK).toArrow()
    rows = window_rows(table, window_column, keep)
    files = {f"{WINDOWS_PREFIX}{uuid.uuid4().hex}.parquet": rows} if rows.num_rows else {}
    counts = [{"batch_id": batch_id, **_driver_counts(rows)}]
    batch_log.publish(root, batch_id, files, counts, durability == "strict", write_window_file)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["record_windows"])
