"""sync=auto across hosts: a standalone cluster in network namespaces, each host in its own virtual TSC
domain, and nothing started by hand.

Hosts: the master and worker A (domain auto-host-a), worker B (auto-host-b), the driver
(auto-driver). A query stamps its tuples before a repartition and writes them with sync=auto; the
first task on each worker starts that host's agent (one per host), the driver starts the coordinator
and its own agent. All the domains are virtual domains of this machine's one counter, so every
record's truth is known: translation must put every cross-host duration marked ok within its bound.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for
from netns_hosts import Namespaces, spark_cluster

from cp_sink import read_records
from cp_sync.host_agent import agent_pids
from cp_sync.synthetic import invert
from cp_sync.translate import translate_records
from native_tsc.domain import make_virtual

pytestmark = [
    pytest.mark.long,
    pytest.mark.cluster,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2"),
]

VA = make_virtual("auto-host-a", "95.5", 6_000_000_000_000)
VB = make_virtual("auto-host-b", "-160.25", -2_000_000_000_000)
VD = make_virtual("auto-driver", "33", 1_000_000_000_000)
DOMAINS = {v.domain: v for v in (VA, VB, VD)}

# The driver, in its own namespace (argv: master, its address, sink path, checkpoint, seconds to run).
DRIVER = """
import json, sys, time
master, host, out, ck, seconds = sys.argv[1:6]
from cloudprofiler.spark_local import local_session
from cp_sink.stamp import stamp
from cp_sync.auto import coordinator_state, wait_for_stop
conf = {"spark.driver.host": host, "spark.driver.bindAddress": host, "spark.executor.memory": "512m",
        "spark.cores.max": "2", "spark.executor.cores": "1"}
spark = local_session("cp-sync-auto-hosts", master=master, conf=conf)
rows = spark.readStream.format("rate").option("rowsPerSecond", 100).option("numPartitions", 2).load()
q = (stamp(rows.selectExpr("value AS tuple_id"), "mid").repartition(2).writeStream.format("cloudprofiler")
     .option("path", out).option("checkpointLocation", ck).option("sync", "auto").option("syncEvery", "2")
     .trigger(processingTime="500 milliseconds").start())
while (coordinator_state(out) or {}).get("state") != "running":  # the writer starts it as the query plans
    time.sleep(0.2)
print(json.dumps({"endpoint": coordinator_state(out)["endpoint"]}), flush=True)
while not any(p["numInputRows"] for p in q.recentProgress):
    time.sleep(0.2)
