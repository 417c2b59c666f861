"""Agents in three processes, each under its own virtual TSC domain, on loopback: probes, tables, truth."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import native_tsc
from cloudprofiler.cli import main
from cp_sync.compare.synthetic import invert, stamp
from cp_sync.nodes.coordinator import Coordinator, list_agents, run_phase
from cp_sync.sync_table import read_sync
from native_tsc.domain import make_virtual

VIRTUAL = [
    make_virtual("vnode-a", "42.5", 7_000_000_000_000),
    make_virtual("vnode-b", "-180", -3_000_000_000_000),
    make_virtual("vnode-c", "265.125", 910_000_000_000_000),
]


@pytest.fixture
def cluster():
    """A coordinator in this process and one agent process per virtual domain."""
    coord = Coordinator("127.0.0.1:0").start()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cloudprofiler.cli", "sync", "agent", "--server", coord.address],
            env=dict(os.environ, CP_TSC_VIRTUAL=v.spec()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for v in VIRTUAL
    ]
    try:
        yield coord
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        coord.stop()


def _collect_events(seconds: float) -> np.ndarray:
    """Raw counter reads spread over ``seconds`` (sleeps) plus bursts of back-to-back reads."""
    raw = native_tsc.clock.raw
    reads = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        reads.extend(raw() for _ in range(20))
        time.sleep(0.002)
    return np.array(reads, dtype=np.int64)


def _half_min_rtts_in_reference_cycles(table: pa.Table, hz: dict, reference: str) -> dict:
    """Per (phase, peer of the reference): half the smaller MinRTT of both directions, in reference cycles."""
    half: dict = {}
    rows = table.append_column("rtt", pc.subtract(table["c_k"], table["c_i"]))
    for r in rows.group_by(["phase", "initiator", "responder"]).aggregate([("rtt", "min")]).to_pylist():
        if reference not in (r["initiator"], r["responder"]):
            continue
        peer = r["responder"] if r["initiator"] == reference else r["initiator"]
        e = r["rtt_min"] * hz[reference] / hz[r["initiator"]] / 2
        key = (r["phase"], peer)
        half[key] = min(half.get(key, e), e)
    return half


def test_three_virtual_domains_on_loopback(cluster, tmp_path, capsys) -> None:
    sync = tmp_path / "sync"
    assert (
        main(
            [
                "sync",
                "run",
                "--server",
                cluster.address,
                "--phase",
                "before",
                "--rounds",
                "100",
                "--out",
                str(sync),
                "--expect",
                "3",
                "--wait",
                "60",
            ]
        )
        == 0
    )
    assert "vnode-b" in capsys.readouterr().out
    agents = list_agents(cluster.address)
    assert sorted(a["domain"] for a in agents) == ["vnode-a", "vnode-b", "vnode-c"]
    raws = _collect_events(0.4)
    after = run_phase(cluster.address, "after", 100, sync, expect=3)
    assert after["failures"] == []

    table, hz = read_sync(sync)
    assert sorted(hz) == ["vnode-a", "vnode-b", "vnode-c"]
    # Every ordered pair, both directions, 100 probes each per phase, every probe kept.
    counts = table.group_by(["phase", "initiator", "responder"]).aggregate([("round", "count")])
    assert counts.num_rows == 2 * 6
    lost = {(p["initiator"], p["responder"]): p["lost"] for p in after["pairs"]}
    assert all(v == 0 for v in lost.values())
    assert set(counts["round_count"].to_pylist()) == {100}
    # The bracket holds against the truth: c_j mapped into the initiator's domain lies within [c_i, c_k].
    by = {v.domain: v for v in VIRTUAL}
    for row in table.slice(0, 50).to_pylist() + table.slice(table.num_rows - 50).to_pylist():
        ini, resp = by[row["initiator"]], by[row["responder"]]
        raw_j = invert(resp, row["c_j"])
        assert row["c_i"] <= ini.apply(raw_j) <= row["c_k"] + 1

    # Events: start in one domain, end in another (or the same), real durations from the raw reads.
    rng = np.random.default_rng(2026)
    n = 3000
    # Mostly short latencies (a few reads apart), some spanning most of the time between the phases.
    a = rng.integers(0, len(raws), n)
    step = np.where(rng.random(n) < 0.8, rng.integers(0, 60, n), rng.integers(0, len(raws), n))
    b = np.minimum(a + step, len(raws) - 1)
    rs, re_ = raws[a], raws[b]
    si, ei = rng.integers(0, 3, n), rng.integers(0, 3, n)
    names = np.array([v.domain for v in VIRTUAL])
    ys = np.array([VIRTUAL[d].apply(int(t)) for d, t in zip(si, rs, strict=True)], dtype=np.int64)
    ye = np.array([VIRTUAL[d].apply(int(t)) for d, t in zip(ei, re_, strict=True)], dtype=np.int64)
    ref = VIRTUAL[0]
    truth = stamp(ref, re_) - stamp(ref, rs)
    ids = np.arange(n, dtype=np.int64) + (7 << 40)
    rec = tmp_path / "records"
    rec.mkdir()
    pq.write_table(
        pa.table(
            {
                "tuple_id": ids,
                "cp_tsc_source": ys,
                "cp_node_source": names[si],
                "cp_tsc_sink": ye,
                "cp_node_sink": names[ei],
            }
        ),
        rec / "part-0.parquet",
    )
    out = tmp_path / "lat.parquet"
    assert (
        main(
            [
                "translate",
                "--records",
                str(rec),
                "--sync",
                str(sync),
                "--from",
                "source",
                "--to",
                "sink",
                "--reference",
                ref.domain,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    got = pq.read_table(out)
    truth_by_id = dict(zip(ids.tolist(), truth.tolist(), strict=True))
    bounds = {}
    for method in ("minrtt", "hull", "naive"):
        sub = got.filter(pc.equal(got["method"], method)).sort_by("tuple_id")
        assert sub["tuple_id"].to_pylist() == ids.tolist()
        t = np.array([truth_by_id[i] for i in sub["tuple_id"].to_pylist()])
        err = np.abs(sub["duration_cycles"].to_numpy() - t)
        bnd = sub["bound_cycles"].to_numpy()
        scen = np.array(sub["scenario"].to_pylist())
        for s in ("reference", "same-node", "reference-node", "two-nodes"):
            assert np.sum(scen == s) > 50, (method, s)
            assert np.all(err[scen == s] <= bnd[scen == s]), (method, s)
        bounds[method] = (bnd, scen)
    # Convex hull never looser than the two MinRTT points.
    assert np.all(bounds["hull"][0] <= bounds["minrtt"][0] + 1e-6)
    # The paper's ordering, with e the half MinRTT of each of the reference's pairs and phases: minrtt
    # takes the probe direction with the smaller round trip, measured in the reference's cycles.
    half_min_rtts = np.array(list(_half_min_rtts_in_reference_cycles(table, hz, ref.domain).values()))
    e_min, e_max = half_min_rtts.min(), half_min_rtts.max()
    bnd, scen = bounds["minrtt"]
    assert np.all(bnd[scen == "reference"] < 0.01)
    # Scenario 1 costs 2 d/D e: below e whenever the duration is short next to the time between phases.
    ref_probes = table.filter(pc.equal(table["initiator"], ref.domain))
    gap = (
        pc.min(ref_probes.filter(pc.equal(ref_probes["phase"], "after"))["c_i"]).as_py()
        - pc.max(ref_probes.filter(pc.equal(ref_probes["phase"], "before"))["c_k"]).as_py()
    )
    short = (scen == "same-node") & (np.abs(truth) < gap / 4)
    assert short.sum() > 50
    assert np.all(bnd[short] < e_min)
    ref_node = bnd[scen == "reference-node"]
    # e here converts a peer-initiated round trip with the agents' reported frequencies, the
    # translation with the rate between its MinRTT points: they differ by the frequency estimate's
    # noise (about 1e-4 at most on a loaded machine), a cycle or two on e of ~17,000 cycles
    slack = 2.01 + 2e-4 * e_max
    assert np.all((ref_node >= e_min - slack) & (ref_node <= e_max + slack)), (
        e_min, e_max, ref_node.min(), ref_node.max()
    )  # fmt: skip
    nb, ns = bounds["naive"]
    assert np.median(bnd[scen == "two-nodes"]) < 0.75 * np.median(nb[ns == "two-nodes"])
    # Scenario 3 is about e: the two nodes' own MinRTT e plus a rate term below e/2 for short latencies.
    everyone = table.append_column("rtt", pc.subtract(table["c_k"], table["c_i"]))
    e_all = everyone.group_by(["phase", "initiator", "responder"]).aggregate([("rtt", "min")])
    e_all_max = e_all["rtt_min"].to_numpy().max() / 2
    short3 = (scen == "two-nodes") & (np.abs(truth) < gap / 4)
    assert short3.sum() > 50
    assert np.all(bnd[short3] <= 1.5 * e_all_max + 3)
    assert np.all(nb[ns == "same-node"] >= 2 * e_min)
    # Durations in ns from the reference frequency the MinRTT pairs give: close to the real one.
    f_true = native_tsc.clock.real_hz() * ref.rate()
    dur = got.filter(pc.equal(got["method"], "minrtt"))
    ratio = dur["duration_cycles"].to_numpy() / np.maximum(dur["duration_ns"].to_numpy(), 1e-9) * 1e9
    big = np.abs(dur["duration_cycles"].to_numpy()) > 1e6
    assert np.all(np.abs(ratio[big] / f_true - 1) < 2e-3)


def test_sync_run_errors_are_one_line(tmp_path, capsys) -> None:
    with Coordinator("127.0.0.1:0") as coord:
        rc = main(["sync", "run", "--server", coord.address, "--phase", "bad phase!", "--out", str(tmp_path)])
        assert rc == 2
        assert "invalid phase" in capsys.readouterr().err
        rc = main(
            [
                "sync",
                "run",
                "--server",
                coord.address,
                "--phase",
                "p",
                "--out",
                str(tmp_path),
                "--wait",
                "0.3",
            ]
        )
        assert rc == 2
        assert "0 agents registered" in capsys.readouterr().err


def test_coordinator_survives_malformed_and_oversized_messages() -> None:
    import zmq

    from cp_sync.nodes import control

    with Coordinator("127.0.0.1:0") as coord:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(coord.address)
        try:
            s.send_multipart([b"not json"])
            s.send_multipart([b'{"op": 5}'])
            s.send_multipart([b'{"op": "register", "domain": "x", "hz": "fast", "host": "h", "port": 1}'])
            s.send_multipart([b'{"op": "register", "domain": "y", "hz": 1e9, "host": "a.b", "port": 9}'])
            s.send_multipart([b'{"op": "result", "task": 1}', b"\x00" * 7])  # rows of a bad size
            s.send_multipart([b'{"op": "run", "phase": "p", "rounds": 10, "gap_us": 0, "timeout_ms": 5}'])
            assert s.poll(5000)
            h, _ = control.unpack(s.recv_multipart())
            assert h["op"] == "error" and "at least 2 registered agents" in h["error"]
            big = ctx.socket(zmq.DEALER)
            big.setsockopt(zmq.LINGER, 0)
            big.connect(coord.address)
            big.send_multipart([b"{" + b" " * (control.MAX_MESSAGE + 10) + b"}"])  # refused by MAXMSGSIZE
            big.close(0)
        finally:
            s.close(0)
        # Nothing above registered an agent, and the coordinator still answers.
        assert list_agents(coord.address) == []


def test_agent_refused_its_domain_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second agent of a domain a live agent holds is refused; it retries, then fails naming why."""
    import threading

    from cp_sync.nodes import agent as agent_mod

    monkeypatch.setattr(agent_mod, "REFUSED_GIVE_UP_S", 1.0)
    coord = Coordinator("127.0.0.1:0").start()
    first = agent_mod.Agent(coord.address)
    t = threading.Thread(target=first.run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not list_agents(coord.address) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [a["domain"] for a in list_agents(coord.address)] == [native_tsc.domain_id()]
        second = agent_mod.Agent(coord.address)
        with pytest.raises(ConnectionRefusedError, match="refused this agent") as e:
            second.run()
        assert "\n" not in str(e.value) and native_tsc.domain_id() in str(e.value)
        # the live agent keeps its domain
        assert [a["domain"] for a in list_agents(coord.address)] == [native_tsc.domain_id()]
    finally:
        first.stop()
        t.join(10)
        coord.stop()
