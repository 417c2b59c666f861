"""Generic NDJSON payload parsers (any schema): orjson to Arrow, and pyarrow's JSON reader.

A payload is one JSON object per line. Blank lines are ignored, keys not in
the schema are ignored, a missing key is null, and of a key given twice the
last value counts. A line that carries none of the schema's keys does not fit
the schema (say YSB events sent to a source expecting other fields): it would
become a row of nulls, so the bucket is rejected as ``BucketError("bad_json")``
naming the keys expected and found, and the factory dead-letters and counts it.
A row count different from the header's raises ``BucketError("count_mismatch")``.

What a JSON value becomes is decided in one place, :func:`parse_orjson`, and
every parser gives its values or its refusal (a ``BucketError("bad_json")``
naming the line and the field). A value is never truncated or reinterpreted:

* STRING takes a string; BOOLEAN ``true`` or ``false``;
* TINYINT, SMALLINT, INT, BIGINT take a JSON integer within the type's range
  (``2.5``, ``2.0``, ``1e3`` and ``-0.0`` are refused, never truncated);
* FLOAT and DOUBLE take any number, rounded to the nearest value of the type
  (FLOAT through DOUBLE, as Spark's JSON reader does); one too large for the
  type (``1e400``, or ``1e300`` into FLOAT) is refused, never infinity;
* DATE takes a ``YYYY-MM-DD`` string (a number is refused: days? seconds?);
* TIMESTAMP takes an ISO-8601 string (without a zone it is UTC), or a JSON
  integer of seconds since the epoch, as Spark's JSON reader reads one
  (``1700000000`` is 2023-11-14 22:13:20 UTC); a fractional number is refused,
  and so is an instant outside the years 0001 to 9999.

pyarrow's reader is the fast path (it reads a TIMESTAMP column of strings, or
one of epoch seconds); whatever it does not read exactly as the rules above
would (a TIMESTAMP column mixing numbers and strings, a duplicate key, a token
that is not JSON such as ``NaN``) makes it hand the payload to
:func:`parse_orjson`.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from cp_source.factory.json_values import (
    TIMESTAMP,
    BadValue,
    column,
    dates_from_strings,
    exact_numbers,
    finite_floats,
    is_nested,
    timestamps_from_micros,
    timestamps_from_strings,
)
from cp_source.wire.bucket import BucketError


def numbered_lines(payload: bytes) -> tuple[list[bytes], list[int]]:
    """The non-blank lines (blank: only JSON whitespace) and their 1-based line numbers."""
    lines, numbers = [], []
    for i, ln in enumerate(payload.split(b"\n"), 1):
        if ln.strip(b" \t\r"):
            lines.append(ln)
            numbers.append(i)
    return lines, numbers


def _no_field(row: dict, fields: pa.Schema, line: int) -> BucketError:
    keys = ", ".join(sorted(map(str, row))[:8]) or "none"
    return BucketError(
        "bad_json",
        f"line {line} does not fit the schema: it has none of its fields "
        f"({', '.join(fields.names[:8])}); its keys: {keys}",
    )


def _check_fits(rows: Sequence[dict], fields: pa.Schema, lines: Sequence[int]) -> None:
    """Every row carries at least one of the schema's keys (else it would be a row of nulls)."""
    names = fields.names
    for i, r in enumerate(rows):
        if not any(n in r for n in names):
            raise _no_field(r, fields, lines[i])


def _decode(lines: Sequence[bytes], numbers: Sequence[int]) -> list[Any]:
    try:
        return [orjson.loads(ln) for ln in lines]
    except orjson.JSONDecodeError:
        for ln, n in zip(lines, numbers, strict=True):
            try:
                orjson.loads(ln)
            except orjson.JSONDecodeError as e:
                raise BucketError("bad_json", f"line {n}: not JSON ({e})") from None
        raise


def _rows(payload: bytes | memoryview, fields: pa.Schema, count: int) -> tuple[list[dict], list[int]]:
    """The payload's objects and their line numbers, checked for count, JSON and fit."""
    lines, numbers = numbered_lines(bytes(payload))
    if len(lines) != count:
        raise BucketError("count_mismatch", f"header says {count} tuples, payload has {len(lines)} lines")
    rows = _decode(lines, numbers)
    for r, n in zip(rows, numbers, strict=True):
        if type(r) is not dict:
            raise BucketError("bad_json", f"line {n}: not a JSON object")
    _check_fits(rows, fields, numbers)
    exact = [f.name for f in fields if exact_numbers(f.type)]
    if exact:
        _exact_values(rows, lines, exact)
    return rows, numbers


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _exact_values(rows: list[dict], lines: Sequence[bytes], names: list[str]) -> None:
    """The values of fields holding a DECIMAL, decoded again keeping every number's digits (orjson reads
    a fraction as a double: 0.1000000000000000055 would be 0.1). The lines are JSON objects already."""
    for r, ln in zip(rows, lines, strict=True):
        exact = json.loads(ln, parse_float=Decimal, parse_constant=_no_constant)
        for n in names:
            if n in exact:
                r[n] = exact[n]


