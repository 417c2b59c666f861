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


def test_a_batch_without_data_is_one_empty_task_per_worker(tmp_path: Path) -> None:
    """Spark's first batch has no data; its tasks start the executors' Python workers."""
    import pickle

    from cp_source.stream_reader import CloudprofilerStreamReader, ReaderOptions, source_schema

    options = {"spool": str(tmp_path / "spool"), "factory": "external", "fetch": "local", "workers": "3"}
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    try:
        start = reader.initialOffset()
        parts = reader.partitions(start, start)
        assert [(p.worker, p.segments) for p in parts] == [("w0", []), ("w1", []), ("w2", [])]
        executor = pickle.loads(pickle.dumps(reader))
        assert [b for p in parts for b in executor.read(pickle.loads(pickle.dumps(p)))] == []
    finally:
        reader.stop()
