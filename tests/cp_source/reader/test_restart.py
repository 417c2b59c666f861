"""Exactly once across failures: the Spark driver killed hard, and a factory worker killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.reader.state import live_reader_state
from cp_source.spool.segments import Spool
from tests.helpers.cluster_harness import DRIVER_JOB
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, output_ids, spool_drained
from tests.helpers.polling import wait_for
from tests.helpers.streaming import await_query, run_available_now

# the `factory` fixture (tests/conftest.py): an external factory writing tmp_path/spool
pytestmark = pytest.mark.factory(workers=2)


class GeneratorThread(threading.Thread):
    """run_generator in the background; ``summary`` once it is done."""

    def __init__(self, endpoint: str, rate: float, duration: float) -> None:
        super().__init__(name="generator", daemon=True)
        self.endpoint, self.settings = endpoint, GeneratorSettings(rate, duration, senders=1, bucket=500)
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.summary = run_generator(self.endpoint, self.settings)
        except BaseException as e:
            self.error = e

    def result(self, timeout: float = 60.0) -> dict[str, Any]:
        self.join(timeout)
        assert not self.is_alive(), "generator did not finish"
        if self.error is not None:
            raise self.error
        assert self.summary is not None and self.summary["eos_delivered"]
        return self.summary


def _driver(
    tmp_path: Path, spool: Path, trigger: str, progress: Path | None = None, max_records: int | None = None
) -> list[str]:
    cmd = [
        sys.executable,
        DRIVER_JOB,
        "--master",
        "local[2]",
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--out",
        str(tmp_path / "out"),
        "--trigger",
        trigger,
        "--interval",
        "1 second",
        "--max-seconds",
        "150",
        "--opt",
        f"spool={spool}",
        "--opt",
        "factory=external",
    ]
    if max_records is not None:
        cmd += ["--opt", f"maxRecordsPerTrigger={max_records}"]
    if progress is not None:
        cmd += ["--progress", str(progress)]
    return cmd


def _progress(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"batches": 0, "rows": 0}


@pytest.mark.long
def test_driver_killed_hard_and_restarted(spark, tmp_path: Path, factory: FactoryHandle) -> None:
    spool = Path(factory.spool)
    progress = tmp_path / "progress.json"
    # at most 2,000 rows a second: the first driver cannot finish before it is killed
    driver = subprocess.Popen(
        _driver(tmp_path, spool, "processing", progress, 2000),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    gen = None
    try:
        # the driver's source must be running before tuples flow, so the kill lands mid-stream
        wait_for(
            lambda: driver.poll() is not None or live_reader_state(spool) is not None,
            120,
            "the driver's stream reader to start",
        )
        assert driver.poll() is None, "the driver exited early"
        gen = GeneratorThread(factory.endpoint, rate=30_000, duration=2.0)
        gen.start()
        wait_for(
            lambda: driver.poll() is not None or _progress(progress)["batches"] >= 2,
            120,
            "two micro-batches in the first driver",
        )
        assert driver.poll() is None, "the driver exited early"
    finally:
        # a hard crash of the driver: the Python driver, its JVM and the source runner, all at once
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    before = _progress(progress)
    summary = gen.result() if gen is not None else None
    assert summary is not None
    assert 0 < before["rows"] < summary["emitted"], "the kill must land mid-stream"
    assert factory.wait_drained(60)

    # restart from the dead driver's checkpoint (here, in the test's warm session) and finish
    import cloudprofiler

    cloudprofiler.register(spark)
    df = (
        spark.readStream.format("cloudprofiler")
        .option("spool", str(spool))
        .option("factory", "external")
        .load()
        .select("tuple_id", "sender_id", "cp_tsc_source", "cp_node_source", "cp_node_factory")
    )
    run_available_now(df, "parquet", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    want, counts = expected_ids(summary, Spool(spool).stats())
    assert counts["offered"] == 60_000
    assert_exactly_once(output_ids(spark, tmp_path / "out"), want)


@pytest.mark.long
def test_factory_worker_sigkilled_and_restarted(spark, tmp_path: Path, factory: FactoryHandle) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    spool = Path(factory.spool)

    def source() -> Any:
        return (
            spark.readStream.format("cloudprofiler")
            .option("spool", str(spool))
            .option("factory", "external")
            .option("maxRecordsPerTrigger", "20000")
            .load()
            .select("tuple_id")
        )

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    query = (
        source()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        gen = GeneratorThread(factory.endpoint, rate=40_000, duration=3.0)
        gen.start()
        wait_for(lambda: Spool(spool).latest().get("w0", -1) >= 1, 60, "w0 to publish two segments")
        killed_pid = factory.worker_pids()[0]
        factory.restart_worker(0)  # SIGKILL, then a new process resumes on w0's spool directory
        assert factory.worker_pids()[0] != killed_pid
        summary = gen.result()
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        assert query.exception() is None
    finally:
        query.stop()
    await_query(query, 60)
    # finish what the running query had not reached yet, from the same checkpoint
    run_available_now(source(), "parquet", ckpt, out)

    stats = Spool(spool).stats()
    want, counts = expected_ids(summary, stats)
    assert counts["offered"] == 120_000 and counts["rejected"] == 0
    # whatever the killed worker held is lost in transit, counted with its exact id ranges
    assert stats.lost_in_transit_total == counts["lost"]
    assert counts["offered"] - counts["dropped"] - counts["lost"] == len(want)
    assert_exactly_once(output_ids(spark, out), want)
