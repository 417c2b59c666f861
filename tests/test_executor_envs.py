"""Executors on separate hosts (network namespaces): one whose Python lacks cloudprofiler fails the
check in one line naming that host; with the package shipped by spark.archives (a venv-packed
environment) the check passes on both hosts and a cloudprofiler query reads every tuple once.

Hosts: the master and worker A on one, worker B on another, the driver on a third. Worker B's Python
(the same path as everyone's) is a bare virtual environment, bind-mounted over it in B's own mount
namespace: cloudprofiler, numpy and pyarrow are not there.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from ingest_truth import assert_exactly_once, expected_ids, output_ids
from netns_hosts import Namespaces, spark_cluster
from packed_env import PackedEnv, build_packed_env

from cp_source.factory import start_factory
from cp_source.generator import run_generator
from cp_source.spool import Spool

pytestmark = [
    pytest.mark.long,
    pytest.mark.cluster,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2"),
]

# The driver with the documented spark.archives setup, run in its own namespace from the directory
# that holds environment/ (argv: master, its address, archive, spool, sink path, checkpoint). Its
# Python workers run ./environment/bin/python there; each executor runs the archive's copy.
ARCHIVE_DRIVER = """
import json, os, sys, time
master, host, archive, spool, out, ck = sys.argv[1:7]
os.environ["PYSPARK_PYTHON"] = "./environment/bin/python"
from cloudprofiler.spark_local import local_session
from cloudprofiler.executor_check import require_executors
conf = {"spark.driver.host": host, "spark.driver.bindAddress": host, "spark.executor.memory": "512m",
        "spark.cores.max": "2", "spark.executor.cores": "1", "spark.archives": archive + "#environment"}
t0 = time.monotonic()
spark = local_session("cp-executor-envs", master=master, conf=conf)
t1 = time.monotonic()
statuses = require_executors(spark, min_executors=2, timeout=120)
t2 = time.monotonic()
df = (spark.readStream.format("cloudprofiler").option("spool", spool).option("factory", "external")
      .option("fetch", "network").option("serverBind", host).option("segmentsPerPartition", "1").load()
      .select("tuple_id", "cp_node_source"))
q = (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
     .trigger(availableNow=True).start())
q.awaitTermination(240)
err = q.exception()
print(json.dumps({"session_s": t1 - t0, "check_s": t2 - t1, "query_s": time.monotonic() - t2,
                  "lines": [s.line() for s in statuses], "pythons": [s.python for s in statuses],
                  "addresses": [s.address for s in statuses], "error": str(err) if err else None}))
