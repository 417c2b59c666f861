"""sync=auto without Spark: its options, one agent per host and domain, the coordinator process and
its phases, and the status of records in a span that skipped a phase of their domain.

Real parts: coordinator and agents are processes speaking ZeroMQ and UDP on loopback; a second TSC
domain is a virtual one (CP_TSC_VIRTUAL) in its own agent process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import native_tsc
from cloudprofiler.sync_sink import sink_writer
from cp_common import curve_keys as ck
from cp_sync.auto import driver as auto
from cp_sync.auto.driver import SyncOptions, coordinator_state, ensure_coordinator
from cp_sync.auto.host_agent import AgentSpec, agent_pids, ensure_agent, sweep_logs
from cp_sync.compare.synthetic import DOMAINS, synth_phases
from cp_sync.nodes.coordinator import Coordinator, list_agents
from cp_sync.sync_table import read_sync
from cp_sync.translate.relation import STATUSES
from cp_sync.translate.translator import Translator
from native_tsc.domain import VirtualDomain, make_virtual
from tests.helpers.polling import wait_for

VIRTUAL = make_virtual("auto-v1", "120.5", 4_000_000_000_000)
INTRUDER = make_virtual("auto-v2", "-50", 1_000_000_000)


def _schema():  # type: ignore[no-untyped-def]
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("tuple_id", LongType())])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sync": "on"}, "option sync='on': expected one of off, auto"),
        (
            {"sync": "auto", "syncEvery": "soon"},
            "option syncEvery='soon': expected seconds from 0.5 to 86400",
        ),
        ({"sync": "auto", "syncEvery": "0.1"}, "option syncEvery='0.1': expected seconds from 0.5 to 86400"),
        ({"sync": "auto", "syncEvery": "nan"}, "option syncEvery='nan': expected seconds from 0.5 to 86400"),
        (
            {"sync": "auto", "syncPort": "80"},
            "option syncPort='80': expected 0 (any free port) or a port from 1024 to 65535",
        ),
        (
            {"sync": "auto", "curveKeys": "/nonexistent/keys"},
            "option curveKeys='/nonexistent/keys': not a directory "
            "(make one with 'cloudprofiler keys generate')",
        ),
        ({"syncEvery": "5"}, "option syncEvery needs sync=auto (sync is off)"),
        ({"sync": "off", "curveKeys": "/tmp"}, "option curveKeys needs sync=auto (sync is off)"),
    ],
)
def test_bad_sync_options_fail_in_one_line_naming_the_option(tmp_path: Path, options, message) -> None:
    with pytest.raises(ValueError) as e:
        sink_writer(_schema(), {"path": str(tmp_path / "out"), **options}, False, {"master": "local[2]"})
    assert str(e.value) == message
    assert not (tmp_path / "out").exists()  # refused before a coordinator or a file


def test_sync_options_defaults_and_values(tmp_path: Path) -> None:
    assert SyncOptions.parse({}) == SyncOptions("off", 60.0, None, 0)
    got = SyncOptions.parse(
        {"sync": " AUTO ", "syncevery": "2.5", "curvekeys": str(tmp_path), "syncport": "5599"}
    )
    assert got == SyncOptions("auto", 2.5, str(tmp_path), 5599)


def test_coordinator_address_follows_the_driver() -> None:
    assert auto.coordinator_address({"master": "local[2,3]", "host": "10.1.2.3"}) == (
        "127.0.0.1",
        "127.0.0.1",
    )
    assert auto.coordinator_address({"master": "spark://m:7077", "host": "10.1.2.3"}) == (
        "10.1.2.3",
        "10.1.2.3",
    )
    got = auto.coordinator_address({"master": "yarn", "host": "10.1.2.3", "bindAddress": "0.0.0.0"})
    assert got == ("0.0.0.0", "10.1.2.3")


def test_checkpoints_compare_as_spark_reports_them(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert auto.normalize_checkpoint(f"file:{ck}") == auto.normalize_checkpoint(str(ck))
    assert auto.normalize_checkpoint("ck", cwd=str(tmp_path)) == os.path.realpath(ck)
    assert auto.normalize_checkpoint("s3a://b/x/ck/") == auto.normalize_checkpoint("s3a://b/x/ck") == "/x/ck"


def test_coordinator_settings_cross_to_its_process_in_one_typed_form() -> None:
    from cp_sync.auto.coordinator import CoordinatorSettings

    cfg = CoordinatorSettings("k1", "s3://b/p", 2.5, "127.0.0.1", "127.0.0.1", port=5000, jvm=(41, 7))
    assert CoordinatorSettings.from_json(cfg.to_json()) == cfg
    doc = json.loads(cfg.to_json())
    assert doc["every"] == 2.5 and doc["jvm"] == [41, 7] and doc["rounds"] == 100
    with pytest.raises(ValueError) as e:
        CoordinatorSettings.from_json(json.dumps({**doc, "evry": 1}).encode())
    assert str(e.value) == "coordinator settings: unknown field 'evry'"
    with pytest.raises(ValueError, match=r"^coordinator settings: .*'every'"):
        CoordinatorSettings.from_json(json.dumps({k: v for k, v in doc.items() if k != "every"}).encode())


def test_a_taken_sync_port_fails_in_one_line_naming_the_option(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError) as e:
            ensure_coordinator(str(tmp_path / "out"), SyncOptions("auto", port=port), {"master": "local"})
    assert str(e.value) == (
        f"option syncPort={port}: the sync coordinator cannot start on 127.0.0.1:{port}: "
        "Address already in use"
    )
    assert coordinator_state(str(tmp_path / "out")) is None


def test_old_logs_are_swept_and_locks_kept(tmp_path: Path) -> None:
    week = time.time() - 8 * 86_400
    for name in ("coord-a.log", "agent-b.log", "coord-a.lock"):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (week, week))
    (tmp_path / "agent-new.log").write_text("")
    sweep_logs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent-new.log", "coord-a.lock"]


@pytest.fixture
def coordinator():
    coord = Coordinator("127.0.0.1:0").start()
    try:
        yield coord
    finally:
        coord.stop()


def test_one_agent_per_host_whatever_races_to_start_it(coordinator) -> None:
    spec = AgentSpec(coordinator.address, gone_s=1.0)
    started: list[int | None] = []
    threads = [threading.Thread(target=lambda: started.append(ensure_agent(spec))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pids = [p for p in started if p is not None]
    assert len(started) == 6 and len(pids) == 1  # one start, five found the lock taken
    wait_for(lambda: len(list_agents(coordinator.address)) == 1, 20, "the agent registers")
    assert [a["domain"] for a in list_agents(coordinator.address)] == [native_tsc.domain_id()]
    assert agent_pids(coordinator.address) == pids
    assert ensure_agent(spec) is None  # later tasks start nothing
    coordinator.stop()
    wait_for(lambda: agent_pids(coordinator.address) == [], 10, "the agent exits with its coordinator")


def _virtual_agent(endpoint: str, keys: Path | None, virtual: VirtualDomain = VIRTUAL) -> subprocess.Popen:
    """An agent of another TSC domain on this machine (the second 'host' of a phase)."""
    argv = [sys.executable, "-m", "cp_sync.auto.host_agent", "--server", endpoint, "--gone-after", "2"]
    return subprocess.Popen(
        argv + (["--keys", str(keys)] if keys else []),
        env=dict(os.environ, CP_TSC_VIRTUAL=virtual.spec()),
        stdout=subprocess.DEVNULL,
    )


def _phases(sync: Path) -> list[dict]:
    return sorted(
        (json.loads(p.read_text()) for p in (sync / "_phases").glob("*.json")),
        key=lambda r: int(r["phase"].rsplit("-", 1)[1]),
    )


@pytest.fixture
def out(tmp_path: Path):
    """A sink path whose coordinator, if a test leaves one running, is stopped afterwards."""
    path = str(tmp_path / "out")
    yield path
    if auto.stop(path):
        auto.wait_for_stop(path, 60)


@pytest.mark.long
def test_coordinator_process_runs_start_periodic_and_stop_phases_with_keys(tmp_path: Path, out: str) -> None:
    """With curveKeys: CURVE between the coordinator and its agents, keyed probes; an agent without
    the keys is never registered."""
    keys = tmp_path / "keys"
    ck.generate(keys)
    opts = SyncOptions("auto", every=0.5, curve_keys=str(keys))
    endpoint = ensure_coordinator(out, opts, {"master": "local[1]"}, str(tmp_path / "ck"))
    assert endpoint.startswith("tcp://127.0.0.1:")
    assert ensure_coordinator(out, opts, {"master": "local[1]"}, str(tmp_path / "ck")) == endpoint  # adopted
    state = coordinator_state(out)
    assert state is not None and state["state"] == "running"
    host = AgentSpec(endpoint, str(keys), gone_s=2.0)
    assert ensure_agent(host) is not None
    other = _virtual_agent(endpoint, keys)
    intruder = _virtual_agent(endpoint, None, INTRUDER)
    try:
        sync = tmp_path / "out" / "_sync"
        wait_for(
            lambda: any(r["kind"] == "periodic" and r["pairs"] == 2 for r in _phases(sync)), 60, "phases"
        )
        assert auto.stop(out)
        wait_for(lambda: coordinator_state(out) is None, 30, "the stop phase and the coordinator's exit")
        recs = _phases(sync)
        kinds = [r["kind"] for r in recs]
        assert kinds[0] == "start" and kinds[-1] == "stop" and set(kinds[1:-1]) == {"periodic"}
        assert [r["phase"] for r in recs] == [f"{k}-{i:04d}" for i, k in enumerate(kinds)]
        both = sorted([native_tsc.domain_id(), VIRTUAL.domain])
        full = [r for r in recs if r["domains"] == both]
        assert recs[-1] in full and all(r["pairs"] == 2 and r["failures"] == [] for r in full)
        table, hz = read_sync(sync)
        assert set(hz) == set(both)
        assert set(table["phase"].unique().to_pylist()) == {r["phase"] for r in full}
        # The agents hear nothing more and exit.
        wait_for(lambda: agent_pids(endpoint) == [], 20, "agents exit after their coordinator")
        assert other.wait(5) == 0
        assert intruder.wait(30) == 1  # refused: its handshake failed, and it said so
        assert all(INTRUDER.domain not in r["domains"] for r in recs)
    finally:
        for p in (other, intruder):
            if p.poll() is None:
                p.kill()


@pytest.mark.long
def test_a_lone_domain_makes_a_phase_with_nothing_to_probe(tmp_path: Path, out: str) -> None:
    endpoint = ensure_coordinator(out, SyncOptions("auto", every=0.5), {"master": "local"}, None)
    ensure_agent(AgentSpec(endpoint, gone_s=2.0))
    sync = tmp_path / "out" / "_sync"
    wait_for(lambda: any(r["domains"] == [native_tsc.domain_id()] for r in _phases(sync)), 60, "a phase")
    assert auto.stop(out)
    wait_for(lambda: coordinator_state(out) is None, 30, "the coordinator's exit")
    recs = _phases(sync)
    assert all("error" not in r for r in recs)
    lone = [r for r in recs if r["domains"] == [native_tsc.domain_id()]]
    assert lone and all(r["pairs"] == 0 and r["file"] for r in lone)
    table, hz = read_sync(sync)
    assert table.num_rows == 0 and list(hz) == [native_tsc.domain_id()]
    wait_for(lambda: agent_pids(endpoint) == [], 20, "the agent exits after its coordinator")


@pytest.mark.long
def test_a_killed_coordinator_comes_back_on_its_endpoint(out: str) -> None:
    """The next writer (a commit on the driver) starts it again where the executors' agents look."""
    opts = SyncOptions("auto", every=30)
    endpoint = ensure_coordinator(out, opts, {"master": "local"}, None)
    pid = coordinator_state(out)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: coordinator_state(out) is None, 10, "the coordinator dies")
    assert ensure_coordinator(out, opts, {"master": "local"}, None) == endpoint
    assert coordinator_state(out)["pid"] != pid


