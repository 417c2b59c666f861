"""Asymmetric delay between agents in separate network namespaces (veth, a one-way delay relay).

Topology: namespace A (10.201.1.2) and B (10.201.2.2) joined through a middle
namespace M that routes between them and runs the coordinator and the relay.
Agent B advertises the relay, so A's probes to B are held for the delay on the
way out and come back at once; B's probes to A go straight through M. With A
as the reference, the MinRTT method's e for B grows by half the delay, its
estimate is off by about half the delay, and the bound still holds.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import native_tsc
from cloudprofiler.children import stop_processes
from cloudprofiler.cli import main
from cp_sync.compare.synthetic import stamp
from cp_sync.sync_table import read_sync
from native_tsc.domain import make_virtual
from tests.helpers import SCRIPTS

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 ('ip') is not installed"),
]

A_V = make_virtual("ns-node-a", "-75", 4_000_000_000_000)
B_V = make_virtual("ns-node-b", "190.5", -8_000_000_000_000)
RELAY = SCRIPTS / "delay_relay.py"  # run by path inside a namespace
COORD = "10.201.1.1:5599"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns():
    """Three namespaces and two veth pairs with unique names; deleted afterwards."""
    tag = f"{os.getpid() % 10000:04d}{secrets.token_hex(2)}"
    ns = {k: f"cp{k}{tag}" for k in ("a", "b", "m")}
    created = []
    try:
        for name in ns.values():
            _ip("netns", "add", name)
            created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        for side, net in (("a", 1), ("b", 2)):
            inner, outer = f"v{side}{tag}", f"m{side}{tag}"
            _ip(
                "link",
                "add",
                inner,
                "netns",
                ns[side],
                "type",
                "veth",
                "peer",
                "name",
                outer,
                "netns",
                ns["m"],
            )
            _ip("-n", ns[side], "addr", "add", f"10.201.{net}.2/24", "dev", inner)
            _ip("-n", ns["m"], "addr", "add", f"10.201.{net}.1/24", "dev", outer)
            _ip("-n", ns[side], "link", "set", inner, "up")
            _ip("-n", ns["m"], "link", "set", outer, "up")
            _ip("-n", ns[side], "route", "add", "default", "via", f"10.201.{net}.1")
        subprocess.run(
            ["ip", "netns", "exec", ns["m"], "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True, timeout=30
        )
        yield ns
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


class _Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, ns: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen(
            ["ip", "netns", "exec", ns, *args],
            env=dict(os.environ, **(env or {})),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(p)
        return p

    def stop(self) -> None:
        stop_processes(self.procs)
        self.procs.clear()


def _sync_run(ns: str, phase: str, out: Path) -> None:
    r = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-m",
            "cloudprofiler.cli",
            "sync",
            "run",
            "--server",
            COORD,
            "--phase",
            phase,
            "--rounds",
            "100",
            "--out",
            str(out),
            "--expect",
            "2",
            "--wait",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


def _run(ns: dict[str, str], delay_us: int, tmp: Path) -> dict:
    """One before/after sync through the relay with ``delay_us`` one way; events translated."""
    procs = _Procs()
    py = [sys.executable, "-m", "cloudprofiler.cli"]
    try:
        procs.start(ns["m"], [*py, "sync", "serve", "--bind", COORD])
        procs.start(
            ns["m"],
            [
                sys.executable,
                str(RELAY),
                "--listen",
                "10.201.1.1:7102",
                "--target",
                "10.201.2.2:7002",
                "--delay-us",
                str(delay_us),
            ],
        )
        procs.start(
            ns["a"],
            [*py, "sync", "agent", "--server", COORD, "--probe-bind", "10.201.1.2", "--probe-port", "7001"],
            {"CP_TSC_VIRTUAL": A_V.spec()},
        )
        procs.start(
            ns["b"],
            [
                *py,
                "sync",
                "agent",
                "--server",
                COORD,
                "--probe-bind",
                "10.201.2.2",
                "--probe-port",
                "7002",
                "--advertise",
                "10.201.1.1:7102",
                "--probe-allow",  # the relay forwards A's probes from M's address on B's side
                "10.201.2.1",
            ],
            {"CP_TSC_VIRTUAL": B_V.spec()},
        )
        sync = tmp / f"sync-{delay_us}"
        _sync_run(ns["m"], "before", sync)
        raw = native_tsc.clock.raw
        reads = []
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            reads.extend(raw() for _ in range(10))
            time.sleep(0.002)
        _sync_run(ns["m"], "after", sync)
    finally:
        procs.stop()
    raws = np.array(reads, dtype=np.int64)
    rng = np.random.default_rng(delay_us)
    n = 2000
    a = rng.integers(0, len(raws), n)
    b = np.minimum(a + rng.integers(0, 40, n), len(raws) - 1)
    doms = [A_V, B_V]
    si, ei = rng.integers(0, 2, n), rng.integers(0, 2, n)
    ys = np.array([doms[d].apply(int(raws[i])) for d, i in zip(si, a, strict=True)], dtype=np.int64)
    ye = np.array([doms[d].apply(int(raws[i])) for d, i in zip(ei, b, strict=True)], dtype=np.int64)
    names = np.array([d.domain for d in doms])
    rec = tmp / f"records-{delay_us}"
    rec.mkdir()
    pq.write_table(
        pa.table(
            {
                "tuple_id": np.arange(n, dtype=np.int64),
                "cp_tsc_gen": ys,
                "cp_node_gen": names[si],
                "cp_tsc_sink": ye,
                "cp_node_sink": names[ei],
            }
        ),
        rec / "part-0.parquet",
    )
    out = tmp / f"lat-{delay_us}.parquet"
    assert (
        main(
            [
                "translate",
                "--records",
                str(rec),
                "--sync",
                str(sync),
                "--from",
                "gen",
                "--to",
                "sink",
                "--reference",
                A_V.domain,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table, _ = read_sync(sync)
    own = table.filter(
        pc.and_(pc.equal(table["initiator"], A_V.domain), pc.equal(table["responder"], B_V.domain))
    )
    rtt = pc.subtract(own["c_k"], own["c_i"]).to_numpy()
    phase = np.array(own["phase"].to_pylist())
    return {
        "out": pq.read_table(out).sort_by("tuple_id"),
        "truth": stamp(A_V, raws[b]) - stamp(A_V, raws[a]),
        "e": np.array([rtt[phase == p].min() / 2 for p in ("before", "after")]),
        "probes": table.num_rows,
    }


@pytest.mark.long  # about a minute of probes through a delayed veth
def test_a_delay_on_one_probe_direction_widens_its_minrtt_and_minrtt_takes_the_other(netns, tmp_path) -> None:
    delay_us = 400
    hz = native_tsc.clock.real_hz()
    base = _run(netns, 0, tmp_path)
    slow = _run(netns, delay_us, tmp_path)
    for r in (base, slow):
        assert r["probes"] == 2 * 2 * 100
        out = r["out"]
        for method in ("minrtt", "hull", "naive"):
            sub = out.filter(pc.equal(out["method"], method))
            assert sub["tuple_id"].to_pylist() == list(range(2000))
            err = np.abs(sub["duration_cycles"].to_numpy() - r["truth"])
            assert np.all(err <= sub["bound_cycles"].to_numpy()), method
    half = delay_us * 1e-6 * hz / 2
    # e grows by half the one-way delay. The relay holds at least the delay (its jitter only adds), and
    # on a busy 2-core machine the baseline's MinRTT through a Python relay may itself come out tens of
    # microseconds high, hence the margins.
    widening = slow["e"] - base["e"]  # per phase
    assert np.all((half - 40e-6 * hz <= widening) & (widening <= half + 150e-6 * hz))

    # minrtt takes each phase's probe from the direction with the smaller MinRTT. B's probes to A do
    # not pass the relay, so minrtt relates the clocks through them: neither its error nor its bound
    # grows with the delay on A's path (A's own probes would add about half the delay to both).
    def s2(r, method):
        sub = r["out"].filter(
            pc.and_(pc.equal(r["out"]["method"], method), pc.equal(r["out"]["scenario"], "reference-node"))
        )
        ids = np.array(sub["tuple_id"].to_pylist())
        return np.abs(sub["duration_cycles"].to_numpy() - r["truth"][ids]), sub["bound_cycles"].to_numpy()

    err_b, bnd_b = s2(base, "minrtt")
    err_s, bnd_s = s2(slow, "minrtt")
    assert abs(np.median(err_s) - np.median(err_b)) < 0.25 * half, (np.median(err_s), np.median(err_b))
    grown = np.median(bnd_s) - np.median(bnd_b)
    assert grown < 0.25 * half, (grown, half)
    assert np.median(bnd_s) < 0.5 * (np.median(bnd_b) + half)  # far under what A's probes would give
    # The hull uses every probe of both directions: never looser than minrtt (a rounding's slack).
    _, hull_s = s2(slow, "hull")
    assert np.median(hull_s) <= np.median(bnd_s) + 2e-6 * hz