spark.stop()
"""


@pytest.fixture(scope="session")
def packed_env(tmp_path_factory: pytest.TempPathFactory) -> PackedEnv:
    """The lean environment of docs/deployment.md, packed once per test session."""
    pytest.importorskip("venv_pack")
    return build_packed_env(tmp_path_factory.mktemp("executor-env"))


def _spool(path: Path) -> Any:
    """A spool of a finished factory (10,000 tuples offered); the ids the query must read."""
    with start_factory("tcp://127.0.0.1:0", path, workers=1) as factory:
        summary = run_generator(factory.endpoint, rate=20_000, duration=0.5, senders=1, bucket=500)
        assert summary["eos_delivered"] and factory.wait_drained(60)
    want, _ = expected_ids(summary, Spool(path).stats())
    assert len(want) > 0
    return want


def _venv(path: Path, system: bool) -> Path:
    argv = [sys.executable, "-m", "venv", "--without-pip", str(path)]
    subprocess.run(argv + (["--system-site-packages"] if system else []), check=True, timeout=120)
    return path / "bin" / "python"


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Namespaces]:
    nets = Namespaces(secrets.token_hex(2))
    try:
        yield nets
    finally:
        nets.close()


def _worker_without_package(nets: Namespaces, ns: str, addr: str, master: str, logs: Path, env: dict) -> None:
    """Worker B: in its own mount namespace the shared Python's directory is a bare venv."""
    from cluster_harness import SPARK_HOME

    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    worker = [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", addr, "--port", "0"]
    worker += ["--webui-port", "0", "--cores", "1", "--memory", "1g", "--work-dir", str(logs / "work-b")]
    script = f"mount --bind {env['BARE']} {env['SHARED']} && exec {' '.join(worker)}"
    log = logs / "worker-b.log"
    nets.start(ns, ["sh", "-c", script], log, dict(env, SPARK_LOCAL_IP=addr))
    wait_for(
        lambda: "Successfully registered with master" in log.read_text(errors="replace"),
        120,
        "worker B to register",
    )


def test_executor_check_and_a_query_with_spark_archives_on_separate_hosts(
    spark: Any, tmp_path: Path, packed_env: PackedEnv, hosts: Namespaces
) -> None:
    from cluster_harness import cluster_env

    t0 = time.monotonic()
    want = _spool(tmp_path / "spool")
    shared = _venv(tmp_path / "py", system=True)  # everyone's Python, with cloudprofiler...
    _venv(tmp_path / "bare", system=False)  # ...except on worker B, where this is mounted over it
    logs = tmp_path / "logs"
    logs.mkdir()
    ns_a, addr_a = hosts.host("a", 1)
    ns_b, addr_b = hosts.host("b", 2)
    ns_d, addr_d = hosts.host("d", 3)
    master = spark_cluster(hosts, ns_a, addr_a, logs)  # the master and worker A
    env = cluster_env(logs)
    _worker_without_package(
        hosts, ns_b, addr_b, master, logs, dict(env, BARE=str(tmp_path / "bare"), SHARED=str(tmp_path / "py"))
    )
    up = time.monotonic()

    # 1. No spark.archives: worker B's executor fails the check, in one line naming its host.
    conf = [f"spark.driver.host={addr_d}", f"spark.driver.bindAddress={addr_d}", "spark.cores.max=2"]
    conf += ["spark.executor.cores=1", "spark.executor.memory=512m"]
    argv = [sys.executable, "-m", "cloudprofiler.cli", "check-executors", "--master", master]
    argv += ["--executors", "2", "--python", str(shared), *(f"--conf={c}" for c in conf)]
    r = subprocess.run(
        ["ip", "netns", "exec", ns_d, *argv],
        env=dict(env, SPARK_LOCAL_IP=addr_d),
        capture_output=True,
        text=True,
        timeout=300,
    )
    checked = time.monotonic()
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1, (r.stdout, r.stderr[-3000:])
    assert len(lines) == 3, lines
    driver, *executors = lines
    assert driver.startswith("driver on host ") and ": ok (Python " + str(shared) in driver, driver
    failed = [ln for ln in executors if ": ok (" not in ln]
    assert failed == [
        f"executor on host {os.uname().nodename} ({addr_b}): cloudprofiler is not installed in its Python "
        f"({shared}); ship it with spark.archives or pip install it on every node (see docs/deployment.md)"
    ], lines
    assert f"({addr_a}): ok (Python {shared}, Spark " in next(ln for ln in executors if ln not in failed)
    assert "Traceback" not in r.stderr

    # 2. The package only through spark.archives: both executors pass and a query reads every tuple.
    out = tmp_path / "out"
    argv = [sys.executable, "-c", ARCHIVE_DRIVER, master, addr_d, str(packed_env.archive)]
    argv += [str(tmp_path / "spool"), str(out), str(tmp_path / "ck")]
    r = subprocess.run(
        ["ip", "netns", "exec", ns_d, *argv],
        cwd=packed_env.root,
        env=dict(env, SPARK_LOCAL_IP=addr_d),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["error"] is None, report
    assert len(report["lines"]) == 3 and all(": ok (" in ln for ln in report["lines"]), report["lines"]
    assert report["pythons"][0] == str(packed_env.venv / "bin" / "python")
    # each executor ran the archive's copy, unpacked in its own working directory
    for python in report["pythons"][1:]:
        assert python.startswith(str(logs)) and python.endswith("/environment/bin/python"), python
    assert sorted(report["addresses"][1:]) == sorted([addr_a, addr_b])
    assert_exactly_once(output_ids(spark, out), want)
    print(
        f"\nexecutor envs: build {packed_env.seconds} archive {packed_env.archive.stat().st_size} B; "
        f"spool+cluster {up - t0:.1f}s, check-executors CLI {checked - up:.1f}s, archive driver "
        f"{time.monotonic() - checked:.1f}s (session {report['session_s']:.1f}s, check "
        f"{report['check_s']:.1f}s, query {report['query_s']:.1f}s)"
    )
