"""Latency records written by the sink: the layout on any store and readers.

A sink path (a directory or a URI such as ``s3://bucket/prefix``, see ``cp_store.location``)
holds the data files of each micro-batch and one manifest per published micro-batch
(the protocol is ``cp_store.batch_log``)::

    <path>/batch=<id>/records-p<part>-a<attempt>-<rnd>.parquet  tuples kept by the handler
    <path>/batch=<id>/periods-p<part>-a<attempt>-<rnd>.parquet  tuples per period (pc handler)
    <path>/batch=<id>/windows-*.parquet                         window results (windowColumn, ...)
    <path>/_commits/<id>.json                                   manifest: files and counts of <id>
    <path>/_attempts/<query id>/batch=<id>/...                  written, not yet published
    <path>/_spark_metadata/<id>                                 Spark's file-sink log

A micro-batch is published when its manifest is written (one all-or-nothing write), so a
reader sees it entirely or not at all. Readers read only the files the manifests list: what a
failed, crashed or speculative task attempt wrote is never read, wherever it lies. The counts
(one row per partition: what the sink saw and wrote) are in the manifest. ``batch_id`` comes
from the manifest.

Readers check what they are given, each error one line naming the file (:class:`RecordsError`):
a listed file's rows (its Parquet footer, read anyway) against the manifest's ``rows`` (for a
version 1 manifest: its records files' total against the counts' ``written``), a file listed by
two manifests, a records file without ``tuple_id`` or with nulls in it, a file whose columns do
not match the others'. A path that does not exist is an error; one that exists with nothing
published yet (the sink made it when its query started) reads as no rows. Committed batch ids
that skip some (not contiguous from 0: manifests removed, a store emptied under a running query)
are reported: a :class:`BatchGapWarning` naming them, and the returned table's schema metadata
(:data:`GAPS_KEY`); :func:`batch_gaps` gives them alone.
"""

from __future__ import annotations

import posixpath
import re
import warnings
from collections.abc import Iterable
from typing import Any, NotRequired, TypedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cp_common.faces import deprecated_names
from cp_common.printable import first_line
from cp_common.stamp_columns import COMMITTED, SINK, is_stamp_column, node_column, stamp_columns, tsc_column
from cp_store.batch_log import COMMITS, Manifest, committed, parallel, read_data
from cp_store.location import Location, StoreError
from cp_store.manifests import batch_gaps as _gaps
from cp_store.manifests import gaps_note, show_gaps

# Where: a sink path, a URI, a Location, or one already resolved with its manifests read (a report
# reading one run many ways hands every reader the same Published)
from cp_store.published_run import Published, Where, published
from cp_store.tables import missing

TUPLE_ID = "tuple_id"
# Columns a record gets from the sink itself (and the reader): a kept query column may not share a name.
RECORD_OWN_COLUMNS = (TUPLE_ID, "partition", "batch_id", "role")
MAX_KEEP_COLUMNS = 16  # keepColumns: each kept column widens every record, and --by groups by them
RECORDS_PREFIX = "records-"
PERIODS_PREFIX = "periods-"
WINDOWS_PREFIX = "windows-"
# The schema metadata key of the batch ids a reader found missing ("0-7,12"; absent: none missing).
GAPS_KEY = b"cloudprofiler.batch_gaps"
# What a sink path may hold before its first manifest: batch directories and "_"/"." names
# (_commits, staging, _sync). Anything else, without _commits/, means it is not a sink path.
_SINK_ENTRY = re.compile(r"^(batch=.*|[_.].*)$")

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


class CommitCounts(TypedDict):
    """One task attempt's counts row, as its commit message carries it and its batch's manifest lists
    it (with ``batch_id``); ``read_counts`` reads them as ``COUNTS_SCHEMA``."""

    partition: int
    task_attempt: int | None
    handler: str  # as HandlerSpec.describe() says it: xoy(x=2,y=1024)
    seen: int  # tuples the task was handed
    written: int  # records it wrote
    # the task's tuple ids: window records have none
    first_tuple_id: NotRequired[int | None]
    last_tuple_id: NotRequired[int | None]
    min_tuple_id: NotRequired[int | None]
    max_tuple_id: NotRequired[int | None]
    cp_node_sink: str  # node_column(SINK): the node the task ran on
    first_tsc_sink: int | None  # the sink stamps of its first and last Arrow batch
    last_tsc_sink: int | None


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


class RecordsError(ValueError):
    """Published content that is not what its manifests say: one line naming the file."""


class BatchGapWarning(UserWarning):
    """Committed batch ids that skip some: the rows of those batches are in no result."""


def published_batches(path: Where) -> dict[int, Manifest]:
    """Published micro-batch ids and their manifests (files and counts), in order."""
    return published(path).manifests


