"""A cluster profiled as a user would profile a real one: records on S3, sync=auto, the package
shipped with spark.archives, and a driver killed mid-batch.

Hosts (network namespaces off one routing hub): the master and worker A, worker B, the driver,
and moto's S3 server. Each worker host is a virtual TSC domain of its own (its executors inherit
``CP_TSC_VIRTUAL`` from the worker, as a real host's executors read that host's counter), and so
is the driver's. Nothing is shared between the driver and the workers: each worker runs in a
mount namespace where the driver's directory (its spool, checkpoint and packed environment) is
an empty tmpfs. The records go to ``s3://``, and the package reaches the executors only over the
network, in the archive of ``spark.archives``. Worker B's default Python (the path every host
shares) is a bare virtual environment mounted over it in B's mount namespace.

One cluster for the module:

1. ``cloudprofiler check-executors`` without the archive: one line names worker B.
2. One application with the archive: a query reads a spool the driver serves, stamps its tuples
   before a ``repartition`` and writes them to ``s3://`` with ``sync=auto``. The driver's process
   group is SIGKILLed while a batch's files are on S3 and its manifest is not; a second driver
   resumes the query from the checkpoint and finishes it (``availableNow``). Every tuple of the
   generator's ledger is in the records once, and ``cloudprofiler translate --records s3://...``
   puts every cross-host duration marked ok within its bound of the truth the domains define.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow.parquet as pq
import pytest

from cp_source.factory.supervisor import start_factory
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool
from cp_sync.auto.host_agent import agent_pids
from cp_sync.compare.synthetic import invert
from native_tsc.domain import make_virtual
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids
from tests.helpers.netns_hosts import Namespaces
from tests.helpers.packed_env import PackedEnv, build_packed_env
from tests.helpers.polling import wait_for
from tests.helpers.s3_server import SECRET_KEY, S3Server

pytestmark = [
    pytest.mark.long,
    pytest.mark.cluster,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2"),
]

VA = make_virtual("profile-host-a", "95.5", 6_000_000_000_000)
VB = make_virtual("profile-host-b", "-160.25", -2_000_000_000_000)
VD = make_virtual("profile-driver", "33", 1_000_000_000_000)
DOMAINS = {v.domain: v for v in (VA, VB, VD)}
BUCKET, PREFIX = "results", "records"
OUT = f"s3://{BUCKET}/{PREFIX}"
S3_PORT = 9000  # the S3 host's own namespace: nothing else listens there
# Two factory workers, segments of 1,000 rows: a batch (maxRecordsPerTrigger=2000) reads two
# segments in two partitions, so both executors stamp "mid" and both write records.
ROWS, SEGMENT_ROWS, BATCH_ROWS = 10_000, 1_000, 2_000
COMMITTED_BEFORE_KILL = 2

# The driver (argv: master, its address, archive, spool, sink path, checkpoint, mode, local copy, rows
# per batch), started from the directory that holds environment/ (docs/deployment.md). Mode "first" checks the
# executors and runs the query until it is killed; "rest" resumes it from the checkpoint, runs it
# to the spool's end, and copies the records and the phases from the store for the test.
DRIVER = """
import json, os, sys, time
master, host, archive, spool, out, ck, mode, local, batch_rows = sys.argv[1:10]
os.environ["PYSPARK_PYTHON"] = "./environment/bin/python"
import pyarrow.parquet as pq
from cloudprofiler.spark_local import local_session
from cloudprofiler.executor_check import require_executors
from cp_sink import read_records
from cp_sink.stamp import stamp
from cp_store.location import resolve
from cp_sync.auto.driver import coordinator_state, wait_for_stop
def say(**kw):
    print(json.dumps(kw), flush=True)
conf = {"spark.driver.host": host, "spark.driver.bindAddress": host, "spark.executor.memory": "512m",
        "spark.cores.max": "2", "spark.executor.cores": "1", "spark.archives": archive + "#environment",
        "spark.locality.wait": "0", "spark.shuffle.reduceLocality.enabled": "false"}
