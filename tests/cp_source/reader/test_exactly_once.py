"""Exactly once on the real path: generator, ZeroMQ, embedded factory, spool, Spark, Parquet."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudprofiler import wait_for_factory
from cloudprofiler.spark_local import source_end_offset
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, output_ids, spool_drained
from tests.helpers.polling import wait_for


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.long  # over 8 s: keeps the quick tier within its budget
def test_embedded_factory_run_is_exactly_once(spark, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    df = embedded_source(spark, spool, workers="2", maxRecordsPerTrigger="40000").select(
        "tuple_id", "cp_tsc_factory", "cp_tsc_source"
    )
    out = tmp_path / "out"
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        state = wait_for_factory(str(spool), query)
        assert state.factory == "embedded" and state.factory_endpoint.startswith("tcp://127.0.0.1:")
        summary = run_generator(
            state.factory_endpoint, GeneratorSettings(rate=40_000, duration=2.0, senders=2, bucket=500)
        )
        assert summary["eos_delivered"]
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to reach {latest}")
        assert query.exception() is None
        worker_pids = [w.pid for w in Spool(spool).worker_states().values()]
    finally:
        query.stop()
    # stop() of the reader stopped the embedded factory's worker processes
    wait_for(lambda: not any(_pid_alive(p) for p in worker_pids), 30, "factory workers to exit")

    stats = Spool(spool).stats()
    want, counts = expected_ids(summary, stats)
    assert counts["offered"] == summary["offered"] == 80_000
    assert counts["rejected"] == 0 and stats.deadletters_total == 0
    got = output_ids(spark, out)
    assert_exactly_once(got, want)
    assert len(got) == summary["emitted"] - counts["lost"]
    # the factory stamped before the source did, on the same TSC
    bad = spark.read.parquet(str(out)).filter("cp_tsc_source < cp_tsc_factory").count()
    assert bad == 0
