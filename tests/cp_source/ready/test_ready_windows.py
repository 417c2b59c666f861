"""Issue 15's acceptance on a real Spark query: a windowed count over two senders 5 s apart.

Without ``ordering=ready`` Spark drops the lagging sender's tuples behind the watermark; with it,
nothing is dropped and every closed window's count equals the generator's own; the same generated
tuples give byte-identical windows whatever the worker count and trigger interval (three queries
starting together in one session); and a driver killed mid-run replays exactly the batches its
offsets name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from cloudprofiler.jobs.ordering_compare import run_windowed

pytestmark = pytest.mark.long


def _at_once(*runs: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs' results, the runs side by side (each a query, factory and generator of its own): what
    they check does not depend on their timing, and their generators' wall time overlaps."""
    with ThreadPoolExecutor(len(runs)) as pool:
        return [f.result() for f in [pool.submit(run) for run in runs]]


def _staggered(runs: list[tuple[Callable[..., dict[str, Any]], Path]]) -> list[dict[str, Any]]:
    """The runs side by side, each (a function taking ``before_sending``, and its query's spool)
    started once the one before has its source running (its reader state published), and no
    generator sending before every query is up. Spark gives the Python process behind a query's
    source a fixed 10 s to connect back; started at once, or while other runs' tuples flow, on a
    loaded 2-core machine, one can miss it ("Python worker failed to connect back")."""
    from cp_source.reader.state import live_reader_state

    barrier = threading.Barrier(len(runs))

    def guarded(run: Callable[..., dict[str, Any]]) -> dict[str, Any]:
        try:
            return run(before_sending=lambda: barrier.wait(600))
        except BaseException:
            barrier.abort()  # the other runs stop waiting for this one
            raise

    with ThreadPoolExecutor(len(runs)) as pool:
        futures = []
        for run, spool in runs:
            futures.append(pool.submit(guarded, run))
            deadline = time.monotonic() + 600
            while live_reader_state(spool) is None and not futures[-1].done() and time.monotonic() < deadline:
                time.sleep(0.1)
        return [f.result() for f in futures]


def test_ready_ordering_drops_nothing_and_counts_every_window_exactly(spark: Any, tmp_path: Path) -> None:
    arrival, ready = _at_once(
        *(
            partial(run_windowed, spark, tmp_path, o, senders=2, lag_ms=5000, rate=2000, duration=22)
            for o in ("arrival", "ready")
        )
    )
    for run in (arrival, ready):
        assert run["dropped_by_generator"] == 0 and run["emitted"] == 44_000
        assert len(run["windows"]) >= 2  # the windows the final watermark closes
    # the lagging sender's tuples whose window the watermark has closed (its last ~4 s) are dropped:
    # Spark counts them (as partially aggregated rows) and the closed windows lack them; how many
    # depends on where the batches fall, a few to over 15 % of the tuples
    assert arrival["rows_dropped_by_watermark"] > 0
    closed = sum(w["truth"] for w in arrival["windows"])
    assert arrival["tuples_missing"] > 0.02 * closed and not arrival["windows_match"]
    assert ready["rows_dropped_by_watermark"] == 0 and ready["tuples_missing"] == 0
    assert ready["windows_match"], ready["windows"]
    assert all(w["count"] == w["truth"] > 0 for w in ready["windows"])


def _windows(run: dict[str, Any]) -> bytes:
    return orjson.dumps([[w["start_ms"], w["count"]] for w in run["windows"]])


def test_same_tuples_give_byte_identical_windows_whatever_workers_and_trigger(
    spark: Any, tmp_path: Path
) -> None:
    start = 1_700_000_000_000  # the schedule clock: every run generates the same tuples
    configs = [(1, 200), (2, 700), (4, 1500)]
    runs = _staggered(
        [
            (
                partial(
                    run_windowed,
                    spark,
                    tmp_path / f"run{i}",
                    "ready",
                    senders=2,
                    lag_ms=2500,
                    rate=3000,
                    duration=12,
                    workers=workers,
                    trigger_ms=trigger,
                    event_start_ms=start,
                    # on a loaded machine a sender process can take over the default 10 s to
                    # appear; the frontier would then go on without it and its tuples come late
                    sender_timeout_s=120,
                ),
                tmp_path / f"run{i}" / "ready-2-2500" / "spool",
            )
            for i, (workers, trigger) in enumerate(configs)
        ]
    )
    for r in runs:
        assert r["rows_dropped_by_watermark"] == 0 and r["windows_match"], (r["windows"], r["tuples_missing"])
    assert _windows(runs[0]) == _windows(runs[1]) == _windows(runs[2])
    assert sum(w["count"] for w in runs[0]["windows"]) > 0


def test_the_source_runner_adds_no_key_to_the_registered_environment(
    spark: Any, factory: Any, tmp_path: Path
) -> None:
    """Spark's streaming source runner writes its keys into the registered data source's own
    environment map, which every query of the registration shares and serializes into its tasks;
    inserted by queries starting together, the keys corrupt it (an OptionalDataException in every
    task of those queries). ``register`` seeds them, so a query's start only replaces values."""
    from cloudprofiler.datasource import RUNNER_ENV_KEYS, register_source
    from tests.helpers.streaming import run_available_now

    session_env = dict(spark.sparkContext.environment)
    register_source(spark)
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    env = manager.lookupDataSource("cloudprofiler").dataSourceCls().envVars()
    seeded = dict(env)
    assert set(RUNNER_ENV_KEYS) <= set(seeded)
    assert spark.sparkContext.environment == session_env  # the session's own is left as it was
    reader = spark.readStream.format("cloudprofiler").option("spool", str(factory.spool))
    df = reader.option("factory", "external").load()
    run_available_now(df, "noop", str(tmp_path / "ckpt"))
    after = dict(env)
    assert set(after) == set(seeded), "the runner added keys register does not seed"
    assert after["SPARK_LOCAL_DIRS"]  # the runner did write (in place): the map is the one it uses


