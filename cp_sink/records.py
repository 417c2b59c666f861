"""Latency records written by the sink: the layout on any store and readers.

A sink path (a directory or a URI such as ``s3://bucket/prefix``, see ``cp_store.location``)
holds the data files of each micro-batch and one manifest per published micro-batch
(the protocol is ``cp_store.batch_log``)::

    <path>/batch=<id>/records-p<part>-a<attempt>-<rnd>.parquet  tuples kept by the handler
    <path>/batch=<id>/periods-p<part>-a<attempt>-<rnd>.parquet  tuples per period (pc handler)
    <path>/batch=<id>/windows-*.parquet                         window results (windowColumn, ...)
    <path>/_commits/<id>.json                                   manifest: files and counts of <id>

A micro-batch is published when its manifest is written (one all-or-nothing write), so a
reader sees it entirely or not at all. Readers read only the files the manifests list: what a
failed, crashed or speculative task attempt wrote is never read, wherever it lies. The counts
(one row per partition: what the sink saw and wrote) are in the manifest. ``batch_id`` comes
from the manifest.
"""

from __future__ import annotations

import os
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cp_store.batch_log import Manifest, parallel, read_data, read_manifests
from cp_store.location import Location, resolve
from native_tsc.stamp_columns import SINK, is_stamp_column, node_column, stamp_columns

TUPLE_ID = "tuple_id"
# Columns a record gets from the sink itself (and the reader): a kept query column may not share a name.
RECORD_OWN_COLUMNS = (TUPLE_ID, "partition", "batch_id", "role")
MAX_KEEP_COLUMNS = 16  # keepColumns: each kept column widens every record, and --by groups by them
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


Where: TypeAlias = str | os.PathLike[str] | Location


def keep_columns(raw: str, columns: dict[str, bool], id_column: str) -> list[str]:
    """The query columns the option ``keepColumns`` names, checked; one line naming what is wrong.

    ``raw``: a comma list of column names; ``columns``: the query's column names, each with whether
    it is a plain scalar (nested columns cannot be a key). Names match case-insensitively, as Spark's
    do; the query's own spelling is kept. Refused: an empty list or name, a repeated name, more than
    MAX_KEEP_COLUMNS, a column the query does not have (the ones it has are listed), a nested one,
    the tuple id column, a stamp column and a name the records give themselves (RECORD_OWN_COLUMNS).
    """
    names = [n.strip() for n in raw.split(",")]
    if not raw.strip() or any(not n for n in names):
        raise ValueError(f"option keepColumns={raw!r}: expected a comma list of column names")
    if len(names) > MAX_KEEP_COLUMNS:
        raise ValueError(f"option keepColumns: {len(names)} columns, at most {MAX_KEEP_COLUMNS}")
    by_lower = {c.lower(): c for c in columns}
    out: list[str] = []
    for name in names:
        low = name.lower()
        if low in (c.lower() for c in (*RECORD_OWN_COLUMNS, id_column)) or is_stamp_column(low):
            raise ValueError(
                f"option keepColumns: {name!r} is a column the records already hold (tuple id, "
                f"{', '.join(RECORD_OWN_COLUMNS[1:])} and every cp_tsc_*/cp_node_* column)"
            )
        if low not in by_lower:
            available = [c for c in columns if c != id_column and not is_stamp_column(c.lower())]
            raise ValueError(
                f"option keepColumns: the query has no column {name!r} "
                f"(it has: {', '.join(available) or 'no other column'})"
            )
        actual = by_lower[low]
        if actual in out:
            raise ValueError(f"option keepColumns: column {name!r} is named twice")
        if not columns[actual]:
            raise ValueError(
                f"option keepColumns: column {actual!r} is nested; only scalar columns can be kept"
            )
        out.append(actual)
    return out


def sink_input_columns(schema: Any, id_column: str = TUPLE_ID, keep: str | None = None) -> list[str]:
    """The columns of a query the sink reads in tuple mode, in order: the tuple id, the columns
    ``keep`` names (the option ``keepColumns``, checked by ``keep_columns``) and every stamp column
    but the sink's own. Spark hands the sink every column of the query (each converted to Arrow and
    sent to the Python worker), so a query projected to these gives the same records for less.

    ``schema``: the query's ``StructType``. A query without ``id_column`` is refused in one line.
    """
    from pyspark.sql.types import AtomicType

    names = list(schema.fieldNames()) if schema is not None else []
    if id_column not in names:
        raise ValueError(
            f"the cloudprofiler sink needs a tuple id column {id_column!r} (option tupleIdColumn); "
            f"the query has {names}"
        )
    kept: list[str] = []
    if keep is not None:
        scalar = {f.name: isinstance(f.dataType, AtomicType) for f in schema.fields}
        kept = keep_columns(keep, scalar, id_column)
    stamps = [n for n in names if is_stamp_column(n) and n not in stamp_columns(SINK)]
    return [id_column, *kept, *stamps]


def published_batches(path: Where) -> dict[int, Manifest]:
    """Published micro-batch ids and their manifests (files and counts), in order."""
    return read_manifests(resolve(path))


def _read_prefixed(path: Where, prefix: str, schema: pa.Schema | None) -> pa.Table | None:
    root = resolve(path)
    listed = [
        (m, loc)
        for m in published_batches(root).values()
        for loc in m.data(root, prefix)
        if loc.path.endswith(".parquet")
    ]

    def read(item: tuple[Manifest, Location]) -> pa.Table:
        m, loc = item
        t = _plain(read_data(m, loc, lambda f: pq.read_table(f.path, filesystem=f.fs)))
        return t.append_column("batch_id", pa.repeat(pa.scalar(m.batch_id, pa.int64()), len(t)))

    tables = parallel(read, listed, remote=not root.is_local)
    if not tables:
        return None if schema is None else schema.empty_table()
    return pa.concat_tables(tables, promote_options="default")


def _plain(t: pa.Table) -> pa.Table:
    # Node ids are stored dictionary-encoded; readers get plain strings.
    for i, f in enumerate(t.schema):
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, f.name, t.column(i).cast(f.type.value_type))
    return t


def read_records(path: Where) -> pa.Table:
    """The committed tuple records under a sink path (``batch_id`` added); nothing unpublished.

    Columns: ``tuple_id``, the columns the option ``keepColumns`` named (as the query typed them),
    every ``cp_tsc_*``/``cp_node_*`` column the query carried, ``partition``, ``batch_id`` (and
    ``role`` for the firstlast handler).
    """
    t = _read_prefixed(path, RECORDS_PREFIX, None)
    if t is None:
        return pa.schema(
            [(TUPLE_ID, pa.int64()), ("partition", pa.int32()), ("batch_id", pa.int64())]
        ).empty_table()
    return t


def read_windows(path: Where) -> pa.Table:
    """Every published window result under a sink path (``batch_id`` added); nothing unpublished.

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


def read_counts(path: Where) -> pa.Table:
    """One row per published (batch, partition): tuples seen and written by the sink."""
    tables = [m.counts_table(COUNTS_SCHEMA) for m in published_batches(path).values()]
    if not tables:
        return COUNTS_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def read_periods(path: Where) -> pa.Table:
    """The pc handler's time series: tuples per (node, period) and partition, with ``batch_id``."""
    t = _read_prefixed(path, PERIODS_PREFIX, PERIODS_SCHEMA.append(pa.field("batch_id", pa.int64())))
    assert t is not None
    return t


def total_seen(path: Where) -> int:
    """How many tuples the sink saw in all published micro-batches."""
    counts = read_counts(path)
    return int(pc.sum(counts["seen"]).as_py() or 0) if counts.num_rows else 0
