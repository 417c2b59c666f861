"""A small Parquet file of several types, and the values the pipeline carries for each of its rows."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

T0 = dt.datetime(2023, 11, 14, 22, 13, 20)


def sample_table(n: int = 300) -> pa.Table:
    """``n`` rows: a string (with nulls and non-ASCII), integers (one unsigned), a double, a boolean,
    a timestamp without a zone in ms, a date, a decimal and a list of strings."""
    return pa.table(
        {
            "name": pa.array([None if i % 17 == 0 else f"n{i}-é" for i in range(n)], pa.string()),
            "n": pa.array([i * 1_000_003 - 7 for i in range(n)], pa.int64()),
            "small": pa.array([i % 256 for i in range(n)], pa.uint8()),
            "price": pa.array([i / 8 for i in range(n)], pa.float64()),
            "ok": pa.array([i % 3 == 0 for i in range(n)], pa.bool_()),
            "ts": pa.array([T0 + dt.timedelta(milliseconds=1001 * i) for i in range(n)], pa.timestamp("ms")),
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)], pa.date32()),
            "amount": pa.array([decimal.Decimal(i * 37) / 100 for i in range(n)], pa.decimal128(10, 2)),
            "tags": pa.array([[f"t{i % 4}"] * (i % 3) for i in range(n)], pa.list_(pa.string())),
        }
    )


def carried(table: pa.Table) -> pa.Table:
    """``sample_table``'s rows as the pipeline carries them (its timestamps in UTC µs, UINT8 as SMALLINT)."""
    return table.set_column(2, "small", table.column("small").cast(pa.int16())).set_column(
        5, "ts", table.column("ts").cast(pa.timestamp("us", tz="UTC"))
    )


def write_sample(path: Path, n: int = 300, row_group_size: int = 100) -> pa.Table:
    """Write ``sample_table(n)`` to ``path``; return what the pipeline carries of it."""
    t = sample_table(n)
    pq.write_table(t, path, row_group_size=row_group_size)
    return carried(t)
