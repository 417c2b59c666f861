"""Small segments joined into large Arrow batches before they reach Spark.

A fast stream over several factory workers publishes many small segments (a worker
publishes every 200 ms whatever it holds), and Spark pays for every Arrow batch a Python
source hands it: one IPC message, one columnar batch on the JVM side, one stamp. So an
executor joins consecutive batches of its partition into batches of about ``TARGET_ROWS``
rows (or ``TARGET_BYTES``, whichever comes first) before stamping them. Order is kept
(batches are joined in the order read) and every row goes out exactly once; at most one
target's worth of rows plus one input batch is held at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

# The bare DataSource's best shape hands Spark 65,536-row batches (benchmarks/readpath.py).
TARGET_ROWS = 1 << 16
TARGET_BYTES = 32 << 20


def coalesced(tables: Iterable[Any], rows: int = TARGET_ROWS, nbytes: int = TARGET_BYTES) -> Iterator[Any]:
    """The rows of ``tables`` (Arrow tables, read lazily), in order, as ``RecordBatch``es of at least
    ``rows`` rows or ``nbytes`` bytes each (the last may be smaller; one input batch larger than the
    target goes alone, unsplit). Schema metadata (each segment's own) is dropped."""
    pending: list[Any] = []
    count = size = 0
    for table in tables:
        for batch in table.to_batches():
            if batch.num_rows == 0:
                continue
            pending.append(batch)
            count += batch.num_rows
            size += batch.nbytes
            if count >= rows or size >= nbytes:
                yield joined(pending)
                pending, count, size = [], 0, 0
    if pending:
        yield joined(pending)


def joined(batches: list[Any]) -> Any:
    """One contiguous batch of ``batches`` (no copy for a single one), without schema metadata."""
    import pyarrow as pa

    out = (
        batches[0]
        if len(batches) == 1
        else pa.concat_batches([b.replace_schema_metadata(None) for b in batches])
    )
    return out.replace_schema_metadata(None)
