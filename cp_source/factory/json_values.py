"""What a JSON value becomes in a payload field: the rules every payload parser follows.

Each converter takes one field's values (as a JSON decoder gives them) and gives
an Arrow array of the field's type, or raises :class:`BadValue` naming the first
value it refuses. A value is never truncated or reinterpreted; see
``cp_source.factory.parse_json`` for the flat types' rules, and below for the
decimal and nested ones:

* DECIMAL(p,s) takes a JSON number or a numeric string, rounded half up to ``s``
  digits as Spark's JSON reader does (``1.005`` into DECIMAL(10,2) is 1.01); one
  that then needs more than ``p`` digits is refused (Spark would give null). Its
  digits are read exactly (a decoder that keeps them, not through a double).
* STRUCT<...> takes an object (keys matched exactly, a missing one is null, others
  ignored); ARRAY<T> an array (null elements kept); MAP<STRING,T> an object. Each
  member follows its own type's rule, and a refusal names its path
  (``user.tags[2]``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

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
    Decimal: "a number with a fraction or an exponent",
}


class BadValue(Exception):
    """Value ``index`` of a column breaks the rules; ``expected`` says what the column takes.

    ``inner``: for a member of a nested value, its path below the field (``.id``, ``[2]``), its type
    and its value (the refusal names them rather than the whole value)."""

    def __init__(self, index: int, expected: str, inner: tuple[str, pa.DataType, Any] | None = None) -> None:
        super().__init__(index, expected)
        self.index = index
        self.expected = expected
        self.inner = inner


def sql_name(t: pa.DataType) -> str:
    """The Spark DDL name of a payload field's Arrow type (``BIGINT`` for int64)."""
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_struct(t):
        return f"STRUCT<{', '.join(f'{c.name}: {sql_name(c.type)}' for c in t)}>"
    if pa.types.is_list(t):
        return f"ARRAY<{sql_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"MAP<STRING, {sql_name(t.item_type)}>"
    return _SQL_NAMES.get(t, str(t))


def exact_numbers(t: pa.DataType) -> bool:
    """Whether a field's values need a number's exact digits (a DECIMAL in it, at any depth)."""
    if pa.types.is_decimal(t):
        return True
    if pa.types.is_struct(t):
        return any(exact_numbers(c.type) for c in t)
    if pa.types.is_list(t):
        return exact_numbers(t.value_type)
    return pa.types.is_map(t) and exact_numbers(t.item_type)


def is_nested(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_map(t)


def _shown(v: Any) -> str:
    if type(v) is Decimal:
        return str(v)  # its digits, as the line gave them
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
    """Raise BadValue for the first value that is neither null nor ``ok``."""
    for i, v in enumerate(values):
        if v is not None and not ok(v):
            raise BadValue(i, expected)


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
        raise BadValue(bad, f"a number that {sql_name(f.type)} can hold")
    return out


def _double(v: Any) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer of over 308 digits (exact decoding): no double holds it
        return float("inf")


def _floats(values: Sequence[Any], f: pa.Field) -> pa.Array:
    _only(values, {int, float, Decimal}, "a number")
    # an integer (or an exact number, in a field with a DECIMAL) is rounded as a JSON reader reads
    # its digits, to the nearest double
    doubles = [v if type(v) is float or v is None else _double(v) for v in values]
    return finite_floats(pa.array(doubles, pa.float64()), f)


def dates_from_strings(strs: pa.Array) -> pa.Array:
    """``YYYY-MM-DD`` strings as DATE (Arrow's own cast, the same for every parser)."""
    expected = "a date as a 'YYYY-MM-DD' string"
    try:
        out = strs.cast(pa.date32())
    except pa.ArrowInvalid:
        raise BadValue(_first_failing(strs, lambda a: a.cast(pa.date32())), expected) from None
    days = out.cast(pa.int32())
    if out.null_count < len(out) and pc.min(days).as_py() < _MIN_DAYS:
        raise BadValue(pc.index(pc.less(days, _MIN_DAYS), True).as_py(), expected)
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
        raise BadValue(_first_failing(strs, _iso_cast), _TS_EXPECTED) from None


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
            raise BadValue(pc.index(outside, True).as_py(), _TS_EXPECTED)
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
                raise BadValue(i, _TS_EXPECTED)
            micros[i] = v * 1_000_000
    return timestamps_from_micros(pa.array(micros, pa.int64()))


def _converter(t: pa.DataType) -> Converter:
    """The conversion of JSON values into Arrow type ``t`` (``_CONVERTERS``, in order)."""
    for is_type, convert in _CONVERTERS:
        if is_type(t):
            return convert
    raise ValueError(f"no JSON conversion for {t}")


def column(values: Sequence[Any], f: pa.Field, lines: Sequence[int]) -> pa.Array:
    """The JSON values of one field (as orjson decodes them) as an Arrow array of its type.

    ``lines`` are the values' line numbers, for the refusal: a ``BucketError("bad_json")``."""
    try:
        return _converter(f.type)(values, f)
    except BadValue as e:
        if e.inner is None:
            raise _refusal(f, values[e.index], lines[e.index], e.expected) from None
        path, t, value = e.inner
        raise _refusal(pa.field(f.name + path, t), value, lines[e.index], e.expected) from None


_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _decimal(v: Any) -> Decimal | None:
    """A JSON number or numeric string as an exact Decimal; None if it is neither."""
    kind = type(v)
    if kind is int or kind is Decimal:
        return Decimal(v)
    if kind is float:  # decoded without exact digits: its shortest repr is the text it came from
        return Decimal(repr(v))
    if kind is str and len(v) <= 400 and _DECIMAL_TEXT.fullmatch(v):
        return Decimal(v)
    return None


def _decimals(values: Sequence[Any], f: pa.Field) -> pa.Array:
    """Rounded half up to the scale, as Spark's reader; refused if the digits then exceed the precision."""
    t = f.type
    expected = f"a number (or numeric string) that {sql_name(t)} holds"
    step = Decimal(1).scaleb(-t.scale)
    out: list[Decimal | None] = []
    with localcontext(prec=100):
        for i, v in enumerate(values):
            d = None if v is None else _decimal(v)
            if v is None:
                out.append(None)
                continue
            # a huge exponent would overflow the rounding: it is past every precision anyway
            if d is None or not d.is_finite() or d.adjusted() >= t.precision - t.scale + 1:
                raise BadValue(i, expected)
            r = d.quantize(step, rounding=ROUND_HALF_UP)
            if r.adjusted() >= t.precision - t.scale:
                raise BadValue(i, expected)
            out.append(r)
    return pa.array(out, t)


def _member(e: BadValue, path: str, t: pa.DataType, values: Sequence[Any], row: int) -> BadValue:
    """A member's refusal as its parent's: the parent's row, the member's path from the parent."""
    if e.inner is None:
        return BadValue(row, e.expected, (path, t, values[e.index]))
    return BadValue(row, e.expected, (path + e.inner[0], e.inner[1], e.inner[2]))


def _structs(values: Sequence[Any], f: pa.Field) -> pa.Array:
    _only(values, {dict}, "an object")
    children = []
    for c in f.type:
        member = [None if v is None else v.get(c.name) for v in values]
        try:
            children.append(_converter(c.type)(member, c))
        except BadValue as e:
            raise _member(e, f".{c.name}", c.type, member, e.index) from None
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(f.type), mask=mask)


