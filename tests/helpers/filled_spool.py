"""A spool filled with the real segment writer, and a streaming source over it, for reader tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa


def segment_table(first_id: int, n: int) -> pa.Table:
    """A YSB segment of ``n`` rows with tuple ids first_id .. first_id + n - 1, as the factory writes it
    (its intended stamp, one per bucket, goes into its metadata: ``fill_spool``)."""
    from cp_source.wire.workloads import stored_schema, ysb_fields, ysb_rows

    schema = stored_schema(ysb_fields())
    rows = ysb_rows(n, seed=first_id)
    cols = {f: pa.array([r[f] for r in rows], pa.string()) for f in rows[0]}
    ids = pa.array(range(first_id, first_id + n), pa.int64())
    cols.update(
        event_time=pa.array(
            [1_700_000_000_000_000 + i * 1000 for i in range(n)], pa.timestamp("us", tz="UTC")
        ),
        tuple_id=ids,
        sender_id=pa.array([0] * n, pa.int32()),
        cp_tsc_gen=ids,
        cp_node_gen=pa.array(["gen"] * n, pa.string()),
        cp_tsc_factory=ids,
        cp_node_factory=pa.array(["factory"] * n, pa.string()),
    )
    return pa.table([cols[f.name] for f in schema], schema=schema)


def fill_spool(root: Path, layout: dict[str, list[int]], first_id: int = 0) -> set[int]:
    """Publish segments with the real spool writer: ``layout[worker]`` lists each segment's row count.

    Tuple ids count up from ``first_id`` across the whole call (give a later call a higher one, so
    ids stay unique across the spool); returns them.
    """
    import numpy as np

    from cp_source.spool.segment_writer import SegmentWriter

    ids: set[int] = set()
    next_id = first_id
    for worker, sizes in layout.items():
        writer = SegmentWriter(root, worker)
        try:
            for n in sizes:
                seq = next_id  # unique per sender across calls, as a generator's would be
                table = segment_table(next_id, n)
                buckets = np.array([[0, seq, next_id, n]], dtype=np.int64)
                intended = np.array([next_id], np.int64)  # the segment's one bucket, as its gen stamp
                writer.publish(table, buckets, 0, n, next_id, next_id + n - 1, intended=intended)
                ids.update(range(next_id, next_id + n))
                next_id += n
        finally:
            writer.close()
    return ids


def spool_source(spark: Any, spool: Path, **options: str) -> Any:
    """A streaming DataFrame over ``spool`` read by the cloudprofiler source with an external factory."""
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = (
        spark.readStream.format("cloudprofiler").option("spool", str(spool)).option("factory", "external")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()