T0 = 10**13
SEC = 2_600_000_000


def test_records_in_a_span_that_skipped_a_phase_of_their_domain_are_not_ok() -> None:
    """node-b's agent is away for phase p0002 (the other pairs are probed): node-b's records between
    p0001 and p0003 are not ok, whatever the figures say; node-c's stay ok; every bound still holds."""
    ref, b, c = DOMAINS[:3]
    rng = np.random.default_rng(26)
    tables = [
        synth_phases(
            [ref, b, c],
            [T0 + 2 * k * SEC],
            40,
            rng,
            pairs=[(0, 2), (2, 0)] if k == 2 else None,
            names=[f"p{k:04d}"],
        )
        for k in range(5)
    ]
    table = pa.concat_tables(tables)
    raw = np.arange(T0 + SEC // 2, T0 + 15 * SEC // 2, SEC // 10)
    n = len(raw)
    for dom in (b, c):
        ys = np.array([dom.apply(int(t)) for t in raw], np.int64)
        ye = np.array([ref.apply(int(t) + 5000) for t in raw], np.int64)
        truth = np.array([ref.apply(int(t) + 5000) - ref.apply(int(t)) for t in raw])
        tr = Translator(table, ref.domain)
        for res in tr.translate(ys, np.array([dom.domain] * n), ye, np.array([ref.domain] * n)):
            st = np.array([STATUSES[s] for s in res.status])
            gap = (raw > T0 + 2 * SEC) & (raw <= T0 + 6 * SEC)  # node-b's span p0001 -> p0003
            if dom is b:
                assert set(st[gap]) == {"drift"}, res.method
                assert set(st[~gap]) == {"ok"}, res.method
            else:
                assert set(st) == {"ok"}, res.method
            assert np.all(np.abs(res.duration - truth) <= res.bound), res.method
        if dom is b:
            notes = [n for ns in tr.drift_notes().values() for n in ns]
            assert any("p0002 did not probe" in s for s in notes)