def _flatten(values: Sequence[Any], kind: type, expected: str) -> tuple[list[Any], np.ndarray, pa.Array]:
    """The members of each list (or object) value, end to end: members, offsets, null mask."""
    _only(values, {kind}, expected)
    flat: list[Any] = []
    offsets = np.zeros(len(values) + 1, np.int32)
    for i, v in enumerate(values):
        if v is not None:
            flat.extend(v)
        offsets[i + 1] = len(flat)
    return flat, offsets, pa.array([v is None for v in values], pa.bool_())


def _items(
    flat: list[Any], offsets: np.ndarray, item: pa.Field, member: Callable[[int, int], str]
) -> pa.Array:
    """The flattened members of lists or maps converted; a refusal names its row and
    ``member(index, row)`` (``[2]`` in a list, ``["key"]`` in a map)."""
    try:
        return _converter(item.type)(flat, item)
    except BadValue as e:
        row = int(np.searchsorted(offsets, e.index, side="right")) - 1
        raise _member(e, member(e.index, row), item.type, flat, row) from None


def _lists(values: Sequence[Any], f: pa.Field) -> pa.Array:
    flat, offsets, mask = _flatten(values, list, "an array")
    item = pa.field("item", f.type.value_type)
    items = _items(flat, offsets, item, lambda i, row: f"[{i - offsets[row]}]")
    return pa.ListArray.from_arrays(pa.array(offsets), items, mask=mask)


def _maps(values: Sequence[Any], f: pa.Field) -> pa.Array:
    keys, offsets, mask = _flatten(values, dict, "an object")
    flat = [v[k] for v in values if v is not None for k in v]
    item = pa.field("value", f.type.item_type)
    items = _items(flat, offsets, item, lambda i, _row: f"[{_shown(keys[i])}]")
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()), items, mask=mask)


Converter = Callable[[Sequence[Any], pa.Field], pa.Array]

# Arrow type -> its conversion from JSON values; the first predicate that holds wins.
_CONVERTERS: tuple[tuple[Callable[[pa.DataType], bool], Converter], ...] = (
    (pa.types.is_decimal, _decimals),
    (pa.types.is_struct, _structs),
    (pa.types.is_list, _lists),
    (pa.types.is_map, _maps),
    (pa.types.is_string, _strings),
    (pa.types.is_boolean, _booleans),
    (pa.types.is_integer, _integers),
    (pa.types.is_floating, _floats),
    (pa.types.is_date32, _dates),
    (lambda t: t == TIMESTAMP, _timestamps),
)
