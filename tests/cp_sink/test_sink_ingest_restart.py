"""Ingest source into the sink, driver killed with SIGKILL mid-stream and restarted: each id once."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cp_sink import read_records, total_seen
from cp_sink.records import published_batches
from cp_source.reader.state import live_reader_state
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids
from tests.helpers.polling import wait_for
from tests.helpers.streaming import start_driver_script

DRIVER = textwrap.dedent(
    """
    import sys
    from cloudprofiler.spark_local import local_session
    from cp_common.stamp_columns import FACTORY, SOURCE, node_column, tsc_column

    out, checkpoint, spool, mode = sys.argv[1:5]
    spark = local_session("sink-ingest-restart", conf={"spark.driver.memory": "1g"})
    reader = spark.readStream.format("cloudprofiler").option("spool", spool).option("factory", "external")
    if mode == "run":  # small batches, so the kill lands mid-stream; the restart takes the rest at once
        reader = reader.option("maxRecordsPerTrigger", "4000")
    df = reader.load().select("tuple_id", tsc_column(FACTORY), tsc_column(SOURCE), node_column(SOURCE))
    w = (df.writeStream.format("cloudprofiler").option("path", out).option("checkpointLocation", checkpoint))
    trigger = {"availableNow": True} if mode == "finish" else {"processingTime": "300 milliseconds"}
    q = w.trigger(**trigger).start()
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    spark.stop()
    """
)


# the `factory` fixture (tests/conftest.py): an external factory writing tmp_path/spool
pytestmark = pytest.mark.factory(workers=2)


def _driver(script: Path, tmp_path: Path, spool: str, mode: str) -> subprocess.Popen:
    args = [str(tmp_path / "records"), str(tmp_path / "ckpt"), spool, mode]
    return start_driver_script(script, args, tmp_path / "driver.log")


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "driver.log").read_text(errors="replace")[-3000:]


@pytest.mark.long
def test_ingest_into_sink_killed_and_restarted(tmp_path: Path, factory: Any) -> None:
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out = tmp_path / "records"
    result: dict[str, Any] = {}

    def generate() -> None:
        result["summary"] = run_generator(
            factory.endpoint, GeneratorSettings(rate=30_000, duration=3.0, senders=1, bucket=500)
        )

    driver = _driver(script, tmp_path, str(factory.spool), "run")
    gen = threading.Thread(target=generate, name="generator", daemon=True)
    try:
        wait_for(
            lambda: driver.poll() is not None or live_reader_state(factory.spool) is not None,
            120,
            "the driver's reader to start",
        )
        assert driver.poll() is None, _tail(tmp_path)
        gen.start()
        wait_for(lambda: driver.poll() is not None or len(published_batches(out)) >= 3, 120, "three batches")
        assert driver.poll() is None, _tail(tmp_path)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)  # the Python driver, its JVM and the source runner
        driver.wait(30)
    gen.join(60)
    summary = result["summary"]
    assert summary["eos_delivered"]
    published_before = total_seen(out)
    assert 0 < published_before < summary["emitted"], "the kill must land mid-stream"
    assert factory.wait_drained(60)

    again = _driver(script, tmp_path, str(factory.spool), "finish")
    try:
        again.wait(180)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait(30)
    assert again.returncode == 0, _tail(tmp_path)

    want, counts = expected_ids(summary, Spool(factory.spool).stats())
    assert counts["offered"] == 90_000
    got = np.sort(read_records(out)["tuple_id"].to_numpy())
    assert_exactly_once(got, want)
    assert total_seen(out) == len(want)
    assert sorted(published_batches(out)) == list(range(max(published_batches(out)) + 1))