def batch_gaps(path: Where) -> list[tuple[int, int]]:
    """The batch ids missing from a sink path's committed ones, as (first, last) ranges: the ids
    before the first manifest and between two (one listing of ``_commits/``, no manifest read)."""
    return _gaps(committed(published(path).root))


def _published(run: Published, stacklevel: int) -> dict[int, Manifest]:
    """The manifests the readers use, checked: a path that does not exist is an error, a file
    listed by two manifests is refused, and batch ids that skip some are warned about (the warning
    points ``stacklevel`` frames up: the reader's caller)."""
    root, manifests = run.root, run.manifests
    if not manifests:
        _check_sink_path(root)
    owner: dict[str, Manifest] = {}
    for m in manifests.values():
        for f in m.files:
            if f in owner:  # read twice, its rows would count twice
                raise RecordsError(f"{root.join(f).uri}: listed by both {owner[f].uri} and {m.uri}")
            owner[f] = m
    gaps = _gaps(manifests)
    if gaps:
        warnings.warn(gaps_note(root.uri, gaps), BatchGapWarning, stacklevel=stacklevel + 1)
    return manifests


def _check_sink_path(root: Location) -> None:
    """Nothing published: fine for a sink path whose query has not committed yet (it made the
    directory when it started), an error naming ``root`` for a path that is not there, a file,
    or a directory holding something other than a sink's entries (not a sink path)."""
    kind = root.info().type
    if kind == pafs.FileType.NotFound:
        raise missing(root, "sink path")
    if kind != pafs.FileType.Directory:
        raise StoreError(f"sink path {root.uri}: a file, not a directory (give the sink's path)")
    names = [i.base_name for i in root.children()]
    foreign = sorted(n for n in names if not _SINK_ENTRY.match(n))
    if foreign and COMMITS not in names:
        raise StoreError(
            f"sink path {root.uri}: no {COMMITS}/ (nothing a sink published), but it holds "
            f"{foreign[0]!r}{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}: "
            "is it the sink's path?"
        )


def _read_prefixed(path: Where, prefix: str, empty: pa.Schema) -> pa.Table:
    """The listed ``prefix`` files of every published batch, checked, as one table (``empty``'s
    schema when there are none) with the missing batch ids in its metadata."""
    run = published(path)
    root, manifests = run.root, _published(run, stacklevel=3)
    listed = [
        (m, i)
        for m in manifests.values()
        for i, f in enumerate(m.files)
        if posixpath.basename(f).startswith(prefix) and f.endswith(".parquet")
    ]

    def read(item: tuple[Manifest, int]) -> pa.Table:
        m, i = item
        t = _plain(read_data(m, root.join(m.files[i]), lambda f: _read_listed(f, m, i, prefix)))
        return _batch_columns(t, m, stamped=prefix != PERIODS_PREFIX)

    tables = parallel(read, listed, remote=not root.is_local)
    if prefix in (RECORDS_PREFIX, WINDOWS_PREFIX):
        read_rows = [(m, t.num_rows) for (m, _), t in zip(listed, tables, strict=True)]
        _check_written(manifests.values(), prefix, read_rows)
    if not tables:
        return _with_gaps(empty.empty_table(), manifests)
    return _with_gaps(_concat(tables, [root.join(m.files[i]).uri for m, i in listed]), manifests)


def _batch_columns(t: pa.Table, m: Manifest, stamped: bool) -> pa.Table:
    """``t`` with what its batch's manifest says of every row: the "committed" stamp (when the
    sink's commit published the batch; absent from manifests written without it; for records and
    window results, ``stamped``) and ``batch_id``."""
    if stamped and m.committed is not None:
        tsc, node = m.committed
        t = t.append_column(tsc_column(COMMITTED), pa.repeat(pa.scalar(tsc, pa.int64()), len(t)))
        t = t.append_column(node_column(COMMITTED), pa.repeat(pa.scalar(node, pa.string()), len(t)))
    return t.append_column("batch_id", pa.repeat(pa.scalar(m.batch_id, pa.int64()), len(t)))


def _read_listed(f: Location, m: Manifest, i: int, prefix: str) -> pa.Table:
    """The listed file ``m.files[i]`` at ``f``, checked against the manifest; one open, one footer."""
    with f.fs.open_input_file(f.path) as src:
        try:
            pf = pq.ParquetFile(src)
        except pa.ArrowInvalid as e:  # not Parquet (pyarrow's message names no file)
            raise RecordsError(f"{f.uri}: {first_line(e)} (listed by {m.uri})") from None
        if m.rows is not None and pf.metadata.num_rows != m.rows[i]:
            raise RecordsError(
                f"{f.uri}: {pf.metadata.num_rows:,} rows, but {m.uri} lists it with {m.rows[i]:,} "
                "(replaced or rewritten after it was published)"
            )
        if prefix == RECORDS_PREFIX and TUPLE_ID not in pf.schema_arrow.names:
            raise RecordsError(f"{f.uri}: a records file without a {TUPLE_ID} column (listed by {m.uri})")
        t = pf.read()
    if prefix == RECORDS_PREFIX and t.column(TUPLE_ID).null_count:
        raise RecordsError(
            f"{f.uri}: {t.column(TUPLE_ID).null_count:,} records with a null {TUPLE_ID} (listed by {m.uri})"
        )
    return t


