"""A Spark standalone cluster (one master, N workers) started from the pyspark install as separate JVMs.

Everything binds to 127.0.0.1 on free ports; the REST submission server (a
fixed port) is off. ``standalone_cluster`` tears every JVM down, by process
group, however the test ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = os.path.dirname(pyspark.__file__)
DRIVER_JOB = str(Path(__file__).with_name("driver_job.py"))  # a Spark driver in its own process
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")


@dataclass
class Cluster:
    """A running standalone cluster."""

    master_url: str
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)


def cluster_env(logs: Path) -> dict[str, str]:
    """Environment for the cluster's JVMs and for a driver that joins them."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=SPARK_HOME,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(logs),
        SPARK_WORKER_DIR=str(logs / "work"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        SPARK_DAEMON_MEMORY="256m",
    )
    return env


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 - the JVM owns it until teardown
    return subprocess.Popen(
        [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _wait_log(log: Path, pattern: re.Pattern[str] | str, proc: subprocess.Popen, timeout: float) -> re.Match:
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        m = rx.search(text)
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: JVM exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{log.name}: no '{rx.pattern}' within {timeout:.0f}s")


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def standalone_cluster(
    logs: Path, workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 60.0
) -> Iterator[Cluster]:
    """Start a master and ``workers`` workers; yield the cluster; stop them all."""
    logs.mkdir(parents=True, exist_ok=True)
    env = cluster_env(logs)
    cluster = Cluster("", logs)
    try:
        master_log = logs / "master.log"
        master = _spawn(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            master_log,
            env,
        )
        cluster.procs.append(master)
        cluster.master_url = _wait_log(master_log, MASTER_URL, master, timeout).group(1)
        started = []
        for i in range(workers):
            log = logs / f"worker{i}.log"
            proc = _spawn(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.master_url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(logs / f"work{i}"),
                ],
                log,
                env,
            )
            cluster.procs.append(proc)
            started.append((log, proc))
        for log, proc in started:
            _wait_log(log, "Successfully registered with master", proc, timeout)
        yield cluster
    finally:
        for proc in reversed(cluster.procs):
            _kill_group(proc)
