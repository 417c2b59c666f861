"""End to end with the ingest source: generator, ZeroMQ, embedded factory, reader, the cloudprofiler sink.

A task fails once for real on the way (Spark retries it); the committed records
still hold each delivered tuple id exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cp_sink import read_counts, read_records, total_seen
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, spool_drained
from tests.helpers.polling import wait_for


@pytest.mark.long
def test_ingest_to_sink_exactly_once_with_a_task_retry(spark, tmp_path: Path) -> None:
    import cloudprofiler
    from cloudprofiler import wait_for_factory
    from cloudprofiler.spark_local import source_end_offset
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    cloudprofiler.register(spark)
    marker = tmp_path / "failed-once"

    def fail_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        for b in batches:
            yield b
            if b.num_rows and not marker.exists():
                marker.write_text(str(TaskContext.get().taskAttemptId()))
                raise RuntimeError("injected task failure")

    spool = tmp_path / "spool"
    df = embedded_source(spark, spool, workers="2", maxRecordsPerTrigger="30000").select(
        "tuple_id",
        "cp_tsc_gen",
        "cp_node_gen",
        "cp_tsc_factory",
        "cp_node_factory",
        "cp_tsc_source",
        "cp_node_source",
    )
    df = df.mapInArrow(fail_first_attempt, df.schema)
    out = tmp_path / "records"
    query = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(out))
        .option("handler", "id")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        state = wait_for_factory(str(spool), query)
        summary = run_generator(
            state.factory_endpoint, GeneratorSettings(rate=30_000, duration=3.0, senders=1, bucket=500)
        )
        assert summary["eos_delivered"]
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to reach {latest}")
        assert query.exception() is None
    finally:
        query.stop()

    want, counts = expected_ids(summary, Spool(spool).stats())
    assert counts["offered"] == summary["offered"] == 90_000
    rec = read_records(out)
    got = np.sort(rec["tuple_id"].to_numpy())
    assert_exactly_once(got, want)
    assert total_seen(out) == len(want)
    assert marker.exists()  # the failure happened, and its attempt was not published
    assert int(marker.read_text()) not in read_counts(out)["task_attempt"].to_pylist()
    # Every stamp point of the path is in the records, in path order on this one TSC.
    for a, b in (("gen", "factory"), ("factory", "source"), ("source", "sink")):
        assert pc.all(pc.less_equal(rec[f"cp_tsc_{a}"], rec[f"cp_tsc_{b}"])).as_py(), (a, b)