def _check_written(manifests: Iterable[Manifest], prefix: str, read: list[tuple[Manifest, int]]) -> None:
    """Version 1 manifests (no per-file rows): the rows of the ``prefix`` files each lists against
    its counts' ``written`` (what the sink wrote to them), where every counts row has it and the
    batch holds no file of the other kind that ``written`` also counts (records or windows)."""
    other = WINDOWS_PREFIX if prefix == RECORDS_PREFIX else RECORDS_PREFIX
    rows: dict[int, int] = {}
    for m, n in read:
        rows[m.batch_id] = rows.get(m.batch_id, 0) + n
    for m in manifests:
        written: list[int] = [c["written"] for c in m.counts if _is_count(c.get("written"))]
        if m.rows is not None or not written or len(written) != len(m.counts):
            continue
        if any(posixpath.basename(f).startswith(other) for f in m.files):
            continue
        if rows.get(m.batch_id, 0) != sum(written):
            raise RecordsError(
                f"{m.uri}: the {prefix.rstrip('-')} files it lists hold {rows.get(m.batch_id, 0):,} rows, "
                f"its counts say {sum(written):,} written"
            )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _concat(tables: list[pa.Table], uris: list[str]) -> pa.Table:
    """One table of every file's; a file whose columns cannot join the ones before is named."""
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    merged = tables[0].schema
    for t, uri in zip(tables[1:], uris[1:], strict=True):
        try:
            merged = pa.unify_schemas([merged, t.schema], promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise RecordsError(
                f"{uri}: its columns do not match the files read before it (the first: {uris[0]}): "
                f"{first_line(e)}"
            ) from None
    raise RecordsError(f"{uris[0]}: the files of this path cannot be read as one table")


def _with_gaps(t: pa.Table, manifests: Iterable[int]) -> pa.Table:
    """``t`` with the missing batch ids in its schema metadata (GAPS_KEY), if any are missing."""
    gaps = _gaps(manifests)
    if not gaps:
        return t
    return t.replace_schema_metadata({**(t.schema.metadata or {}), GAPS_KEY: show_gaps(gaps).encode()})


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
    ``role`` for the firstlast handler). Checked as the module docstring says: RecordsError or
    StoreError in one line naming the file or the path; missing batch ids warned about.
    """
    empty = pa.schema([(TUPLE_ID, pa.int64()), ("partition", pa.int32()), ("batch_id", pa.int64())])
    return _read_prefixed(path, RECORDS_PREFIX, empty)


def read_windows(path: Where) -> pa.Table:
    """Every published window result under a sink path (``batch_id`` added); nothing unpublished.

    Columns: ``window_start_ms``, ``window_end_ms`` (int64 epoch ms), the query's scalar columns
    (keys, counts, aggregates, ``cp_tsc_*``/``cp_node_*``), ``cp_tsc_sink`` (int64),
    ``cp_node_sink`` (string) and ``batch_id`` (int64). Checked as ``read_records`` is.
    """
    tsc, node = stamp_columns(SINK)
    empty = pa.schema(
        [
            ("window_start_ms", pa.int64()),
            ("window_end_ms", pa.int64()),
            (tsc, pa.int64()),
            (node, pa.string()),
            ("batch_id", pa.int64()),
        ]
    )
    return _read_prefixed(path, WINDOWS_PREFIX, empty)


def read_counts(path: Where) -> pa.Table:
    """One row per published (batch, partition): tuples seen and written by the sink."""
    manifests = _published(published(path), stacklevel=2)
    tables = [m.counts_table(COUNTS_SCHEMA) for m in manifests.values()]
    return _with_gaps(pa.concat_tables(tables) if tables else COUNTS_SCHEMA.empty_table(), manifests)


def read_periods(path: Where) -> pa.Table:
    """The pc handler's time series: tuples per (node, period) and partition, with ``batch_id``."""
    return _read_prefixed(path, PERIODS_PREFIX, PERIODS_SCHEMA.append(pa.field("batch_id", pa.int64())))


def total_seen(path: Where) -> int:
    """How many tuples the sink saw in all published micro-batches."""
    counts = read_counts(path)
    return int(pc.sum(counts["seen"]).as_py() or 0) if counts.num_rows else 0


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["published_batches", "read_records", "read_windows"])
