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
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from cp_source.wire.bucket import BucketError

TIMESTAMP = pa.timestamp("us", tz="UTC")
_NAIVE = pa.timestamp("us")
_SQL_NAMES = {
    pa.string(): "STRING",
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.date32(): "DATE",
    TIMESTAMP: "TIMESTAMP",
}
# Spark's timestamp range (and Python's datetime's): 0001-01-01 to 9999-12-31, in µs since the epoch
MIN_MICROS = -62_135_596_800_000_000
MAX_MICROS = 253_402_300_799_999_999
_MIN_DAYS = -719_162  # 0001-01-01
# a zone after a time: Z, +hh, +hhmm or +hh:mm (a date alone ends in -dd, which is no zone)
_ZONED = r"[T ][0-9:.]*(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)$"
_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number with a fraction, an exponent or over 64 bits",
    str: "a string",
    dict: "an object",
    list: "an array",
}


class _BadValue(Exception):
    """Value ``index`` of a column breaks the rules; ``expected`` says what the column takes."""

    def __init__(self, index: int, expected: str) -> None:
        super().__init__(index, expected)
        self.index = index
        self.expected = expected


def sql_name(t: pa.DataType) -> str:
    """The Spark DDL name of a payload field's Arrow type (``BIGINT`` for int64)."""
    return _SQL_NAMES.get(t, str(t))


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


def _shown(v: Any) -> str:
    try:
        text = orjson.dumps(v).decode()
    except TypeError:
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _refusal(f: pa.Field, value: Any, line: int, expected: str) -> BucketError:
    kind = _KINDS.get(type(value), type(value).__name__)
    return BucketError(
        "bad_json",
        f"line {line}, field {f.name!r} ({sql_name(f.type)}): {_shown(value)} ({kind}) is not {expected}",
    )


def _first(values: Sequence[Any], ok: Callable[[Any], bool], expected: str) -> None:
    """Raise _BadValue for the first value that is neither null nor ``ok``."""
    for i, v in enumerate(values):
        if v is not None and not ok(v):
            raise _BadValue(i, expected)


def _only(values: Sequence[Any], types: set[type], expected: str) -> None:
    if not set(map(type, values)) <= types | {type(None)}:
        _first(values, lambda v: type(v) in types, expected)


def _strings(values: Sequence[Any], f: pa.Field) -> pa.Array:
    _only(values, {str}, "a string")
    return pa.array(values, pa.string())


def _booleans(values: Sequence[Any], f: pa.Field) -> pa.Array:
    _only(values, {bool}, "true or false")
    return pa.array(values, pa.bool_())


def _integers(values: Sequence[Any], f: pa.Field) -> pa.Array:
    bits = f.type.bit_width
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    expected = f"an integer from {lo} to {hi}"
    _only(values, {int}, expected)  # a float is refused here, so nothing is ever truncated
    try:
        return pa.array(values, f.type)
    except (pa.ArrowInvalid, OverflowError):
        _first(values, lambda v: lo <= v <= hi, expected)
        raise


def finite_floats(doubles: pa.Array, f: pa.Field) -> pa.Array:
    """DOUBLE values as ``f``'s type (FLOAT through DOUBLE, as Spark's reader rounds); none infinite.

    A JSON number never is infinite or NaN, so one that became so did not fit the type."""
    out = doubles if f.type == pa.float64() else doubles.cast(f.type)
    if out.null_count < len(out) and not pc.all(pc.is_finite(out)).as_py():
        bad = pc.index(pc.is_finite(out), False).as_py()
        raise _BadValue(bad, f"a number that {sql_name(f.type)} can hold")
    return out


def _floats(values: Sequence[Any], f: pa.Field) -> pa.Array:
    _only(values, {int, float}, "a number")
    # an integer is rounded as a JSON reader reads its digits, to the nearest double (orjson gives
    # one over 2**64 as a float already, so float() never overflows here)
    doubles = [float(v) if type(v) is int else v for v in values]
    return finite_floats(pa.array(doubles, pa.float64()), f)


def dates_from_strings(strs: pa.Array) -> pa.Array:
    """``YYYY-MM-DD`` strings as DATE (Arrow's own cast, the same for every parser)."""
    expected = "a date as a 'YYYY-MM-DD' string"
    try:
        out = strs.cast(pa.date32())
    except pa.ArrowInvalid:
        raise _BadValue(_first_failing(strs, lambda a: a.cast(pa.date32())), expected) from None
    days = out.cast(pa.int32())
    if out.null_count < len(out) and pc.min(days).as_py() < _MIN_DAYS:
        raise _BadValue(pc.index(pc.less(days, _MIN_DAYS), True).as_py(), expected)
    return out


