"""cloudprofiler.wait_for_factory: the factory parses at full speed and the query has run its first batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

import cloudprofiler
from tests.helpers.embedded_source import embedded_source


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_wait_for_factory_returns_once_workers_are_warm_and_the_first_batch_ran(
    spark: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    df = embedded_source(spark, spool, workers="2")
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

    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.stream_reader import CloudprofilerStreamReader

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


def test_the_embedded_factory_starts_without_holding_up_spark_and_is_announced_only_when_ready(
    tmp_path: Path,
) -> None:
    """initialOffset and latestOffset answer while a worker is still starting (Spark plans its first
    batch meanwhile); _reader.json, which tools wait for, appears only once every worker is ready."""
    import fcntl
    import time

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.state import live_reader_state, wait_reader_state
    from cp_source.reader.stream_reader import CloudprofilerStreamReader

    spool = tmp_path / "spool"
    (spool / "w0").mkdir(parents=True, mode=0o700)
    spool.chmod(0o700)
    # w0 cannot take its spool directory while this lock is held: it stays "starting" for real
    held = open(spool / "w0" / "lock", "a+b")  # noqa: SIM115 - released below
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    options = {"spool": str(spool), "endpoint": "tcp://127.0.0.1:0", "workers": "2", "fetch": "local"}
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    try:
        start = reader.initialOffset()
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert live_reader_state(spool) is None  # w0 is not ready: nobody is told to send yet
        held.close()  # lets w0 go on
        state = wait_reader_state(spool, timeout=240)
        for w in ("w0", "w1"):
            stats = orjson.loads((spool / w / "stats.json").read_bytes())
            assert stats["ready"] is True, (w, stats)
        summary = run_generator(state.factory_endpoint, GeneratorSettings(10_000, 0.2, ready_timeout=60))
        assert summary["emitted"] == 2000 and summary["dropped"] == 0, summary
        rows = 0
        deadline = time.monotonic() + 120
        while rows < 2000 and time.monotonic() < deadline:
            time.sleep(0.1)
            end = reader.latestOffset(start, ReadAllAvailable())
            rows = sum(s[2] for p in reader.partitions(start, end) for s in p.segments)
        assert rows == 2000
    finally:
        held.close()
        reader.stop()
    assert live_reader_state(spool) is None
