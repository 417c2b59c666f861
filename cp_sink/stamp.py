"""Stamp points in the middle of a query: ``stamp(df, "name")``.

Adds ``cp_tsc_<name>`` (int64 TSC) and ``cp_node_<name>`` (TSC domain id)
through ``mapInArrow``. The function runs in whatever stage the DataFrame is
in, so a stamp after a shuffle is taken by the task that reads the shuffle:
latency can be measured stage to stage. Each Arrow batch gets one reading,
taken when the batch reaches the stamp point.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from cp_common.faces import deprecated_names
from cp_common.stamp_columns import check_point, stamp_columns

check_point_name = check_point  # the name this module has always exported


def stamp_batches(batches: Iterator[pa.RecordBatch], name: str) -> Iterator[pa.RecordBatch]:
    """Append the two stamp columns of point ``name`` to each batch."""
    import native_tsc

    tsc_col, node_col = stamp_columns(name)
    node = pa.scalar(native_tsc.domain_id(), pa.string())
    now = native_tsc.now
    for batch in batches:
        tsc = now()
        n = batch.num_rows
        yield batch.append_column(tsc_col, pa.array(np.full(n, tsc, np.int64))).append_column(
            node_col, pa.repeat(node, n)
        )


def stamp(df: Any, name: str) -> Any:
    """Return ``df`` with ``cp_tsc_<name>`` and ``cp_node_<name>`` added by a mapInArrow stage."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    tsc_col, node_col = stamp_columns(name)
    existing = set(df.columns)
    for col in (tsc_col, node_col):
        if col in existing:
            raise ValueError(f"stamp point {name!r} already exists in this query (column {col})")
    schema = StructType(
        list(df.schema.fields)
        + [StructField(tsc_col, LongType(), False), StructField(node_col, StringType(), False)]
    )

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from cp_common.self_cost import STAMPS, charged

        return charged(stamp_batches(batches, name), STAMPS)  # the whole stage: the profiler's cost

    return df.mapInArrow(fn, schema)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["stamp"])