def _batch_files(out: Path) -> dict[int, list[str]]:
    """The Parquet files the file sink committed per batch id (its ``_spark_metadata`` log)."""
    files: dict[int, list[str]] = {}
    for log in (out / "_spark_metadata").iterdir():
        if not log.name.isdigit():
            continue
        lines = log.read_text().splitlines()[1:]  # the first line is the log's version
        files[int(log.name)] = [orjson.loads(ln)["path"] for ln in lines if ln.strip()]
    return files


def _offsets(ckpt: Path) -> dict[int, int]:
    """The source frontier of every batch in Spark's offset log."""
    out = {}
    for log in (ckpt / "offsets").iterdir():
        if log.name.isdigit():
            source = orjson.loads(log.read_text().splitlines()[-1])
            out[int(log.name)] = int(source["frontier"])
    return out


def _in_flight(ckpt: Path) -> int | None:
    """A batch whose offsets Spark logged and has not committed, if there is one now."""
    try:
        planned = {int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit()}
        done = {int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit()}
    except FileNotFoundError:
        return None
    todo = planned - done
    return max(todo) if todo and max(planned) > 1 else None


def test_driver_killed_mid_batch_replays_the_same_batch(spark: Any, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    import numpy as np
    import pyarrow.parquet as pq

    import cloudprofiler
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.events import schedule_event_ms
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.reader.state import live_reader_state
    from tests.helpers.cluster_harness import DRIVER_JOB
    from tests.helpers.ingest_truth import assert_exactly_once, output_ids
    from tests.helpers.polling import wait_for
    from tests.helpers.streaming import run_available_now

    spool, ckpt, out = tmp_path / "spool", tmp_path / "ckpt", tmp_path / "out"
    factory = start_factory("tcp://127.0.0.1:0", spool, workers=2)
    opts = ["spool=" + str(spool), "factory=external", "ordering=ready", "senders=2", "senderTimeout=120"]
    cmd = [sys.executable, DRIVER_JOB, "--checkpoint", str(ckpt), "--out", str(out), "--trigger",
           "processing", "--interval", "200 milliseconds", "--max-seconds", "150",
           "--columns", "tuple_id,sender_id,event_time"]  # fmt: skip
    for o in opts:
        cmd += ["--opt", o]
    summary: dict[str, Any] = {}
    start_ms = 1_700_000_000_000
    gen = threading.Thread(
        target=lambda: summary.update(
            run_generator(
                factory.endpoint,
                GeneratorSettings(
                    4000,
                    15.0,
                    senders=2,
                    bucket=100,
                    event_lag_ms=1000,
                    event_start_ms=start_ms,
                    sender_base=9000,
                ),
            )
        ),
        daemon=True,
    )
    driver = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    killed_in = None
    try:
        # tuples flow only once the driver's reader runs, so the kill lands mid-stream
        wait_for(lambda: driver.poll() is not None or live_reader_state(spool) is not None, 120, "reader")
        gen.start()
        deadline = time.monotonic() + 120
        while killed_in is None and time.monotonic() < deadline and driver.poll() is None:
            killed_in = _in_flight(ckpt)
            time.sleep(0.005)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the Python driver, its JVM and the source runner
        driver.wait(30)
    assert killed_in is not None, "no batch was in flight before the deadline"
    gen.join(60)
    assert summary["emitted"] == 60_000 and summary["dropped"] == 0
    wait_for(lambda: factory.wait_drained(1), 60, "the factory to drain")

    cloudprofiler.register(spark)
    reader = spark.readStream.format("cloudprofiler")
    for o in opts:
        reader = reader.option(*o.split("=", 1))
    df = reader.load().select("tuple_id", "sender_id", "event_time")
    run_available_now(df, "parquet", str(ckpt), str(out))
    factory.stop()

    # the truth: every tuple's event time from the generator's schedule
    truth: dict[int, int] = {}
    for i, s in enumerate(summary["senders"]):
        n = (s["next_tuple_id"] - s["first_tuple_id"]) // 100
        ev = schedule_event_ms(start_ms, 2000, 100, n, i, s["id"], 1000)
        for k, e in enumerate(ev.tolist()):
            for t in range(s["first_tuple_id"] + 100 * k, s["first_tuple_id"] + 100 * (k + 1)):
                truth[t] = e
    frontiers = _offsets(ckpt)
    files = _batch_files(out)
    assert killed_in in files, "the batch in flight at the kill was committed after the restart"
    prev_max = -1
    for batch in sorted(files):
        got = [pq.read_table(out / Path(f).name).select(["tuple_id"]) for f in files[batch]]
        ids = sorted(t for tab in got for t in tab.column("tuple_id").to_pylist())
        lo, hi = frontiers.get(batch - 1, -(1 << 62)), frontiers[batch]
        want = sorted(t for t, e in truth.items() if lo < e <= hi)
        assert ids == want, f"batch {batch}: {len(ids)} rows, the range ({lo}, {hi}] holds {len(want)}"
        if ids:
            assert min(truth[t] for t in ids) > prev_max  # every tuple after the previous batch's
            prev_max = max(truth[t] for t in ids)
    assert_exactly_once(output_ids(spark, out), np.array(sorted(truth), dtype=np.int64))