time.sleep(float(seconds))
q.stop()
wait_for_stop(out)
print(json.dumps({"error": str(q.exception()) if q.exception() else None}), flush=True)
spark.stop()
"""


@pytest.fixture
def hosts() -> Iterator[Namespaces]:
    nets = Namespaces(secrets.token_hex(2))
    try:
        yield nets
    finally:
        nets.close()


def _worker(nets: Namespaces, ns: str, addr: str, master: str, logs: Path, env: dict) -> None:
    from cluster_harness import SPARK_HOME

    log = logs / "worker-b.log"
    argv = [os.path.join(SPARK_HOME, "bin", "spark-class"), "org.apache.spark.deploy.worker.Worker", master]
    argv += ["--host", addr, "--port", "0", "--webui-port", "0", "--cores", "1", "--memory", "1g"]
    nets.start(ns, [*argv, "--work-dir", str(logs / "work-b")], log, env)
    wait_for(
        lambda: "Successfully registered with master" in log.read_text(errors="replace"), 120, "worker B"
    )


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def test_sync_auto_across_hosts_in_their_own_domains(
    hosts: Namespaces, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster_harness import cluster_env

    logs = tmp_path / "logs"
    logs.mkdir()
    ns_a, addr_a = hosts.host("a", 1)
    ns_b, addr_b = hosts.host("b", 2)
    ns_d, addr_d = hosts.host("d", 3)
    monkeypatch.setenv("CP_TSC_VIRTUAL", VA.spec())  # the master's and worker A's environment
    master = spark_cluster(hosts, ns_a, addr_a, logs)
    monkeypatch.delenv("CP_TSC_VIRTUAL")
    env = cluster_env(logs)
    _worker(hosts, ns_b, addr_b, master, logs, dict(env, SPARK_LOCAL_IP=addr_b, CP_TSC_VIRTUAL=VB.spec()))
    out, ck = tmp_path / "out", tmp_path / "ck"
    argv = [sys.executable, "-c", DRIVER, master, addr_d, str(out), str(ck), "8"]
    driver_log = logs / "driver.log"
    driver = hosts.start(ns_d, argv, driver_log, dict(env, SPARK_LOCAL_IP=addr_d, CP_TSC_VIRTUAL=VD.spec()))

    def reports() -> list[dict]:
        lines = driver_log.read_text(errors="replace").splitlines() if driver_log.exists() else []
        return [json.loads(ln) for ln in lines if ln.startswith("{")]

    wait_for(lambda: reports() or driver.poll() is not None, 240, "the driver's coordinator")
    assert reports(), driver_log.read_text(errors="replace")[-4000:]
    endpoint = reports()[0]["endpoint"]
    assert endpoint.startswith(f"tcp://{addr_d}:")  # the driver's address, as executors reach it

    # One agent per host, whatever the tasks: three hosts, three network namespaces, one agent in each.
    def per_host() -> list[str | None]:
        return sorted(_netns(p) for p in agent_pids(endpoint))

    wait_for(lambda: len(set(per_host())) == 3, 180, "an agent on each host")
    seen = []
    while driver.poll() is None and len(reports()) < 2:
        seen.append(per_host())
        time.sleep(0.5)
    assert driver.wait(120) == 0, driver_log.read_text(errors="replace")[-4000:]
    assert reports()[-1]["error"] is None
    assert all(len(s) == len(set(s)) for s in seen), seen
    wait_for(lambda: agent_pids(endpoint) == [], 30, "the agents exit after their coordinator")

    phases = sorted(
        (json.loads(p.read_text()) for p in (out / "_sync" / "_phases").glob("*.json")),
        key=lambda r: int(r["phase"].rsplit("-", 1)[1]),
    )
    kinds = [r["kind"] for r in phases]
    assert kinds[0] == "start" and kinds[-1] == "stop" and "periodic" in kinds
    assert phases[-1]["domains"] == sorted(DOMAINS) and phases[-1]["pairs"] == 6
    assert all(r["failures"] == [] for r in phases)

    # Cross-host durations against the truth that the virtual domains define.
    rec = read_records(out).to_pydict()
    lat, facts = translate_records(out, out / "_sync", "mid", "sink")
    ref = DOMAINS[facts["reference"]]
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
    assert len(stamps) == len(rec["tuple_id"])  # every tuple once
    ok_cross, cross_bounds = 0, []
    for r in lat.to_pylist():
        if r["status"] != "ok":
            continue
        a, s, b, e = stamps[r["tuple_id"]]
        # A stamp fixes its raw instant to within one count: the truth to within two at each end.
        truth = ref.apply(invert(b, e)) - ref.apply(invert(a, s))
        assert abs(r["duration_cycles"] - truth) <= r["bound_cycles"] + 4, r
        if a is not b:
            ok_cross += 1
            cross_bounds.append(r["bound_ns"])
    assert ok_cross > 0
    assert np.isfinite(facts["frequency_hz"])
    print(
        f"\nsync=auto on 3 hosts: {len(stamps)} records, {len(phases)} phases, reference {ref.domain}, "
        f"statuses {facts['status_counts']}, cross-host ok rows {ok_cross}, "
        f"median bound {np.median(cross_bounds) / 1e3:.1f} us"
    )