spark = local_session("cp-cluster-profile", master=master, conf=conf)
if mode == "first":
    statuses = require_executors(spark, min_executors=2, timeout=120)
    say(lines=[s.line() for s in statuses], pythons=[s.python for s in statuses],
        addresses=[s.address for s in statuses])
rows = (spark.readStream.format("cloudprofiler").option("spool", spool).option("factory", "external")
        .option("fetch", "network").option("serverBind", host).option("maxRecordsPerTrigger", batch_rows)
        .option("segmentsPerPartition", "1").load())
w = (stamp(rows.select("tuple_id"), "mid").repartition(2).writeStream.format("cloudprofiler")
     .option("path", out).option("checkpointLocation", ck).option("sync", "auto").option("syncEvery", "2"))
if mode == "first":
    q = w.trigger(processingTime="300 milliseconds").start()
    while q.isActive and (coordinator_state(out) or {}).get("state") != "running":
        time.sleep(0.1)
    say(endpoint=(coordinator_state(out) or {}).get("endpoint"))
    q.awaitTermination()  # until this process is killed
    say(error=str(q.exception()))
    sys.exit(1)
q = w.trigger(availableNow=True).start()
q.awaitTermination()
if q.exception() is not None:
    say(error=str(q.exception()))
    sys.exit(1)
wait_for_stop(out)
records = read_records(out).select(["tuple_id", "cp_node_mid", "cp_tsc_mid", "cp_node_sink", "cp_tsc_sink"])
pq.write_table(records, local)
where = resolve(out).join("_sync", "_phases")
phases = [json.loads(where.join(os.path.basename(f.path)).read_bytes()) for f in where.children()]
say(error=None, phases=phases)
spark.stop()
"""

T = TypeVar("T")
_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET = 0x40000000


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own that has joined network namespace ``ns``: a thread's network
    namespace is its own, so this process and its other threads stay where they are. Processes the
    thread starts are born in ``ns``."""
    box: dict[str, Any] = {}

    def run() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {ns}")
        finally:
            os.close(fd)
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass
class Cluster:
    """The module's cluster: hosts, the store, the driver's directory and environment."""

    nets: Namespaces
    root: Path
    master: str
    addrs: dict[str, str]  # a, b, d (driver), s (S3) -> address
    spaces: dict[str, str]  # the same keys -> network namespace
    driver_env: dict[str, str]
    shared_python: Path  # everyone's Python; a bare venv on worker B
    s3: S3Server
    want: np.ndarray  # the generator's ledger: the ids the records must hold, each once
    packing: Future[PackedEnv]
    check: subprocess.Popen[bytes]  # check-executors, started as soon as the workers registered
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def driver_dir(self) -> Path:
        return self.root / "driver"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def s3_client(self) -> Any:
        import boto3

        env = self.s3.env()
        return boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )

    def keys(self) -> list[str]:
        """Every object under the sink's path (listed from the S3 host)."""

        def listing() -> list[str]:
            pages = self.s3_client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
            return [o["Key"] for p in pages for o in p.get("Contents", [])]

        return in_netns(self.spaces["s"], listing)


def _spool(path: Path) -> np.ndarray:
    """A finished factory's spool (segments of SEGMENT_ROWS); the ids its generator's ledger keeps."""
    with start_factory("tcp://127.0.0.1:0", path, workers=2, flush_rows=SEGMENT_ROWS) as factory:
        summary = run_generator(
            factory.endpoint, GeneratorSettings(rate=20_000, duration=ROWS / 20_000, senders=1, bucket=500)
        )
        assert summary["eos_delivered"] and factory.wait_drained(60)
    want, counts = expected_ids(summary, Spool(path).stats())
    assert counts["offered"] == ROWS and len(want) == ROWS, counts
    return want