def _dates(values: Sequence[Any], f: pa.Field) -> pa.Array:
    _only(values, {str}, "a date as a 'YYYY-MM-DD' string")
    return dates_from_strings(pa.array(values, pa.string()))


def _first_failing(strs: pa.Array, convert: Callable[[pa.Array], Any]) -> int:
    """The index of the first string ``convert`` refuses, given that it refuses ``strs`` (bisection:
    a value converts alone as it does among others)."""
    lo, hi = 0, len(strs)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            convert(strs.slice(lo, mid - lo))
        except pa.ArrowInvalid:
            hi = mid
        else:
            lo = mid
    return lo


_TS_EXPECTED = "an ISO-8601 string or whole seconds since the epoch, in the years 0001 to 9999"


def _iso_micros(strs: pa.Array) -> pa.Array:
    """ISO-8601 strings as µs since the epoch (int64): with a zone as that zone says, without one as UTC.

    Arrow's own parser (the one its JSON reader uses), the same for every parser."""
    try:
        return _iso_cast(strs)
    except pa.ArrowInvalid:
        raise _BadValue(_first_failing(strs, _iso_cast), _TS_EXPECTED) from None


def _iso_cast(strs: pa.Array) -> pa.Array:
    # Arrow casts to a zoned type only strings with a zone, to a naive one only those without
    # (and a cast that fails on every value is slow): split them first
    if pc.all(pc.ends_with(strs, "Z")).as_py():
        return strs.cast(TIMESTAMP).cast(pa.int64())
    zoned = pc.fill_null(pc.match_substring_regex(strs, _ZONED), False)
    if not pc.any(zoned).as_py():
        return strs.cast(_NAIVE).cast(pa.int64())
    with_zone = pc.if_else(zoned, strs, None).cast(TIMESTAMP).cast(pa.int64())
    without = pc.if_else(zoned, None, strs).cast(_NAIVE).cast(pa.int64())
    return pc.if_else(zoned, with_zone, without)


def timestamps_from_micros(micros: pa.Array) -> pa.Array:
    """int64 µs as TIMESTAMP, refusing an instant outside the years 0001 to 9999."""
    if micros.null_count < len(micros):
        outside = pc.or_(pc.less(micros, MIN_MICROS), pc.greater(micros, MAX_MICROS))
        if pc.any(outside).as_py():
            raise _BadValue(pc.index(outside, True).as_py(), _TS_EXPECTED)
    return micros.cast(TIMESTAMP)


def timestamps_from_strings(strs: pa.Array) -> pa.Array:
    """ISO-8601 strings as TIMESTAMP (see :func:`_iso_micros`)."""
    return timestamps_from_micros(_iso_micros(strs))


def _timestamps(values: Sequence[Any], f: pa.Field) -> pa.Array:
    # Spark reads a JSON integer as seconds since the epoch, and refuses a fractional number
    _only(values, {str, int}, _TS_EXPECTED)
    strs = pa.array([v if type(v) is str else None for v in values], pa.string())
    micros = _iso_micros(strs).to_pylist()
    for i, v in enumerate(values):
        if type(v) is int:
            if not MIN_MICROS <= v * 1_000_000 <= MAX_MICROS:
                raise _BadValue(i, _TS_EXPECTED)
            micros[i] = v * 1_000_000
    return timestamps_from_micros(pa.array(micros, pa.int64()))


def _converter(t: pa.DataType) -> Callable[[Sequence[Any], pa.Field], pa.Array]:
    if pa.types.is_string(t):
        return _strings
    if pa.types.is_boolean(t):
        return _booleans
    if pa.types.is_integer(t):
        return _integers
    if pa.types.is_floating(t):
        return _floats
    if pa.types.is_date32(t):
        return _dates
    if t == TIMESTAMP:
        return _timestamps
    raise ValueError(f"no JSON conversion for {t}")


def column(values: Sequence[Any], f: pa.Field, lines: Sequence[int]) -> pa.Array:
    """The JSON values of one field (as orjson decodes them) as an Arrow array of its type.

    ``lines`` are the values' line numbers, for the refusal: a ``BucketError("bad_json")``."""
    try:
        return _converter(f.type)(values, f)
    except _BadValue as e:
        raise _refusal(f, values[e.index], lines[e.index], e.expected) from None


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
    return rows, numbers


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
    except (_BadValue, pa.ArrowInvalid):
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
    """The naive path's batch: its Python rows through the same rules as :func:`parse_orjson`."""
    rows = parse_naive_rows(payload, fields, count)
    _, numbers = numbered_lines(bytes(payload))
    if any(all(v is None for v in r) for r in rows):  # its line has the keys with null, or none of them
        _rows(payload, fields, count)
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
    arrays = [column(c, f, numbers) for c, f in zip(cols, fields, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=fields)
