"""Generic NDJSON payload parsers (any schema): orjson to Arrow, and pyarrow's JSON reader.

A payload is one JSON object per line. Blank lines are ignored, keys not in
the schema are ignored, a missing key is null. A line that carries none of the
schema's keys does not fit the schema (say YSB events sent to a source expecting
other fields): it would become a row of nulls, so the bucket is rejected as
``BucketError("bad_json")`` naming the keys expected and found, and the factory
dead-letters and counts it. Anything else that is not valid raises
``BucketError("bad_json")`` too; a row count different from the header's raises
``BucketError("count_mismatch")``.
"""

from __future__ import annotations

import io

import orjson
import pyarrow as pa
import pyarrow.json as pajson

from cp_source.bucket import BucketError


def _lines(payload: bytes) -> list[bytes]:
    return [ln for ln in payload.split(b"\n") if ln.strip()]


def _no_field(row: dict, fields: pa.Schema, line: int) -> BucketError:
    keys = ", ".join(sorted(map(str, row))[:8]) or "none"
    return BucketError(
        "bad_json",
        f"line {line} does not fit the schema: it has none of its fields "
        f"({', '.join(fields.names[:8])}); its keys: {keys}",
    )


def _check_fits(rows: list[dict], fields: pa.Schema, lines: list[int] | None = None) -> None:
    """Every row carries at least one of the schema's keys (else it would be a row of nulls)."""
    names = fields.names
    for i, r in enumerate(rows):
        if not any(n in r for n in names):
            raise _no_field(r, fields, (lines[i] if lines else i) + 1)


def parse_orjson(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """orjson per line, then one ``pa.array`` per column (the generic orjson-to-Arrow path)."""
    lines = _lines(bytes(payload))
    if len(lines) != count:
        raise BucketError("count_mismatch", f"header says {count} tuples, payload has {len(lines)} lines")
    try:
        rows = [orjson.loads(ln) for ln in lines]
    except orjson.JSONDecodeError as e:
        raise BucketError("bad_json", str(e)) from None
    if not all(type(r) is dict for r in rows):
        raise BucketError("bad_json", "a line is not a JSON object")
    _check_fits(rows, fields)
    try:
        arrays = [pa.array([r.get(f.name) for r in rows], f.type) for f in fields]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
        raise BucketError("bad_json", f"value does not fit the schema: {e}") from None
    return pa.RecordBatch.from_arrays(arrays, schema=fields)


def parse_arrow_json(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """pyarrow's multithreaded-capable JSON reader with an explicit schema."""
    data = bytes(payload)
    try:
        t = pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 16, len(data) + 1)),
            parse_options=pajson.ParseOptions(
                explicit_schema=fields, unexpected_field_behavior="ignore", newlines_in_values=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise BucketError("bad_json", str(e).splitlines()[0][:200]) from None
    if t.num_rows != count:
        raise BucketError("count_mismatch", f"header says {count} tuples, payload has {t.num_rows} rows")
    _check_all_null_rows(t, data, fields)
    cols = []
    for f in fields:
        if f.name in t.column_names:
            col = t.column(f.name)
            cols.append(col.combine_chunks() if col.type == f.type else col.cast(f.type).combine_chunks())
        else:
            cols.append(pa.nulls(t.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=fields)


def _check_all_null_rows(t: pa.Table, data: bytes, fields: pa.Schema) -> None:
    """Rows whose every schema column is null: look at their lines, which must hold a schema key
    (a key with an explicit JSON null fits; a line with none of the keys does not)."""
    import numpy as np
    import pyarrow.compute as pc

    present = [t.column(f.name) for f in fields if f.name in t.column_names]
    if present and t.num_rows:
        valid = np.zeros(t.num_rows, dtype=bool)
        for col in present:
            valid |= pc.is_valid(col).to_numpy(zero_copy_only=False)
        empty = np.flatnonzero(~valid)
    else:
        empty = np.arange(t.num_rows)
    if not len(empty):
        return
    lines = _lines(data)
    idx = [int(i) for i in empty] if len(lines) == t.num_rows else list(range(len(lines)))
    try:
        rows = [orjson.loads(lines[i]) for i in idx]
    except orjson.JSONDecodeError as e:
        raise BucketError("bad_json", str(e)) from None
    _check_fits([r if type(r) is dict else {} for r in rows], fields, idx)


def parse_naive_rows(payload: bytes | memoryview, fields: pa.Schema, count: int) -> list[tuple]:
    """The naive path, for comparison only: per-row orjson into Python tuples."""
    names = fields.names
    rows = [tuple(d.get(n) for n in names) for d in map(orjson.loads, _lines(bytes(payload)))]
    if len(rows) != count:
        raise BucketError("count_mismatch", f"header says {count} tuples, payload has {len(rows)} lines")
    return rows