def _venv(path: Path, system: bool) -> Path:
    argv = [sys.executable, "-m", "venv", "--without-pip", str(path)]
    subprocess.run(argv + (["--system-site-packages"] if system else []), check=True, timeout=120)
    return path / "bin" / "python"


def _spawn(
    nets: Namespaces, ns: str, argv: list[str], out: Path, env: dict[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` in namespace ``ns``, in a process group of its own (stopped with the namespaces);
    stdout to ``out``, stderr beside it (``.err``)."""
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )
    nets.procs.append(proc)
    return proc


def _check_executors(
    nets: Namespaces, host: tuple[str, str], master: str, python: Path, env: dict[str, str], out: Path
) -> subprocess.Popen[bytes]:
    """`cloudprofiler check-executors` from the driver's host, without an archive."""
    ns, addr = host
    conf = [f"spark.driver.host={addr}", f"spark.driver.bindAddress={addr}", "spark.cores.max=2"]
    conf += ["spark.executor.cores=1", "spark.executor.memory=512m"]
    argv = [sys.executable, "-m", "cloudprofiler.cli", "check-executors", "--master", master]
    argv += ["--executors", "2", "--python", str(python), *(f"--conf={c}" for c in conf)]
    return _spawn(nets, ns, argv, out, env)


def _registered(log: Path) -> bool:
    return log.exists() and "Successfully registered with master" in log.read_text(errors="replace")


def _start_master(nets: Namespaces, ns: str, addr: str, logs: Path, env: dict[str, str]) -> str:
    from tests.helpers.cluster_harness import MASTER_URL, SPARK_HOME

    argv = [os.path.join(SPARK_HOME, "bin", "spark-class"), "org.apache.spark.deploy.master.Master"]
    log = logs / "master.log"
    proc = nets.start(ns, [*argv, "--host", addr, "--port", "0", "--webui-port", "0"], log, env)

    def url() -> str | None:
        found = MASTER_URL.search(log.read_text(errors="replace")) if log.exists() else None
        return found.group(1) if found else None

    wait_for(lambda: url() is not None or proc.poll() is not None, 120, "the master")
    found = url()
    assert found is not None, log.read_text(errors="replace")[-2000:]
    return found


def _start_worker(
    nets: Namespaces,
    host: tuple[str, str],
    master: str,
    dirs: tuple[Path, Path],
    env: dict[str, str],
    mounts: str,
) -> Path:
    """A worker whose mount namespace hides the driver's directory under an empty tmpfs (``mounts``
    adds more, run first); its log, to wait on. Two cores, one for each of two applications at once."""
    from tests.helpers.cluster_harness import SPARK_HOME

    logs, driver_dir = dirs
    ns, name = host
    worker = [os.path.join(SPARK_HOME, "bin", "spark-class"), "org.apache.spark.deploy.worker.Worker", master]
    worker += ["--host", env["SPARK_LOCAL_IP"], "--port", "0", "--webui-port", "0", "--cores", "2"]
    worker += ["--memory", "2g", "--work-dir", str(logs / f"work-{name}")]
    script = (
        f"{mounts}mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(driver_dir))} && exec {shlex.join(worker)}"
    )
    log = logs / f"worker-{name}.log"
    nets.start(ns, ["sh", "-c", script], log, env)
    return log


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("venv_pack")
    from tests.helpers.cluster_harness import cluster_env

    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("cluster-profile")
    (root / "driver").mkdir()
    (root / "logs").mkdir()
    # Everything that can wait on something else runs at once: the environment is packed, the S3
    # host and the spool are made while the JVMs start, and check-executors (no archive) runs on the
    # cluster while the environment is still being packed.
    pool = ThreadPoolExecutor(3)
    packing = pool.submit(build_packed_env, root / "driver" / "env")
    spool = pool.submit(_spool, root / "driver" / "spool")
    nets = Namespaces(secrets.token_hex(2))
    server: S3Server | None = None
    try:
        spaces, addrs = {}, {}
        for i, name in enumerate("abds", start=1):
            spaces[name], addrs[name] = nets.host(name, i)
        server = S3Server(addrs["s"], S3_PORT, prefix=["ip", "netns", "exec", spaces["s"]])
        s3 = server
        s3_up = pool.submit(in_netns, spaces["s"], lambda: s3.start().create_bucket(BUCKET))
        base = dict(cluster_env(root / "logs"), **server.env())
        master = _start_master(
            nets, spaces["a"], addrs["a"], root / "logs", dict(base, SPARK_LOCAL_IP=addrs["a"])
        )
        shared = _venv(root / "py", system=True)  # every host's Python, with cloudprofiler...
        _venv(root / "bare", system=False)  # ...but on worker B this one is mounted over it
        dirs = (root / "logs", root / "driver")
        bare = f"mount --bind {shlex.quote(str(root / 'bare'))} {shlex.quote(str(root / 'py'))} && "
        logs = [
            _start_worker(
                nets,
                (spaces[name], name),
                master,
                dirs,
                dict(base, SPARK_LOCAL_IP=addrs[name], CP_TSC_VIRTUAL=v.spec()),
                mounts,
            )
            for name, v, mounts in (("a", VA, ""), ("b", VB, bare))
        ]
        for log in logs:
            wait_for(lambda log=log: _registered(log), 120, f"{log.name} to register")
        driver_env = dict(base, SPARK_LOCAL_IP=addrs["d"], CP_TSC_VIRTUAL=VD.spec())
        host_d = (spaces["d"], addrs["d"])
        check = _check_executors(nets, host_d, master, shared, driver_env, root / "logs" / "check.out")
        s3_up.result(timeout=120)
        want = spool.result(timeout=120)
        yield Cluster(
            nets,
            root,
            master,
            addrs,
            spaces,
            driver_env,
            shared,
            server,
            want,
            packing,
            check,
            {"cluster up": round(time.monotonic() - t0, 1)},
        )
    finally:
        if server is not None:
            server.stop()
        nets.close()
        pool.shutdown(wait=True)


# ---- one application with the archive: a query on S3, its driver killed mid-batch ---------------------


@dataclass
class Profile:
    """What the application left: the drivers' reports, the kill, the store's keys, translate's table."""

    pack: PackedEnv
    executors: dict[str, Any]  # require_executors in the first driver
    killed: dict[str, Any]  # the batch caught mid-way, the batches committed before, the coordinator's
    # endpoint and the network namespaces of its agents, sampled until then
    after_kill: list[str]  # the store's keys just after the kill
    rest: dict[str, Any]  # the second driver's report (phases)
    records: Any  # pyarrow table read from the store by the second driver
    keys: list[str]  # the store's keys at the end
    manifests: dict[int, dict[str, Any]]
    latency: Any  # translate's output table
    translate_stdout: str
    seconds: dict[str, float]


def _reports(log: Path) -> list[dict[str, Any]]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [json.loads(ln) for ln in lines if ln.startswith("{")]


def _tail(log: Path) -> str:
    """The end of a process's stdout and stderr, for a failure's message."""
    err = log.with_suffix(".err")
    return "\n".join(p.read_text(errors="replace")[-4000:] for p in (log, err) if p.exists())


def _batches(keys: list[str]) -> tuple[set[int], set[int]]:
    """(committed batch ids, batch ids with data files) among the sink's keys: a task's file waits
    under ``_attempts/<query id>/batch=<id>/`` until its batch is published, then moves to ``batch=<id>/``."""
    committed = {int(m.group(1)) for k in keys if (m := re.fullmatch(rf"{PREFIX}/_commits/(\d+)\.json", k))}
    data = rf"{PREFIX}/(?:_attempts/[^/]+/)?batch=(\d+)/[^/]+\.parquet"
    written = {int(m.group(1)) for k in keys if (m := re.fullmatch(data, k))}
    return committed, written


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _start_driver(cluster: Cluster, pack: PackedEnv, mode: str, log: Path) -> subprocess.Popen[bytes]:
    """A driver in the driver's namespace, started from the directory that holds environment/; its
    process group holds the driver, its JVM and the JVM's Python workers."""
    d = cluster.driver_dir
    argv = [sys.executable, "-c", DRIVER, cluster.master, cluster.addrs["d"], str(pack.archive)]
    argv += [str(d / "spool"), OUT, str(d / "ck"), mode, str(d / "records.parquet"), str(BATCH_ROWS)]
    return _spawn(cluster.nets, cluster.spaces["d"], argv, log, cluster.driver_env, cwd=pack.root)


def _kill_mid_batch(cluster: Cluster, driver: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """Watch the store until COMMITTED_BEFORE_KILL batches are published, an agent runs on every host
    and a batch has files but no manifest; then SIGKILL the driver's whole process group."""
    s3 = cluster.s3_client()
    seen: list[list[str | None]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        endpoint = next((r["endpoint"] for r in _reports(log) if r.get("endpoint")), None)
        if endpoint is not None:
            seen.append(sorted(_netns(p) for p in agent_pids(endpoint)))
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
        committed, written = _batches([o["Key"] for p in pages for o in p.get("Contents", [])])
        open_batches = sorted(written - committed)
        if len(committed) >= COMMITTED_BEFORE_KILL and open_batches and seen and len(set(seen[-1])) == 3:
            os.killpg(driver.pid, signal.SIGKILL)
            return {
                "batch": open_batches[0],
                "committed": sorted(committed),
                "agents": seen,
                "endpoint": endpoint,
            }
        time.sleep(0.05)
    raise AssertionError(f"no batch caught mid-way; driver exit {driver.poll()}:\n{_tail(log)}")


def _translate(cluster: Cluster, out: Path) -> str:
    argv = [sys.executable, "-m", "cloudprofiler.cli", "translate", "--records", OUT, "--from", "mid"]
    argv += ["--to", "sink", "--reference", VA.domain, "--out", str(out)]
    argv += ["--plot", str(out.with_suffix(".png"))]
    r = subprocess.run(
        ["ip", "netns", "exec", cluster.spaces["d"], *argv],
        env=cluster.driver_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


@pytest.fixture(scope="module")
def profile(cluster: Cluster) -> Profile:
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    pack = cluster.packing.result(timeout=600)
    seconds["waiting for the archive"] = round(time.monotonic() - t0, 1)
    first_log, rest_log = cluster.logs / "driver-first.out", cluster.logs / "driver-rest.out"
    t1 = time.monotonic()
    first = _start_driver(cluster, pack, "first", first_log)
    killed = in_netns(cluster.spaces["s"], lambda: _kill_mid_batch(cluster, first, first_log))
    assert first.wait(60) == -signal.SIGKILL
    seconds["first driver"] = round(time.monotonic() - t1, 1)
    after_kill = cluster.keys()
    reports = _reports(first_log)
    t2 = time.monotonic()
    rest = _start_driver(cluster, pack, "rest", rest_log)
    assert rest.wait(400) == 0, _tail(rest_log)
    seconds["second driver"] = round(time.monotonic() - t2, 1)
    t3 = time.monotonic()
    latency_file = cluster.driver_dir / "latency.parquet"
    stdout = _translate(cluster, latency_file)
    seconds["translate"] = round(time.monotonic() - t3, 1)
    keys = cluster.keys()

    def manifests() -> dict[int, dict[str, Any]]:
        s3 = cluster.s3_client()
        committed, _ = _batches(keys)
        return {
            b: json.loads(s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/_commits/{b}.json")["Body"].read())
            for b in sorted(committed)
        }

    return Profile(
        pack,
        reports[0],
        killed,
        after_kill,
        _reports(rest_log)[-1],
        pq.read_table(cluster.driver_dir / "records.parquet"),
        keys,
        in_netns(cluster.spaces["s"], manifests),
        pq.read_table(latency_file),
        stdout,
        seconds,
    )


def test_the_executors_get_the_package_only_through_spark_archives(
    cluster: Cluster, profile: Profile
) -> None:
    """Both executors run the archive's Python, unpacked in their own working directories (the
    driver's directory, where the archive was built, is an empty tmpfs on their hosts)."""
    report = profile.executors
    assert len(report["lines"]) == 3 and all(": ok (" in ln for ln in report["lines"]), report["lines"]
    assert report["pythons"][0] == str(profile.pack.venv / "bin" / "python")
    for python in report["pythons"][1:]:
        assert python.startswith(str(cluster.logs / "work-")) and python.endswith("/environment/bin/python")
    assert sorted(report["addresses"][1:]) == sorted([cluster.addrs["a"], cluster.addrs["b"]])
    print(
        f"\narchive: build {profile.pack.seconds}, {profile.pack.archive.stat().st_size:,} B; "
        f"{profile.seconds}"
    )


def test_records_on_s3_exactly_once_across_a_driver_killed_mid_batch(
    cluster: Cluster, profile: Profile
) -> None:
    killed = profile.killed
    committed, written = _batches(profile.after_kill)
    # The kill caught a batch with files on the store and no manifest (the first driver wrote no more).
    # Usually the one seen open before the kill; if the driver committed that one while the kill was
    # on its way, the next batch, whose tasks had begun to write, is the one caught.
    open_after = sorted(written - committed)
    if open_after:
        assert open_after[0] >= killed["batch"], (killed, sorted(committed), open_after)
    else:
        # The caught batch's manifest was written between the store's listing and the signal (the
        # commit's moves and Spark's log may not have followed): it is the last batch published.
        assert max(committed) == killed["batch"], (killed, sorted(committed), open_after)
    assert len(killed["committed"]) >= COMMITTED_BEFORE_KILL
    ids = profile.records.column("tuple_id").to_numpy()
    assert_exactly_once(ids, cluster.want)
    # Each manifest lists its batch's files, and no other data file is left: the crashed attempt's
    # files were swept by the second driver's first commit.
    listed = {f"{PREFIX}/{f}" for m in profile.manifests.values() for f in m["files"]}
    data = {k for k in profile.keys if re.fullmatch(rf"{PREFIX}/batch=\d+/[^/]+\.parquet", k)}
    assert data == listed, sorted(data ^ listed)[:10]
    staged = [k for k in profile.keys if k.startswith(f"{PREFIX}/_attempts/") and k.endswith(".parquet")]
    assert staged == []  # nothing left staged (directory markers aside)
    assert sorted(profile.manifests) == list(range(ROWS // BATCH_ROWS))
    logs = [
        p
        for p in cluster.root.rglob("*")
        if p.is_file() and (p.suffix in (".log", ".out", ".err") or p.name in ("stderr", "stdout"))
    ]
    leaked = [str(p) for p in logs if SECRET_KEY in p.read_text(errors="replace")]
    assert leaked == []
    print(
        f"\nkilled in batch {killed['batch']} after {len(killed['committed'])} commits; "
        f"{len(profile.manifests)} batches, {len(ids):,} records"
    )


def test_sync_auto_cross_host_durations_within_their_bounds(cluster: Cluster, profile: Profile) -> None:
    # One agent per host, whatever the tasks: three namespaces, never two agents in one.
    seen, endpoint = profile.killed["agents"], profile.killed["endpoint"]
    assert all(len(s) == len(set(s)) for s in seen), seen
    wait_for(lambda: agent_pids(endpoint) == [], 30, "the first run's agents to exit")
    phases = sorted(profile.rest["phases"], key=lambda r: int(r["phase"].rsplit("-", 1)[1]))
    # Two coordinators (one per driver), each from its start phase to its stop phase: the first one's
    # stop phase ran when it found its driver's JVM gone; indices continue over both.
    kinds = " ".join(r["kind"] for r in phases)
    assert re.fullmatch(r"start (periodic )*stop start (periodic )*stop", kinds) and "periodic" in kinds, (
        kinds
    )
    assert [int(r["phase"].rsplit("-", 1)[1]) for r in phases] == list(range(len(phases)))
    assert all(r["failures"] == [] for r in phases), phases
    assert phases[-1]["domains"] == sorted(DOMAINS) and phases[-1]["pairs"] == 6, phases[-1]
    # The coordinator listens on the driver's address, as the executors reach it.
    assert endpoint.startswith(f"tcp://{cluster.addrs['d']}:"), endpoint
    assert "reference profile-host-a" in profile.translate_stdout
    # the plot docs/tutorials/cluster.md shows (docs/figures/make_cluster_picture.py copies it)
    assert (cluster.driver_dir / "latency.png").stat().st_size > 0

    assert profile.latency.num_rows == 3 * ROWS  # a row per record and method
    rec = profile.records.to_pydict()
    stamps = {
        t: (DOMAINS[a], s, DOMAINS[b], e)
        for t, a, s, b, e in zip(
            rec["tuple_id"],
            rec["cp_node_mid"],
            rec["cp_tsc_mid"],
            rec["cp_node_sink"],
            rec["cp_tsc_sink"],
            strict=True,
        )
    }
    ok_cross: Counter[tuple[str, str, str]] = Counter()
    cross_bounds = []
    for r in profile.latency.to_pylist():
        if r["status"] != "ok":
            continue
        a, s, b, e = stamps[r["tuple_id"]]
        # A stamp fixes its raw instant to within one count: the truth to within two at each end.
        truth = VA.apply(invert(b, e)) - VA.apply(invert(a, s))
        assert abs(r["duration_cycles"] - truth) <= r["bound_cycles"] + 4, r
        if a is not b:
            ok_cross[(r["method"], a.domain, b.domain)] += 1
            cross_bounds.append(r["bound_ns"])
    statuses = Counter(
        f"{r['method']} {r['status']}" for r in profile.latency.select(["method", "status"]).to_pylist()
    )
    # Both directions between the workers, for every method: at least a batch's share of records
    # each. (Each run's first batch is not ok: stamped before its hosts' agents took part in a phase.)
    pairs = [(m, x.domain, y.domain) for m in ("minrtt", "hull", "naive") for x, y in ((VA, VB), (VB, VA))]
    assert all(ok_cross[p] >= BATCH_ROWS // 4 for p in pairs), (ok_cross, statuses)
    print(
        f"\nsync=auto: {len(stamps):,} records, {len(phases)} phases, statuses {statuses}, cross-host ok "
        f"{ok_cross}, median bound {np.median(cross_bounds) / 1e3:.1f} us"
    )


def test_check_executors_names_the_worker_whose_python_lacks_the_package(cluster: Cluster) -> None:
    """No archive: worker B's Python (a bare venv at everyone's path) fails, in one line naming B."""
    t0 = time.monotonic()
    rc = cluster.check.wait(300)
    out = (cluster.logs / "check.out").read_text()
    err = (cluster.logs / "check.err").read_text(errors="replace")
    lines = out.strip().splitlines()
    assert rc == 1, (out, err[-3000:])
    assert len(lines) == 3, lines
    driver, *executors = lines
    shared = cluster.shared_python
    assert driver.startswith("driver on host ") and f": ok (Python {shared}" in driver, driver
    failed = [ln for ln in executors if ": ok (" not in ln]
    assert failed == [
        f"executor on host {os.uname().nodename} ({cluster.addrs['b']}): cloudprofiler is not installed in "
        f"its Python ({shared}); ship it with spark.archives or pip install it on every node (see "
        "docs/deployment.md)"
    ], lines
    assert f"({cluster.addrs['a']}): ok (Python {shared}, Spark " in next(
        ln for ln in executors if ln not in failed
    )
    assert "Traceback" not in err
    print(f"\ncheck-executors: waited {time.monotonic() - t0:.1f}s ({cluster.seconds})")
