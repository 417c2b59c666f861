"""Continuous sync: ``sync run --every`` phases on a schedule, stopped by signal or duration, and its load."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.compute as pc
import pytest

from cloudprofiler.children import stop_processes
from cloudprofiler.cli import main
from cp_sync.nodes.coordinator import Coordinator
from cp_sync.nodes.periodic import Load, Schedule, check_prefix, first_index, phase_name
from cp_sync.sync_table import phase_order, read_sync
from native_tsc.domain import VirtualDomain, make_virtual

VIRTUAL = [make_virtual("cont-a", "12.5", 10**12), make_virtual("cont-b", "-88", -(10**13))]
LOAD_RE = re.compile(
    r"(\d+) phases \((\d+) failed\), (\d+) pairs probed \((\d+) failed\), (\d+) probes sent, (\d+) lost"
)


def _agent(server: str, v: VirtualDomain) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cloudprofiler.cli", "sync", "agent", "--server", server],
        env=dict(os.environ, CP_TSC_VIRTUAL=v.spec()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture
def agents():
    """A coordinator in this process and two agent processes under virtual domains (``procs``)."""
    coord = Coordinator("127.0.0.1:0").start()
    procs = [_agent(coord.address, v) for v in VIRTUAL]
    try:
        yield SimpleNamespace(address=coord.address, procs=procs)
    finally:
        stop_processes(procs)
        coord.stop()


def test_schedule_is_fixed_and_ends_at_the_duration() -> None:
    s = Schedule(every=1.0, duration=3.0, t0=100.0)
    # On time: slots every second from t0, the last one at t0 + duration.
    assert s.next_start(1, 100.2) == (101.0, False)
    assert s.next_start(2, 101.1) == (102.0, False)
    assert s.next_start(3, 102.1) == (103.0, True)
    # Overrun: the next phase starts at once, never in a burst of missed slots, and never after the end.
    assert s.next_start(1, 101.7) == (101.7, False)
    assert s.next_start(2, 103.5) == (103.5, True)
    # A duration that is not a multiple of the period: the last phase at the duration itself.
    s = Schedule(every=5.0, duration=9.0, t0=0.0)
    assert s.next_start(1, 0.1) == (5.0, False)
    assert s.next_start(2, 5.1) == (9.0, True)
    assert Schedule(every=5.0, t0=0.0).next_start(7, 30.0) == (35.0, False)
    for bad, msg in (({"every": 0.0}, "--every 0"), ({"every": 1.0, "duration": -1.0}, "--duration -1")):
        with pytest.raises(ValueError, match=msg):
            Schedule(**bad)


def test_phase_names_number_on_past_the_directory(tmp_path: Path) -> None:
    assert first_index(tmp_path, "p") == 0
    for name in (
        "sync-p0000-1.parquet",
        "sync-p0011-2.parquet",
        "sync-px0099-3.parquet",
        "sync-q0500-4.parquet",
    ):
        (tmp_path / name).write_bytes(b"")
    assert first_index(tmp_path, "p") == 12
    assert first_index(tmp_path, "px") == 100
    assert phase_name("p", 7) == "p0007" and phase_name("job1-", 12345) == "job1-12345"
    with pytest.raises(ValueError, match="too long"):
        check_prefix("x" * 28)
    with pytest.raises(ValueError, match="invalid phase"):
        check_prefix("a b")


def test_load_counts_what_the_phases_report() -> None:
    load = Load()
    res = {
        "pairs": [
            {"probes": 98, "lost": 2, "cpu_ns": 3_000_000},
            {"probes": 100, "lost": 0, "cpu_ns": 1_000_000},
            {"probes": 100, "lost": "x", "cpu_ns": -5},  # bad figures from an agent are not counted
        ],
        "failures": ["a -> b: agent left"],
    }
    load.add(res, 10.0, 10.5)
    load.add({"pairs": [], "failures": []}, 12.0, 12.5)
    assert (load.phases, load.pairs, load.failed_pairs, load.answered, load.lost) == (2, 3, 1, 298, 2)
    assert load.seconds == 2.5 and load.busy_s == 1.0 and load.cpu_ns == 4_000_000
    r = load.rates()
    assert r["probes_per_s"] == 300 / 2.5
    assert r["bytes_per_s"] == (300 + 298) * 60 / 2.5
    assert r["cpu_share"] == pytest.approx(0.004 / 2.5)
    assert "300 probes sent, 2 lost" in load.summary()


def _phases(sync: Path) -> dict[str, int]:
    table, _ = read_sync(sync)
    counts = table.group_by("phase").aggregate([("round", "count")])
    return dict(zip(counts["phase"].to_pylist(), counts["round_count"].to_pylist(), strict=True))


def test_periodic_run_for_a_duration(agents, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sync = tmp_path / "sync"
    argv = ["sync", "run", "--server", agents.address, "--every", "1", "--duration", "3", "--phase", "t",
            "--rounds", "20", "--out", str(sync), "--wait", "60"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    # Phases at 0, 1, 2 and the last at 3 s; each probes both ordered pairs 20 times.
    assert _phases(sync) == {"t0000": 40, "t0001": 40, "t0002": 40, "t0003": 40}
    table, _ = read_sync(sync)
    assert phase_order(table) == ["t0000", "t0001", "t0002", "t0003"]
    starts = [pc.min(table.filter(pc.equal(table["phase"], p))["ns_i"]).as_py() for p in phase_order(table)]
    gaps = [(b - a) / 1e9 for a, b in zip(starts, starts[1:], strict=False)]
    assert all(g > 0.5 for g in gaps), gaps  # on the schedule, not back to back
    m = LOAD_RE.search(out)
    assert m is not None, out
    phases, failed, pairs, failed_pairs, sent, lost = map(int, m.groups())
    assert (phases, failed, pairs, failed_pairs) == (4, 0, 8, 0)
    assert sent == 160 + lost
    assert re.search(r"CPU of the probe loops in the agents \d+\.\d ms", out), out
    # A second run into the same directory numbers on.
    again = [
        *argv[:4],
        "--every",
        "1",
        "--duration",
        "1",
        "--phase",
        "t",
        "--rounds",
        "5",
        "--out",
        str(sync),
    ]
    assert main(again) == 0
    assert sorted(_phases(sync)) == ["t0000", "t0001", "t0002", "t0003", "t0004", "t0005"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_after_one_final_phase(agents, tmp_path: Path, sig: signal.Signals) -> None:
    sync = tmp_path / "sync"
    run = subprocess.Popen(
        [sys.executable, "-m", "cloudprofiler.cli", "sync", "run", "--server", agents.address,
         "--every", "0.7", "--rounds", "20", "--out", str(sync), "--wait", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(sync.glob("sync-p*.parquet")) if sync.is_dir() else []) < 2:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        t_signal = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        run.send_signal(sig)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err
    assert f"{sig.name}: stopping after this phase and one final phase" in err
    table, _ = read_sync(sync)
    order = phase_order(table)
    assert order == [f"p{i:04d}" for i in range(len(order))]
    starts = {p: pc.min(table.filter(pc.equal(table["phase"], p))["ns_i"]).as_py() for p in order}
    # Exactly one phase started after the signal, and it is the last: every record stamped before the
    # signal lies between two phases.
    after = [p for p in order if starts[p] > t_signal]
    assert after == [order[-1]]
    assert 3 <= len(order) <= 4
    m = LOAD_RE.search(out)
    assert m is not None, out
    assert int(m.group(1)) == len(order) and int(m.group(5)) == table.num_rows + int(m.group(6))


def test_bad_periodic_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["sync", "run", "--server", "127.0.0.1:1", "--out", str(tmp_path)]
    for extra, msg in (
        ([], "needs --phase NAME (one phase) or --every SECONDS"),
        (["--duration", "5"], "--duration needs --every"),
        (["--every", "0"], "--every 0: expected 0.01"),
        (["--every", "1", "--duration", "0"], "--duration 0: expected"),
        (["--every", "1", "--phase", "y" * 30], "too long for periodic phases"),
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err


def test_a_failed_phase_is_counted_and_the_run_goes_on(agents, tmp_path: Path) -> None:
    """An agent leaves after the second phase and is back after the third: only the third fails."""
    from cp_sync.nodes.coordinator import list_agents
    from cp_sync.nodes.periodic import run_periodic, wait_agents

    sync = tmp_path / "sync"
    stop = threading.Event()

    def on_phase(res: dict, load: Load) -> None:
        if res["phase"] == "p0001":
            stop_processes([agents.procs[1]])  # SIGTERM: it says bye, and the coordinator drops it
            assert len(list_agents(agents.address)) == 1
        elif res["phase"] == "p0002":
            agents.procs.append(_agent(agents.address, VIRTUAL[1]))
            deadline = time.monotonic() + 60
            while len(list_agents(agents.address)) < 2:
                assert time.monotonic() < deadline, "agent B did not come back"
                time.sleep(0.1)
        elif res["phase"] == "p0005":
            stop.set()  # then one final phase

    wait_agents(agents.address, 2, 60)  # the phases themselves wait only 0.5 s
    load = run_periodic(
        agents.address,
        sync,
        Schedule(every=0.5),
        stop=stop,
        on_phase=on_phase,
        rounds=10,
        expect=2,
        wait_s=0.5,
    )
    assert (load.phases, load.failed_phases, load.failed_pairs) == (6, 1, 0)
    assert len(load.errors) == 1 and load.errors[0].startswith("p0002: 1 agents registered"), load.errors
    assert sorted(_phases(sync)) == ["p0000", "p0001", "p0003", "p0004", "p0005", "p0006"]
    assert set(_phases(sync).values()) == {20}


def test_responder_reports_its_cpu() -> None:
    from cp_sync.probe.native import Responder, initiate

    r = Responder()
    assert r.cpu_ns() is None  # no thread yet
    with r:
        before = r.cpu_ns()
        assert isinstance(before, int) and before >= 0
        res = initiate(*r.address, 50, gap_us=100)
        assert len(res.seq) + res.lost == 50
        after = r.cpu_ns()
        # It answered (and busy-polled after each answer): its own thread's CPU clock moved.
        assert isinstance(after, int) and after > before
    assert r.cpu_ns() is None  # closed
