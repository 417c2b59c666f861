"""Executors on a Spark standalone cluster read every segment through the segment server (fetch=network)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cp_source.factory.supervisor import start_factory
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool
from tests.helpers.cluster_harness import DRIVER_JOB, cluster_env, standalone_cluster
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, output_ids


@pytest.mark.cluster
@pytest.mark.long
def test_network_fetch_on_standalone_cluster(spark, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with start_factory("tcp://127.0.0.1:0", spool, workers=2) as factory:
        summary = run_generator(
            factory.endpoint, GeneratorSettings(rate=20_000, duration=2.0, senders=1, bucket=500)
        )
        assert summary["eos_delivered"] and factory.wait_drained(60)
    view = Spool(spool)
    latest = view.latest()
    segments = [s for w in latest for s in view.segments(w, -1, latest[w])]
    want, counts = expected_ids(summary, view.stats())
    assert sum(s.rows for s in segments) == len(want) > 0

    logs = tmp_path / "cluster"
    out = tmp_path / "out"
    with standalone_cluster(logs, workers=2, cores=1, memory="1g") as cluster:
        cmd = [
            sys.executable,
            DRIVER_JOB,
            "--master",
            cluster.master_url,
            "--trigger",
            "available-now",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--out",
            str(out),
            "--max-seconds",
            "120",
            "--opt",
            f"spool={spool}",
            "--opt",
            "factory=external",
            "--opt",
            "fetch=network",
            "--opt",
            "segmentsPerPartition=1",
        ]
        job = subprocess.run(cmd, env=cluster_env(logs), capture_output=True, text=True, timeout=180)
        assert job.returncode == 0, job.stderr[-4000:]
        # the tasks ran in executor JVMs that the two workers launched for this application
        executors = sorted(p.relative_to(logs).parts[0] for p in logs.glob("work*/app-*/*/stderr"))
        assert executors == ["work0", "work1"], executors

    # every row came through the segment server, exactly once each segment
    served = orjson.loads((spool / "_segment_server.json").read_bytes())
    assert served["segments_served"] == len(segments)
    assert served["rows_served"] == len(want)
    assert served["rejected"] == 0 and served["missing"] == 0
    assert_exactly_once(output_ids(spark, out), want)
