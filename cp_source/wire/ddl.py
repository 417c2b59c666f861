"""Spark DDL schemas (``"name STRING, price DECIMAL(10,2), tags ARRAY<STRING>"``) as Arrow fields.

A small recursive-descent parser over the types Spark's ``from_json`` reads and
the factory parses: the flat types, ``DECIMAL(p,s)`` (``DECIMAL`` alone is
``DECIMAL(10,0)``, as in Spark), ``STRUCT<name: TYPE, ...>``, ``ARRAY<TYPE>``
and ``MAP<STRING, TYPE>``, nested up to :data:`MAX_DEPTH` levels. A field may
end in ``NOT NULL`` (accepted, not enforced) and ``COMMENT 'text'``.

Field names are compared case-insensitively, as Spark resolves them: two
fields of one struct that differ only in case are refused, and so is a
top-level name that is a column the factory adds, in any case. Every error is
one line naming the field and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import pyarrow as pa

MAX_DEPTH = 8  # STRUCT/ARRAY/MAP levels: a schema is typed by a person, not generated
MAX_DDL_CHARS = 64 << 10
# Spark DDL type names -> Arrow types as Spark's own Arrow conversion produces them.
FLAT_TYPES = {
    "string": pa.string(),
    "varchar": pa.string(),
    "char": pa.string(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
DECIMAL_NAMES = ("decimal", "dec", "numeric")
SUPPORTED = ", ".join([*sorted(FLAT_TYPES), "decimal(p,s)", "struct<...>", "array<...>", "map<string,...>"])
_TOKEN = re.compile(r"\s*(?:`((?:[^`]|``)+)`|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')|([<>(),:]))")


class _Syntax(ValueError):
    """The DDL does not parse (the message says where and what was expected)."""


class _Tokens:
    """The DDL's tokens: (kind, text) with kind ``name`` (a backquoted name too), ``int``, ``str`` or
    the punctuation itself."""

    def __init__(self, ddl: str) -> None:
        self.items: list[tuple[str, str]] = []
        pos, ddl = 0, ddl.rstrip()
        while pos < len(ddl):
            m = _TOKEN.match(ddl, pos)
            if not m:
                raise _Syntax(f"at {ddl[pos:].strip()[:30]!r}: unexpected character")
            quoted, word, number, text, punct = m.groups()
            if quoted is not None or word is not None:
                self.items.append(("name", quoted.replace("``", "`") if quoted is not None else word))
            elif number is not None:
                self.items.append(("int", number))
            elif text is not None:
                self.items.append(("str", text))
            else:
                self.items.append((punct, punct))
            pos = m.end()
        self.pos = 0

    def peek(self) -> tuple[str, str]:
        return self.items[self.pos] if self.pos < len(self.items) else ("end", "the end")

    def take(self, kind: str, where: str) -> str:
        k, text = self.peek()
        if k != kind:
            raise _Syntax(f"{where}: expected {'a name' if kind == 'name' else repr(kind)}, got {text!r}")
        self.pos += 1
        return text

    def word(self, *words: str) -> bool:
        """Take the next token if it is one of ``words`` (any case)."""
        k, text = self.peek()
        if k == "name" and text.lower() in words:
            self.pos += 1
            return True
        return False


def parse_fields(ddl: str, reserved: Collection[str] = ()) -> pa.Schema:
    """A Spark DDL schema as Arrow fields; ``reserved``: top-level names refused (in any case)."""
    if not ddl or not ddl.strip():
        raise ValueError("empty schema: expected Spark DDL such as 'name STRING, price DOUBLE'")
    if len(ddl) > MAX_DDL_CHARS:
        raise ValueError(f"schema of {len(ddl)} characters: at most {MAX_DDL_CHARS}")
    try:
        tokens = _Tokens(ddl)
        fields = _fields(tokens, 0, "end", ",")
        if tokens.peek()[0] != "end":
            raise _Syntax(f"at {tokens.peek()[1]!r}: expected ',' or the end")
    except _Syntax as e:
        raise ValueError(f"cannot parse schema {ddl.strip()[:60]!r}: {e}") from None
    taken = {n.lower(): n for n in reserved}
    for f in fields:
        if f.name.lower() in taken:
            raise ValueError(
                f"field name {f.name!r} is reserved for the column {taken[f.name.lower()]!r} the factory "
                "adds (names are case-insensitive, as in Spark)"
            )
    return pa.schema(fields)


def _fields(tokens: _Tokens, depth: int, end: str, sep: str) -> list[pa.Field]:
    """``name [:] TYPE [NOT NULL] [COMMENT '...']`` separated by ``sep`` up to ``end``."""
    fields: list[pa.Field] = []
    seen: dict[str, str] = {}
    while True:
        where = f"field {len(fields) + 1} of the schema" if not depth else "a struct field"
        name = tokens.take("name", where)
        if tokens.peek()[0] == ":":
            tokens.pos += 1
        t = _type(tokens, depth, name)
        if tokens.word("not") and not tokens.word("null"):
            raise _Syntax(f"field {name!r}: expected NULL after NOT")
        if tokens.word("comment"):
            tokens.take("str", f"field {name!r}: COMMENT")
        if name.lower() in seen:
            other = seen[name.lower()]
            also = "" if other == name else f" (and {other!r}: names are case-insensitive, as in Spark)"
            raise ValueError(f"duplicate field {name!r}{also}")
        seen[name.lower()] = name
        fields.append(pa.field(name, t))
        if tokens.peek()[0] != sep:
            break
        tokens.pos += 1
    if end != "end":
        tokens.take(end, f"field {fields[-1].name!r}: after its type")
    return fields


def _type(tokens: _Tokens, depth: int, name: str) -> pa.DataType:
    kind, text = tokens.peek()
    if kind != "name":
        raise _Syntax(f"field {name!r}: expected a type, got {text!r}")
    tokens.pos += 1
    low = text.lower()
    if low in ("struct", "array", "map"):
        if depth >= MAX_DEPTH:
            raise ValueError(f"field {name!r}: nested deeper than {MAX_DEPTH} levels")
        tokens.take("<", f"field {name!r}: {text.upper()}")
        if low == "struct":
            return pa.struct(_fields(tokens, depth + 1, ">", ","))
        if low == "array":
            item = _type(tokens, depth + 1, name)
            tokens.take(">", f"field {name!r}: ARRAY<{item}")
            return pa.list_(item)
        key = _type(tokens, depth + 1, name)
        if key != pa.string():
            raise ValueError(f"field {name!r}: a MAP's keys must be STRING (JSON object keys are)")
        tokens.take(",", f"field {name!r}: MAP<STRING")
        value = _type(tokens, depth + 1, name)
        tokens.take(">", f"field {name!r}: MAP<STRING, {value}")
        return pa.map_(pa.string(), value)
    if low in DECIMAL_NAMES:
        return _decimal(tokens, name)
    if low not in FLAT_TYPES:
        raise ValueError(f"unsupported type {text!r} for field {name!r}; supported: {SUPPORTED}")
    if low in ("varchar", "char") and tokens.peek()[0] == "(":  # a length: Spark reads JSON as STRING
        tokens.pos += 1
        tokens.take("int", f"field {name!r}: {text.upper()}(")
        tokens.take(")", f"field {name!r}: {text.upper()}(n")
    return FLAT_TYPES[low]


def _decimal(tokens: _Tokens, name: str) -> pa.DataType:
    """``DECIMAL``, ``DECIMAL(p)`` or ``DECIMAL(p, s)``: 1 <= p <= 38, 0 <= s <= p (Spark's bounds)."""
    precision, scale = 10, 0
    if tokens.peek()[0] == "(":
        tokens.pos += 1
        precision = int(tokens.take("int", f"field {name!r}: DECIMAL("))
        if tokens.peek()[0] == ",":
            tokens.pos += 1
            scale = int(tokens.take("int", f"field {name!r}: DECIMAL({precision},"))
        tokens.take(")", f"field {name!r}: DECIMAL({precision}, {scale}")
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise ValueError(
            f"field {name!r}: DECIMAL({precision},{scale}) out of bounds (precision 1 to 38, scale 0 to it)"
        )
    return pa.decimal128(precision, scale)


_DDL_NAMES = {t: name.upper() for name, t in reversed(FLAT_TYPES.items())}  # the first spelling of each


def to_ddl(fields: pa.Schema) -> str:
    """``fields`` written as the Spark DDL that :func:`parse_fields` reads back to exactly them (names
    backquoted); ValueError for a type DDL has no spelling for here (a Parquet file's binary)."""
    return ", ".join(f"{_quoted(f.name)} {_ddl_type(f.type, f.name)}" for f in fields)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl_type(t: pa.DataType, name: str) -> str:
    if t in _DDL_NAMES:
        return _DDL_NAMES[t]
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{_quoted(f.name)}: {_ddl_type(f.type, name)}" for f in t) + ">"
    if pa.types.is_list(t):
        return f"ARRAY<{_ddl_type(t.value_type, name)}>"
    if pa.types.is_map(t):
        return f"MAP<STRING, {_ddl_type(t.item_type, name)}>"
    raise ValueError(f"field {name!r}: type {t} has no Spark DDL spelling here")
