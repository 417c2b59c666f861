"""A Parquet file as a workload: its payload fields (from the footer alone) and its rows.

``parquet:PATH`` (a path or URI, read through ``cp_store.location``) replays a Parquet file. The
generator, the factory and the reader all read the file's footer for the payload fields, so every
one of them must reach PATH (a shared store URI such as ``s3://...`` serves many hosts); only the
generator reads rows.

Each column becomes the type Spark reads it as, nullable (every payload field is):

* strings (and large strings) -> STRING, binary -> BINARY, booleans, 8 to 64-bit integers,
  FLOAT, DOUBLE, DECIMAL (up to 38 digits), DATE;
* unsigned integers widen as Spark's Parquet reader widens them (UINT8 -> SMALLINT, UINT16 ->
  INT, UINT32 -> BIGINT); UINT64 has no Spark type that holds every value and is refused;
* every timestamp -> TIMESTAMP (``timestamp[us, UTC]``): one without a zone is read as UTC (the
  JSON rule), nanoseconds are truncated to microseconds (as Spark reads INT96);
* lists and structs of the above.

Anything else (a map, a time of day, a duration, a column of nulls only, ...) is refused in one
line naming the column, and so is a column whose name is one the factory adds, compared without
case (Spark resolves column names without case), or two columns whose names differ only in case.
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa
import pyarrow.parquet as pq

from cp_common.printable import first_line
from cp_store.location import StoreError, one_file

TIMESTAMP = pa.timestamp("us", tz="UTC")
ROWS_MAX_BYTES = 64 << 20  # a replayed file's rows, all held by each sender (Arrow, in memory): at most this
_WIDER = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}
_KEPT = (
    pa.types.is_boolean,
    pa.types.is_int8,
    pa.types.is_int16,
    pa.types.is_int32,
    pa.types.is_int64,
    pa.types.is_float32,
    pa.types.is_float64,
    pa.types.is_date32,
    pa.types.is_decimal128,
)


class ReplayTooLarge(ValueError):
    """A Parquet file whose rows, or a sender's pool of their payloads, are over the generator's cap."""


class UnsupportedType(ValueError):
    """A column type the pipeline does not carry."""


def carried_type(t: pa.DataType) -> pa.DataType:
    """The type a column of type ``t`` is carried as (see the module docstring); UnsupportedType if none."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if any(check(t) for check in _KEPT):
        return t
    if t in _WIDER:
        return _WIDER[t]
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_timestamp(t):
        return TIMESTAMP
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(carried_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, carried_type(f.type)) for f in t])
    raise UnsupportedType(f"type {t} is not carried")


def carried_fields(schema: pa.Schema, reserved: Collection[str], where: str) -> pa.Schema:
    """``schema``'s columns as the pipeline carries them; one-line ValueError naming a refused column."""
    fields: list[pa.Field] = []
    seen: dict[str, str] = {}
    lowered = {r.lower() for r in reserved}
    for f in schema:
        key = f.name.lower()
        if key in lowered:
            raise ValueError(
                f"{where}: column {f.name!r} is reserved for a column the factory adds (any case)"
            )
        if key in seen:
            raise ValueError(f"{where}: columns {seen[key]!r} and {f.name!r} differ only in case")
        seen[key] = f.name
        try:
            fields.append(pa.field(f.name, carried_type(f.type)))
        except UnsupportedType as e:
            raise ValueError(
                f"{where}: column {f.name!r} has {e}; supported: strings, binary, booleans, integers "
                "(UINT64 excepted), floats, decimals, dates, timestamps, lists and structs of these"
            ) from None
    if not fields:
        raise ValueError(f"{where}: no columns")
    return pa.schema(fields)


def _open(path: str) -> tuple[pq.ParquetFile, str]:
    """The Parquet file at ``path`` (footer read) and its printable URI; one line naming why it is not one."""
    loc = one_file(path, "Parquet file")
    try:
        return pq.ParquetFile(loc.fs.open_input_file(loc.path)), loc.uri
    except StoreError as e:
        raise ValueError(str(e)) from None
    except (pa.ArrowException, OSError) as e:  # not Parquet: no magic bytes, a corrupt footer, ...
        raise ValueError(f"{loc.uri}: not a readable Parquet file ({first_line(e)})") from None


def parquet_fields(path: str, reserved: Collection[str]) -> pa.Schema:
    """The payload fields of the Parquet file at ``path``, from its footer alone."""
    pf, uri = _open(path)
    return carried_fields(pf.schema_arrow, reserved, uri)


def parquet_rows(path: str, fields: pa.Schema, max_bytes: int = ROWS_MAX_BYTES) -> pa.Table:
    """Every row of the file, in order, as ``fields``; a one-line ValueError when there is none, or when
    they take more than ``max_bytes`` in memory (Arrow).

    Row groups are read in slices of at most 1,024 rows sized from the footer's byte estimate (a
    sixteenth of ``max_bytes``), and reading stops at the first slice past ``max_bytes``, so a file
    too large to hold is refused without being read whole.
    """
    pf, uri = _open(path)
    meta = pf.metadata
    if meta.num_rows == 0:
        raise ValueError(f"{uri}: no rows to send")
    footer = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    step = max(1, min(1024, max_bytes // 16 // max(1, footer // meta.num_rows)))
    batches: list[pa.RecordBatch] = []
    size = 0
    try:
        for b in pf.iter_batches(batch_size=step, columns=fields.names, use_threads=False):
            batches.append(b)
            size += b.nbytes
            if size > max_bytes:
                raise ReplayTooLarge(_too_large(uri, meta.num_rows, footer, max_bytes))
        table = pa.Table.from_batches(batches)
        return pa.table([_cast(table.column(f.name), f.type) for f in fields], schema=fields)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{uri}: cannot read its rows ({first_line(e)})") from None


def _too_large(uri: str, rows: int, footer: int, cap: int) -> str:
    return (
        f"{uri}: its {rows:,} rows take more than the generator's cap of {cap >> 20:,} MiB in memory "
        f"(Arrow; {footer:,} bytes uncompressed by its footer), and every row is replayed: "
        "replay a sample of it (e.g. its first row groups)"
    )


def _cast(col: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    """A column as its carried type: timestamps truncated to microseconds, everything else exact."""
    if col.type == to:
        return col
    return col.cast(to, safe=not (pa.types.is_timestamp(col.type) or _has_timestamp(col.type)))


def _has_timestamp(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return True
    return any(_has_timestamp(t.field(i).type) for i in range(t.num_fields))
