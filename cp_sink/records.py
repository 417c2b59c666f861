"""Latency records written by the sink: the layout on disk and readers.

A sink path holds one directory per published micro-batch::

    <path>/batch=<id>/records-*.parquet   tuples kept by the handler (id, downsample, xoy, firstlast)
    <path>/batch=<id>/periods-*.parquet   tuples per period (pc handler)
    <path>/batch=<id>/windows-*.parquet   window results (option windowColumn, or record_windows)
    <path>/batch=<id>/_counts.parquet     one row per partition: what the sink saw and wrote
    <path>/_staging/...                   task output not yet published (never read)
    <path>/_publishing/...                a publication in progress (never read)

A ``batch=<id>`` directory appears by one atomic rename, so a reader sees a
micro-batch entirely or not at all. ``batch_id`` comes from the directory name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from native_tsc.stamp_columns import SINK, node_column, stamp_columns

TUPLE_ID = "tuple_id"
BATCH_DIR_RE = re.compile(r"^batch=(\d+)$")
STAGING = "_staging"
PUBLISHING = "_publishing"
COUNTS_FILE = "_counts.parquet"
RECORDS_PREFIX = "records-"
PERIODS_PREFIX = "periods-"
WINDOWS_PREFIX = "windows-"

COUNTS_SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("partition", pa.int32()),
        ("task_attempt", pa.int64()),
        ("handler", pa.string()),
        ("seen", pa.int64()),
        ("written", pa.int64()),
        ("first_tuple_id", pa.int64()),
        ("last_tuple_id", pa.int64()),
        ("min_tuple_id", pa.int64()),
        ("max_tuple_id", pa.int64()),
        (node_column(SINK), pa.string()),
        ("first_tsc_sink", pa.int64()),
        ("last_tsc_sink", pa.int64()),
    ]
)

PERIODS_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        (node_column(SINK), pa.string()),
        ("period", pa.int64()),
        ("period_ms", pa.int64()),
        ("period_cycles", pa.float64()),
        ("count", pa.int64()),
    ]
)


def published_batches(path: str | os.PathLike[str]) -> dict[int, Path]:
    """Published micro-batch ids and their directories."""
    root = Path(path)
    out: dict[int, Path] = {}
    if not root.is_dir():
        return out
    for entry in root.iterdir():
        m = BATCH_DIR_RE.match(entry.name)
        if m and entry.is_dir():
            out[int(m.group(1))] = entry
    return dict(sorted(out.items()))


def _read_prefixed(path: str | os.PathLike[str], prefix: str, schema: pa.Schema | None) -> pa.Table | None:
    tables = []
    for batch_id, d in published_batches(path).items():
        for f in sorted(d.iterdir()):
            if f.name.startswith(prefix) and f.name.endswith(".parquet"):
                t = _plain(pq.read_table(f))
                tables.append(t.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), len(t))))
    if not tables:
        return None if schema is None else schema.empty_table()
    return pa.concat_tables(tables, promote_options="default")


def _plain(t: pa.Table) -> pa.Table:
    # Node ids are stored dictionary-encoded; readers get plain strings.
    for i, f in enumerate(t.schema):
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, f.name, t.column(i).cast(f.type.value_type))
    return t


def read_records(path: str | os.PathLike[str]) -> pa.Table:
    """The committed tuple records under a sink path (``batch_id`` added); nothing from staging.

    Columns: ``tuple_id``, every ``cp_tsc_*``/``cp_node_*`` column the query carried,
    ``partition``, ``batch_id`` (and ``role`` for the firstlast handler).
    """
    t = _read_prefixed(path, RECORDS_PREFIX, None)
    if t is None:
        return pa.schema(
            [(TUPLE_ID, pa.int64()), ("partition", pa.int32()), ("batch_id", pa.int64())]
        ).empty_table()
    return t


def read_windows(path: str | os.PathLike[str]) -> pa.Table:
    """Every published window result under a sink path (``batch_id`` added); nothing from staging.

    Columns: ``window_start_ms``, ``window_end_ms`` (int64 epoch ms), the query's scalar columns
    (keys, counts, aggregates, ``cp_tsc_*``/``cp_node_*``), ``cp_tsc_sink`` (int64),
    ``cp_node_sink`` (string) and ``batch_id`` (int64).
    """
    t = _read_prefixed(path, WINDOWS_PREFIX, None)
    if t is None:
        tsc, node = stamp_columns(SINK)
        return pa.schema(
            [
                ("window_start_ms", pa.int64()),
                ("window_end_ms", pa.int64()),
                (tsc, pa.int64()),
                (node, pa.string()),
                ("batch_id", pa.int64()),
            ]
        ).empty_table()
    return t


def read_counts(path: str | os.PathLike[str]) -> pa.Table:
    """One row per published (batch, partition): tuples seen and written by the sink."""
    tables = [
        pq.read_table(d / COUNTS_FILE) for d in published_batches(path).values() if (d / COUNTS_FILE).exists()
    ]
    if not tables:
        return COUNTS_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def read_periods(path: str | os.PathLike[str]) -> pa.Table:
    """The pc handler's time series: tuples per (node, period) and partition, with ``batch_id``."""
    t = _read_prefixed(path, PERIODS_PREFIX, PERIODS_SCHEMA.append(pa.field("batch_id", pa.int64())))
    assert t is not None
    return t


def total_seen(path: str | os.PathLike[str]) -> int:
    """How many tuples the sink saw in all published micro-batches."""
    counts = read_counts(path)
    return int(pc.sum(counts["seen"]).as_py() or 0) if counts.num_rows else 0
