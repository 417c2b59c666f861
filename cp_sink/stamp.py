"""Stamp points in the middle of a query: ``stamp(df, "name")``.

Adds ``cp_tsc_<name>`` (int64 TSC) and ``cp_node_<name>`` (TSC domain id)
through ``mapInArrow``. The function runs in whatever stage the DataFrame is
in, so a stamp after a shuffle is taken by the task that reads the shuffle:
latency can be measured stage to stage. Each Arrow batch gets one reading,
taken when the batch reaches the stamp point.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def check_point_name(name: str) -> str:
    """A stamp point name: lower case letters, digits and underscores, starting with a letter."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"invalid stamp point name {name!r}: use [a-z][a-z0-9_]*, at most 32 characters")
    return name


def stamp_batches(batches: Iterator[pa.RecordBatch], name: str) -> Iterator[pa.RecordBatch]:
    """Append the two stamp columns of point ``name`` to each batch."""
    import native_tsc

    node = pa.scalar(native_tsc.domain_id(), pa.string())
    now = native_tsc.now
    for batch in batches:
        tsc = now()
        n = batch.num_rows
        yield batch.append_column(f"cp_tsc_{name}", pa.array(np.full(n, tsc, np.int64))).append_column(
            f"cp_node_{name}", pa.repeat(node, n)
        )


def stamp(df: Any, name: str) -> Any:
    """Return ``df`` with ``cp_tsc_<name>`` and ``cp_node_<name>`` added by a mapInArrow stage."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    check_point_name(name)
    existing = set(df.columns)
    for col in (f"cp_tsc_{name}", f"cp_node_{name}"):
        if col in existing:
            raise ValueError(f"stamp point {name!r} already exists in this query (column {col})")
    schema = StructType(
        list(df.schema.fields)
        + [
            StructField(f"cp_tsc_{name}", LongType(), False),
            StructField(f"cp_node_{name}", StringType(), False),
        ]
    )

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return stamp_batches(batches, name)

    return df.mapInArrow(fn, schema)
