"""cloudprofiler.wait_for_factory: the factory parses at full speed and the query has run its first batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

import cloudprofiler


def test_wait_for_factory_returns_once_workers_are_warm_and_the_first_batch_ran(
    spark: Any, tmp_path: Path
) -> None:
    cloudprofiler.register(spark)
    spool = tmp_path / "spool"
    df = (
        spark.readStream.format("cloudprofiler")
        .option("endpoint", "tcp://127.0.0.1:0")
        .option("spool", str(spool))
        .option("workers", "2")
        .load()
    )
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        state = cloudprofiler.wait_for_factory(str(spool), query, timeout=300)
        assert state.factory == "embedded" and state.factory_endpoint.startswith("tcp://127.0.0.1:")
        # Spark's first micro-batch (no data yet) has finished: data sent now does not wait behind it
        assert query.lastProgress is not None
        assert query.lastProgress["numInputRows"] == 0
        # every worker reported ready only after its warm-up parse
        for w in ("w0", "w1"):
            stats = orjson.loads((spool / w / "stats.json").read_bytes())
            assert stats["ready"] is True
    finally:
        query.stop()
