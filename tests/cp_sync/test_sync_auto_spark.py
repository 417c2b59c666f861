"""sync=auto in a real streaming query (the session's local[2] SparkSession: one host).

The query stamps its tuples before a repartition into two concurrent tasks per batch, and the sink
runs sync: the coordinator's phases at the start, every second and at the stop go to
``<path>/_sync``; one agent serves the host whatever the tasks; a killed agent is started again by
the next task and joins the next phase; after the stop the coordinator and the agent are gone. A
second TSC domain (a virtual one, in an agent started by hand) gives the phases pairs to probe.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import cloudprofiler
import native_tsc
from cloudprofiler.cli import main
from cp_sink import read_records
from cp_sink.stamp import stamp
from cp_sync.auto.driver import coordinator_state
from cp_sync.auto.host_agent import agent_pids
from cp_sync.nodes.coordinator import list_agents
from native_tsc.domain import make_virtual
from tests.helpers.polling import wait_for

VIRTUAL = make_virtual("auto-spark-v", "-75.25", 2_000_000_000_000)

pytestmark = pytest.mark.long


def _phases(sync: Path) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in (sync / "_phases").glob("*.json")]
    return sorted(recs, key=lambda r: int(r["phase"].rsplit("-", 1)[1]))


def _start(spark, tmp_path: Path, **options: str):
    cloudprofiler.register(spark)
    df = spark.readStream.format("rate").option("rowsPerSecond", 200).load().selectExpr("value AS tuple_id")
    w = (
        stamp(df, "mid")
        .repartition(2)
        .writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="300 milliseconds")
    )
    for k, v in options.items():
        w = w.option(k, v)
    return w.start()


def test_streaming_query_with_sync_auto(spark, tmp_path: Path) -> None:
    out, sync = str(tmp_path / "out"), tmp_path / "out" / "_sync"
    host = native_tsc.domain_id()
    q = _start(spark, tmp_path, sync="auto", syncEvery="1")
    other = None
    try:
        wait_for(lambda: (coordinator_state(out) or {}).get("state") == "running", 120, "the coordinator")
        endpoint = coordinator_state(out)["endpoint"]
        assert endpoint.startswith("tcp://127.0.0.1:")  # local mode: loopback only
        other = subprocess.Popen(
            [sys.executable, "-m", "cloudprofiler.cli", "sync", "agent", "--server", endpoint],
            env=dict(os.environ, CP_TSC_VIRTUAL=VIRTUAL.spec()),
            stdout=subprocess.DEVNULL,
        )
        both = sorted([host, VIRTUAL.domain])
        wait_for(lambda: any(r["domains"] == both and r["pairs"] == 2 for r in _phases(sync)), 120, "a phase")
        # Two tasks per batch, batch after batch: one agent for the host all along.
        for _ in range(5):
            assert len(agent_pids(endpoint)) == 1
            time.sleep(0.3)
        (first,) = agent_pids(endpoint)
        # Killed: the next task starts it again, and it is probed in a later phase.
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: agent_pids(endpoint) not in ([], [first]), 60, "a new agent")
        (second,) = agent_pids(endpoint)
        killed_at = time.time_ns()
        wait_for(
            lambda: any(r["started_unix_ns"] > killed_at and r["domains"] == both for r in _phases(sync)),
            60,
            "a phase with the new agent",
        )
        # the agents' listing follows the new agent's registration: wait for it, do not sample once
        wait_for(lambda: sorted(a["domain"] for a in list_agents(endpoint)) == both, 30, "both agents listed")
        wait_for(lambda: any(p["numInputRows"] > 0 for p in q.recentProgress), 120, "a batch with rows")
    finally:
        q.stop()
    # The listener asks for the stop phase; the coordinator then exits, and the agent after it.
    wait_for(lambda: coordinator_state(out) is None, 60, "the stop phase")
    recs = _phases(sync)
    kinds = [r["kind"] for r in recs]
    assert kinds[0] == "start" and kinds[-1] == "stop" and kinds.count("periodic") == len(kinds) - 2 >= 2
    assert recs[-1]["domains"] == both and recs[-1]["pairs"] == 2
    assert all("error" not in r for r in recs)
    assert sorted(p.name for p in sync.glob("sync-*.parquet")) == sorted(r["file"] for r in recs if r["file"])
    wait_for(lambda: agent_pids(endpoint) == [], 30, "the host's agent exits after its coordinator")
    if other is not None:
        other.terminate()
        other.wait(10)
    # The records translate, finding <path>/_sync by themselves.
    rec = read_records(out)
    assert rec.num_rows > 0 and set(rec["cp_node_mid"].to_pylist()) == {host}
    lat = tmp_path / "lat.parquet"
    assert main(["translate", "--records", out, "--from", "mid", "--to", "sink", "--out", str(lat)]) == 0
    assert pq.read_table(lat).num_rows == 3 * rec.num_rows  # one row per record and method


def test_bad_sync_option_fails_the_query_naming_it(spark, tmp_path: Path) -> None:
    q = _start(spark, tmp_path, sync="auto", syncEvery="often")
    with pytest.raises(Exception) as e:  # awaitTermination raises the query's failure
        q.awaitTermination(180)
    line = "ValueError: option syncEvery='often': expected seconds from 0.5 to 86400"
    assert str(e.value).splitlines()[0].endswith(line)  # the first line of Spark's error, whole
    assert coordinator_state(str(tmp_path / "out")) is None