def parse_orjson(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """orjson per line, then one column per field: the rules every parser follows (see the module)."""
    rows, numbers = _rows(payload, fields, count)
    arrays = [column([r.get(f.name) for r in rows], f, numbers) for f in fields]
    return pa.RecordBatch.from_arrays(arrays, schema=fields)


# Input pyarrow's reader accepts but JSON does not (so orjson refuses it): NaN and Infinity tokens
# (rapidjson's NaN/Inf flag), a byte order mark, two objects on one line (the reader needs no
# newline between them), and bytes that are not UTF-8, all where the reader skips them (a key or
# value not in the schema).
_TWO_ON_A_LINE = re.compile(rb"\}[ \t\r]*\{")
_BOM = b"\xef\xbb\xbf"


def _not_json_to_arrow(data: bytes) -> bool:
    """Whether ``data`` may hold something pyarrow's reader accepts and JSON does not (memchr first)."""
    return (
        (b"N" in data and b"NaN" in data)
        or (b"I" in data and b"Inf" in data)
        or data.startswith(_BOM)
        or _TWO_ON_A_LINE.search(data) is not None
        or not _utf8(data)
    )


def _utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _read_type(t: pa.DataType, seconds: bool) -> pa.DataType:
    """What pyarrow's reader reads a field as, before the shared conversion: DATE and TIMESTAMP as
    strings (a number there then fails, and the payload goes the rules' way), or TIMESTAMP as
    integers (``seconds``: epoch seconds), FLOAT as DOUBLE."""
    if t == TIMESTAMP:
        return pa.int64() if seconds else pa.string()
    if pa.types.is_date32(t):
        return pa.string()
    return pa.float64() if pa.types.is_floating(t) else t


def _arrow_column(col: pa.Array, f: pa.Field) -> pa.Array | None:
    """A column as pyarrow's reader read it, converted by the shared rules; None to hand over."""
    if pa.types.is_date32(f.type):
        return dates_from_strings(col)
    if f.type == TIMESTAMP:
        if pa.types.is_integer(col.type):
            return timestamps_from_micros(pc.multiply_checked(col, 1_000_000))
        return timestamps_from_strings(col)
    if not pa.types.is_floating(f.type):
        return col
    # the reader reads the integer -0 as -0.0, orjson as 0: the rules' path tells -0 from -0.0
    v = col.to_numpy(zero_copy_only=False)
    return None if (np.signbit(v) & (v == 0)).any() else finite_floats(col, f)


def parse_arrow_json(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """pyarrow's JSON reader with an explicit schema; anything it might read otherwise than
    :func:`parse_orjson` (or refuses) is parsed by that, so both give the same values or refusal."""
    data = bytes(payload)
    if any(is_nested(t) or pa.types.is_decimal(t) for t in fields.types):
        return parse_orjson(data, fields, count)  # the reader's own nested and decimal rules differ
    batch = None if _not_json_to_arrow(data) else _arrow_batch(data, fields, count)
    return batch if batch is not None else parse_orjson(data, fields, count)


def _arrow_read(data: bytes, fields: pa.Schema, seconds: bool) -> pa.Table | None:
    read_as = pa.schema([pa.field(f.name, _read_type(f.type, seconds)) for f in fields])
    try:
        return pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 16, len(data) + 1)),
            parse_options=pajson.ParseOptions(
                explicit_schema=read_as, unexpected_field_behavior="ignore", newlines_in_values=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        return None


def _arrow_batch(data: bytes, fields: pa.Schema, count: int) -> pa.RecordBatch | None:
    """The fast path's batch, or None where it would not be exactly the rules' answer."""
    t = _arrow_read(data, fields, seconds=False)
    if t is None and TIMESTAMP in fields.types:  # timestamps as epoch seconds, one read more
        t = _arrow_read(data, fields, seconds=True)
    if t is None or t.num_rows != count or _has_null_rows(t):
        return None  # the rules' path names the count, or checks the null rows' lines hold a field
    try:
        cols = [_arrow_column(t.column(f.name).combine_chunks(), f) for f in fields]
    except (BadValue, pa.ArrowInvalid):
        return None
    return None if any(c is None for c in cols) else pa.RecordBatch.from_arrays(cols, schema=fields)


def _has_null_rows(t: pa.Table) -> bool:
    """Whether some row is null in every column (its line may hold none of the schema's keys)."""
    if not t.num_rows:
        return False
    valid = None
    for col in t.columns:
        v = pc.is_valid(col)
        valid = v if valid is None else pc.or_(valid, v)
    return not pc.all(valid).as_py()


def parse_naive_rows(payload: bytes | memoryview, fields: pa.Schema, count: int) -> list[tuple]:
    """The naive path, for comparison only: per-row orjson into Python tuples (values as JSON gives them)."""
    names = fields.names
    lines, numbers = numbered_lines(bytes(payload))
    try:
        rows = [tuple(d.get(n) for n in names) for d in map(orjson.loads, lines)]
    except (orjson.JSONDecodeError, AttributeError):  # not JSON, or not an object: the rules name it
        _rows(payload, fields, count)
        raise
    if len(rows) != count:
        raise BucketError("count_mismatch", f"header says {count} tuples, payload has {len(rows)} lines")
    return rows


def parse_naive(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """The naive path's batch: its Python rows through the same rules as :func:`parse_orjson` (a
    DECIMAL's exact digits are that path's: the naive rows have only doubles)."""
    if any(exact_numbers(t) for t in fields.types):
        return parse_orjson(payload, fields, count)
    rows = parse_naive_rows(payload, fields, count)
    _, numbers = numbered_lines(bytes(payload))
    if any(all(v is None for v in r) for r in rows):  # its line has the keys with null, or none of them
        _rows(payload, fields, count)
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
    arrays = [column(c, f, numbers) for c, f in zip(cols, fields, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=fields)
