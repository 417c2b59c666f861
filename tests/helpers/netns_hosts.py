"""Hosts on one machine for tests and benchmarks: network namespaces joined by veth pairs.

A factory host (``NetnsHost``) runs `cloudprofiler factory --serve` in its own network namespace
with its spool on a tmpfs of its own mount namespace; ``Namespaces`` is a routing hub that other
namespaces (a Spark standalone cluster, a driver) hang off. Root, iproute2 and nsenter are needed.
Used by tests/cp_source/hosts/test_factory_hosts.py and benchmarks/scaleout.py (which imports it as
``tests.helpers.netns_hosts``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from cloudprofiler.children import cli_argv, stop_processes
from tests.helpers.polling import wait_for


def link_bytes(ns: str, link: str) -> tuple[int, int]:
    """(RX, TX) byte counters of ``link`` in namespace ``ns``."""
    out = subprocess.run(
        ["ip", "-n", ns, "-s", "-j", "link", "show", "dev", link],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    stats = orjson.loads(out)[0]["stats64"]
    return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])


# Run inside a factory host's mount namespace (nsenter): its spool is only visible there.
EXPECTED_IDS = """
import sys, orjson, numpy as np
from cp_source.spool.segments import Spool
from ingest_truth import expected_ids
summary = orjson.loads(open(sys.argv[1], "rb").read())
stats = Spool(sys.argv[2]).stats()
np.save(sys.argv[3], expected_ids(summary, stats)[0])
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def veth_to(ns: str, hub: str | None, net: str, tag: str) -> tuple[str, str]:
    """Create namespace ``ns`` joined by a veth pair to ``hub`` (a namespace that routes, or None:
    this one): ``10.{net}.1`` on the hub's side, ``10.{net}.2`` in ``ns`` (its default route with a
    hub). Returns the hub-side link name (set it down to cut ``ns`` off) and the address in ``ns``."""
    outer, inner = f"cpo{tag}", f"cpi{tag}"
    ip("netns", "add", ns)
    hub_ip = ["-n", hub] if hub else []
    ip(*hub_ip, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
    ip(*hub_ip, "addr", "add", f"10.{net}.1/24", "dev", outer)
    ip(*hub_ip, "link", "set", outer, "up")
    ip("-n", ns, "addr", "add", f"10.{net}.2/24", "dev", inner)
    ip("-n", ns, "link", "set", inner, "up")
    ip("-n", ns, "link", "set", "lo", "up")
    if hub:
        ip("-n", ns, "route", "add", "default", "via", f"10.{net}.1")
    return outer, f"10.{net}.2"


def factory_addresses(proc: subprocess.Popen) -> tuple[str, str]:
    """(front-end endpoint, segment server) from the first two lines of `cloudprofiler factory --serve`."""
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "factory listening on" in first, first
    second = proc.stdout.readline()
    assert "serving segments and commits on" in second, second
    return first.split("factory listening on ")[1].split(",")[0], second.split(" on ")[1].strip()


class FactoryHost:
    """A `cloudprofiler factory --serve` process on its own spool, ports picked by the factory."""

    def __init__(
        self,
        spool: Path,
        workers: int = 2,
        keys: Path | None = None,
        register: Path | None = None,
        wait: bool = True,
    ) -> None:
        """With ``wait`` False the process is started but its addresses are read by ``ready()``."""
        self.spool, self.register = spool, register
        extra = ["--curve-keys", str(keys)] if keys is not None else []
        extra += ["--register", str(register)] if register is not None else []
        self.proc = subprocess.Popen(
            cli_argv(
                "factory",
                *extra,
                "--endpoint",
                "tcp://127.0.0.1:0",
                "--spool",
                str(spool),
                "--workers",
                str(workers),
                "--flush-ms",
                "50",
                "--serve",
                "tcp://127.0.0.1:0",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        if wait:
            self.ready()

    def ready(self) -> None:
        """Read the addresses the factory picked (it prints them once it listens)."""
        self.endpoint, self.server = factory_addresses(self.proc)
        if self.register is not None:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            assert line.startswith("registered in "), line

    @classmethod
    def many(cls, spools: list[Path], workers: int = 2) -> list[FactoryHost]:
        """Factory hosts on ``spools``, started side by side (each one's interpreter start overlaps)."""
        started = [cls(spool, workers, wait=False) for spool in spools]
        try:
            for host in started:
                host.ready()
        except BaseException:
            for host in started:
                host.stop()
            raise
        return started

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        stop_processes([self.proc], timeout=20)


class GeneratorProcess:
    """`cloudprofiler generate` into one factory host, its summary (the ledger of what it sent) in a file."""

    def __init__(self, endpoint: str, summary: Path, sender_base: int, rate: int, duration: float) -> None:
        self.summary = summary
        self.proc = subprocess.Popen(
            generate_argv(endpoint, summary, sender_base, rate, duration),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(self, timeout: float = 180.0) -> dict[str, Any]:
        _, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"generate exited {self.proc.returncode}: {err}"
        return orjson.loads(self.summary.read_bytes())


def generate_argv(endpoint: str, summary: Path, sender_base: int, rate: int, duration: float) -> list[str]:
    """`cloudprofiler generate` into one factory: buckets of 500, its ledger in ``summary``, waiting
    up to 60 s for the factory and queueing up to 2 s (a factory host may be stopped in a test)."""
    return cli_argv(
        "generate",
        "--endpoint",
        endpoint,
        "--rate",
        str(rate),
        "--duration",
        str(duration),
        "--bucket",
        "500",
        "--sender-base",
        str(sender_base),
        "--summary",
        str(summary),
        "--wait-ready",
        "60",
        "--queue-ms",
        "2000",
    )


class NetnsHost:
    """A factory host in its own network namespace, joined to this one by a veth pair, with its spool
    on a tmpfs mounted only in its own mount namespace: this host cannot read the spool's files.
    ``on`` (a namespace and its address) puts it on an existing host instead, whose network it then
    shares (the namespace is not its own to delete)."""

    def __init__(
        self,
        tag: str,
        net: int,
        mount: Path,
        hub: str | None = None,
        subnet: int = 203,
        on: tuple[str, str] | None = None,
        wait: bool = True,
    ) -> None:
        """With ``wait`` False the factory is started but its addresses are read by ``ready()``."""
        self.hub, self.own = hub, on is None
        self.proc: subprocess.Popen | None = None
        if on is None:
            self.ns = f"cpf{net}{tag}"
            self.outer, self.addr = veth_to(self.ns, hub, f"{subnet}.{net}", f"{net}{tag}")
        else:
            (self.ns, self.addr), self.outer = on, ""
        self.mount = mount
        mount.mkdir(parents=True)
        self.spool = mount / "spool"
        factory = " ".join(
            cli_argv(
                "factory",
                "--endpoint",
                "tcp://127.0.0.1:0",
                "--spool",
                str(self.spool),
                "--workers",
                "2",
                "--flush-ms",
                "50",
                "--serve",
                f"tcp://{self.addr}:0",
            )[3:]
        )
        main = "import sys; from cloudprofiler.cli import main; sys.exit(main())"
        script = f"mount -t tmpfs -o size=512m tmpfs {mount} && exec {cli_argv()[0]} -c '{main}' {factory}"
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        if wait:
            self.ready()

    def ready(self) -> None:
        """Read the addresses the factory picked (it prints them once it listens)."""
        assert self.proc is not None
        self.endpoint, self.server = factory_addresses(self.proc)

    def generate(self, summary: Path, sender_base: int, rate: int, duration: float) -> subprocess.Popen:
        """`cloudprofiler generate` on the factory's host (its namespace), into its front end."""
        argv = generate_argv(self.endpoint, summary, sender_base, rate, duration)
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], stdout=subprocess.DEVNULL)

    def expected(self, summary: Path, out: Path) -> Any:
        import numpy as np

        assert self.proc is not None
        subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-m", sys.executable, "-c", EXPECTED_IDS]
            + [str(summary), str(self.spool), str(out)],
            check=True,
            timeout=120,
            cwd=Path(__file__).parent,
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent)),
        )
        return np.load(out)

    def server_stats(self) -> dict[str, Any]:
        """Its segment server's counters, asked from inside its own namespace (reachable whatever the
        route from here)."""
        code = (
            "import sys, orjson, zmq; from cp_source.hosts.segment_client import ask_servers; "
            "c = zmq.Context(); a = ask_servers({sys.argv[1]: {'op': 'stats'}}, 20.0, c)[sys.argv[1]]; "
            "sys.stdout.write(orjson.dumps(a).decode()); c.term()"
        )
        argv = ["ip", "netns", "exec", self.ns, sys.executable, "-c", code, self.server]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
        return orjson.loads(out)

    def stop(self) -> None:
        if self.proc is not None:
            stop_processes([self.proc], timeout=20)
        if not self.own:
            return
        hub_ip = ["-n", self.hub] if self.hub else []
        subprocess.run(["ip", *hub_ip, "link", "del", self.outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)

    def cut(self, down: bool) -> None:
        """Take the link between this host and the rest down (or up again)."""
        hub_ip = ["-n", self.hub] if self.hub else []
        ip(*hub_ip, "link", "set", self.outer, "down" if down else "up")


# A Spark driver joining a standalone cluster from its own namespace (argv: master, its address,
# factories, status dir, sink path, checkpoint, stop file, and optionally a go file); it runs the
# query until the stop file. With a go file it starts its session at once but the query only once
# the file exists: a test restarting a killed driver has the next one warm (its JVM up) beforehand.
CLUSTER_DRIVER = """
import os, sys, time
from cloudprofiler.spark_local import local_session
master, host, factories, status, out, ck, stop = sys.argv[1:8]
conf = {"spark.driver.host": host, "spark.driver.bindAddress": host, "spark.executor.memory": "512m",
        "spark.cores.max": "2", "spark.executor.cores": "1", "spark.task.maxFailures": "4"}
spark = local_session("cp-factory-hosts", master=master, conf=conf)
while len(sys.argv) > 8 and not os.path.exists(sys.argv[8]):
    time.sleep(0.1)
df = (spark.readStream.format("cloudprofiler").option("factories", factories)
      .option("statusDir", status).load())
q = (df.writeStream.format("cloudprofiler").option("path", out).option("checkpointLocation", ck)
     .trigger(processingTime="500 milliseconds").start())
while not os.path.exists(stop):
    if not q.isActive:
        print(q.exception(), file=sys.stderr)
        sys.exit(1)
    time.sleep(0.1)
q.stop()
spark.stop()
"""


class Namespaces:
    """A routing hub namespace; the other namespaces of a test hang off it (deleted at close)."""

    def __init__(self, tag: str) -> None:
        self.tag, self.hub = tag, f"cpm{tag}"
        self.names: list[str] = []
        self.links: dict[str, str] = {}  # namespace -> its end of the veth pair to the hub
        self.procs: list[subprocess.Popen] = []
        ip("netns", "add", self.hub)
        self.names.append(self.hub)
        ip("-n", self.hub, "link", "set", "lo", "up")
        subprocess.run(
            ["ip", "netns", "exec", self.hub, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True
        )

    def host(self, name: str, net: int) -> tuple[str, str]:
        ns = f"cp{name}{self.tag}"
        self.names.append(ns)
        _, addr = veth_to(ns, self.hub, f"204.{net}", f"{net}{self.tag}")
        self.links[ns] = f"cpi{net}{self.tag}"
        return ns, addr

    def start(self, ns: str, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        out = open(log, "wb")  # noqa: SIM115 - the process owns it until it ends
        p = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        stop_processes(self.procs, timeout=20)
        for ns in reversed(self.names):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _log_has(log: Path, pattern: str) -> re.Match | None:
    return re.search(pattern, log.read_text(errors="replace")) if log.exists() else None


def wait_worker(logs: Path) -> None:
    """Until the worker ``spark_cluster`` started has registered with its master."""
    registered = "Successfully registered with master"
    wait_for(lambda: _log_has(logs / "worker.log", registered) is not None, 120, "the worker")


def spark_cluster(nets: Namespaces, ns: str, addr: str, logs: Path, wait: bool = True) -> str:
    """A standalone master and one worker (2 cores) in namespace ``ns``; the master URL. With
    ``wait`` False it returns once the worker is started (``wait_worker`` waits for it to register),
    so that a driver can start meanwhile."""
    from tests.helpers.cluster_harness import MASTER_URL, SPARK_HOME, cluster_env

    env = dict(cluster_env(logs), SPARK_LOCAL_IP=addr)
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    master_log = logs / "master.log"
    master = nets.start(
        ns,
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            addr,
            "--port",
            "0",
            "--webui-port",
            "0",
        ],
        master_log,
        env,
    )

    wait_for(
        lambda: _log_has(master_log, MASTER_URL.pattern) is not None or master.poll() is not None,
        120,
        "master",
    )
    found = _log_has(master_log, MASTER_URL.pattern)
    assert found is not None, master_log.read_text(errors="replace")[-2000:]
    url = found.group(1)
    worker_log = logs / "worker.log"
    worker_args = ["--host", addr, "--port", "0", "--webui-port", "0", "--cores", "2", "--memory", "1g"]
    nets.start(
        ns,
        [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            url,
            *worker_args,
            "--work-dir",
            str(logs / "work"),
        ],
        worker_log,
        env,
    )
    if wait:
        wait_worker(logs)
    return url
