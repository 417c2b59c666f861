"""Faults, caused for real, each ending with the ledger: every id delivered once or counted with a reason.

A worker SIGKILLed mid-stream (restarted by the factory's supervisor), workers
that keep dying (the restart budget fails the factory), the factory process
SIGKILLed and started again on the same endpoint and spool, a spool on a
filesystem that fills up, a generator aimed at a port nobody listens on, and
a stale ``_reader.json`` of a dead reader. The reader's own faults (a foreign
checkpoint, a forged segment) are in test_reader_faults.py, the driver's
SIGKILL in test_restart.py and test_sink_ingest_restart.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from cloudprofiler.children import cli_argv, stop_processes
from cp_source.factory.supervisor import IPC_PREFIX, FactoryHandle, start_factory
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.reader.state import READER_STATE_FILE, live_reader_state, wait_reader_state
from cp_source.spool.segments import Spool
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import assert_ledger_balances, published_ids
from tests.helpers.polling import wait_for


class Generator(threading.Thread):
    """run_generator in a thread; ``result()`` returns its summary or raises its error."""

    def __init__(self, endpoint: str, **kw: Any) -> None:
        super().__init__(name="generator", daemon=True)
        self.endpoint, self.kw = endpoint, kw
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.summary = run_generator(self.endpoint, GeneratorSettings(**self.kw))
        except BaseException as e:
            self.error = e

    def result(self, timeout: float = 120.0) -> dict[str, Any]:
        self.join(timeout)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "the generator did not finish"
        return self.summary


def _senders(summary: dict[str, Any]) -> set[int]:
    return {int(s["id"]) for s in summary["senders"]}


# the `factory` fixture (tests/conftest.py): an external factory writing tmp_path/spool
pytestmark = pytest.mark.factory(workers=2, flush_ms=50)


def test_a_worker_killed_mid_stream_is_restarted_and_what_it_held_is_counted(factory: FactoryHandle) -> None:
    gen = Generator(factory.endpoint, rate=40_000, duration=3.0, senders=2, bucket=500)
    gen.start()
    sp = Spool(factory.spool)
    wait_for(lambda: sp.stats().rows > 20_000, 60, "the first segments")
    victim = factory.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: factory.worker_pids()[0] != victim, 30, "the supervisor to restart the worker")
    summary = gen.result()
    assert summary["eos_delivered"], "the factory acknowledged every end of stream"
    assert factory.wait_drained(60, senders=_senders(summary))
    assert factory.alive() and factory.failure is None
    assert [r[1] for r in factory.restarts] == [0]
    stats = sp.stats()
    totals = assert_ledger_balances(summary, stats, published_ids(factory.spool))
    assert totals["offered"] == 120_000 and totals["delivered"] > 0
    # the front end accepted every bucket sent: what the killed worker held is lost inside the factory
    assert all(not r["before_factory"] for r in stats.lost_reasons.values()), stats.lost_reasons


def test_workers_that_keep_dying_fail_the_factory_with_the_reason(factory: FactoryHandle) -> None:
    for k in range(4):
        victim = factory.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        if k < 3:
            wait_for(lambda v=victim: factory.worker_pids()[1] != v, 30, "a restart")
    wait_for(lambda: factory.failure is not None, 30, "the factory to give up")
    assert "restart budget" in (factory.failure or "") and "w1" in (factory.failure or "")
    assert not factory.alive()


def test_a_generator_aimed_at_a_closed_port_fails_with_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run(
        cli_argv("generate", "--endpoint", f"tcp://127.0.0.1:{port}", "--rate", "1000", "--duration", "1")
        + ["--wait-ready", "1", "--summary", str(tmp_path / "gen.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no factory answered" in lines[0], run.stderr
    assert not (tmp_path / "gen.json").exists(), "no summary that could pass for a clean run"


def test_a_stale_reader_state_is_never_taken_for_a_live_factory(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (spool / READER_STATE_FILE).write_bytes(
        orjson.dumps(
            {
                "pid": dead.pid,
                "start_ticks": 1,
                "run_id": "old",
                "factory": "embedded",
                "factory_endpoint": "tcp://127.0.0.1:1",
                "segment_server": None,
                "written_wall": 0.0,
            }
        )
    )
    assert live_reader_state(spool) is None
    with pytest.raises(TimeoutError, match="no live factory recorded in spool"):
        wait_reader_state(spool, timeout=0.5)
    from cloudprofiler.jobs.queries import user_target

    (tmp_path / "records").mkdir()
    with pytest.raises(ValueError, match="no running factory is recorded"):
        user_target(tmp_path / "records", spool=spool)


def _factory_process(endpoint: str, spool: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cli_argv(
            "factory", "--endpoint", endpoint, "--spool", str(spool), "--workers", "2", "--flush-ms", "50"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _wait_listening(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "factory listening on" in line, line


@pytest.mark.long
def test_the_factory_process_killed_and_started_again_on_its_spool(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    spool = tmp_path / "spool"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_factory_process(endpoint, spool))
        _wait_listening(procs[-1])
        gen = Generator(endpoint, rate=20_000, duration=6.0, senders=1, bucket=500)
        gen.start()
        wait_for(lambda: Spool(spool).stats().rows > 10_000, 60, "the first segments")
        os.killpg(procs[-1].pid, signal.SIGKILL)  # the factory and its workers, at once
        procs[-1].wait(30)
        killed_ipc = list(Path(tempfile.gettempdir()).glob(f"{IPC_PREFIX}{procs[-1].pid}-*"))
        assert killed_ipc, "a factory killed hard leaves its private socket directory behind"
        time.sleep(1.0)
        procs.append(_factory_process(endpoint, spool))
        _wait_listening(procs[-1])
        summary = gen.result()
        assert summary["eos_delivered"], "the restarted factory acknowledged the end of stream"
        wait_for(lambda: Spool(spool).drained(_senders(summary)), 60, "the restarted factory to drain")
        stats = Spool(spool).stats()
        totals = assert_ledger_balances(summary, stats, published_ids(spool))
        assert totals["delivered"] > 10_000 and totals["offered"] == 120_000
        assert not any(d.exists() for d in killed_ipc), "the dead factory's socket directory was swept"
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        stop_processes(procs)


def _take_and_commit(sp: Spool, seen: dict[tuple[str, int], np.ndarray]) -> None:
    """Read the ids of every published segment not read yet, then commit (delete) them."""
    from cp_source.spool.segments import read_segment

    latest = sp.latest()
    for w, upto in latest.items():
        for seg in sp.segments(w, -1, upto):
            if (w, seg.number) not in seen:
                # a copy: a view would keep the memory-mapped file, and its disk space, after the commit
                seen[(w, seg.number)] = read_segment(seg.path).column("tuple_id").to_numpy().copy()
    sp.commit(latest)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.long
def test_a_full_disk_pauses_the_factory_and_loses_nothing_it_accepted(tmp_path: Path) -> None:
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "12m"):
        pytest.skip("needs root and a tmpfs mount to fill a real filesystem")
    spool = disk / "spool"
    f = None
    try:
        f = start_factory("tcp://127.0.0.1:0", spool, workers=2, flush_ms=50)
        assert f.warnings and "less than the spool bound" in f.warnings[0]
        gen = Generator(f.endpoint, rate=60_000, duration=2.0, senders=1, bucket=500)
        gen.start()
        sp = Spool(spool)
        wait_for(
            lambda: any(s.counters.get("paused_reason") for s in sp.worker_states().values()),
            30,
            "a worker to pause on the full disk",
        )
        assert "write failed" in next(
            s.counters["paused_reason"]
            for s in sp.worker_states().values()
            if s.counters.get("paused_reason")
        )
        gen.join(2.5)  # the schedule is over; the end of stream waits for room to be recorded
        assert f.alive() and not f.restarts, "no worker died of the full disk"
        # make room as a reader's commits would: read what is published, commit it, repeat; the rows
        # the workers held through the full disk, then the end of stream, are written as room appears
        seen: dict[tuple[str, int], np.ndarray] = {}
        deadline = time.monotonic() + 90
        while (gen.is_alive() or not sp.drained(_senders(gen.result()))) and time.monotonic() < deadline:
            _take_and_commit(sp, seen)
            time.sleep(0.2)
        _take_and_commit(sp, seen)
        summary = gen.result()
        assert summary["eos_delivered"], "the end of stream was recorded once there was room"
        assert summary["dropped"] > 0, "a full disk is backpressure: the generator counts drops"
        assert sp.drained(_senders(summary))
        stats = sp.stats()
        delivered = np.sort(np.concatenate(list(seen.values())))
        totals = assert_ledger_balances(summary, stats, delivered)
        assert totals["lost"] == 0, "nothing the factory accepted is lost on a full disk"
    finally:
        if f is not None:
            f.stop()
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_stopped_factory_and_an_exited_process_leave_no_temp_files(tmp_path: Path) -> None:
    tmp = Path(tempfile.gettempdir())
    f = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=1)
    mine = list(tmp.glob(f"{IPC_PREFIX}{os.getpid()}-*"))
    assert mine, "the factory keeps its worker socket in a private directory"
    f.stop()
    assert not any(d.exists() for d in mine)
    # a process that exits without stopping its factory
    code = (
        "from cp_source.factory.supervisor import start_factory; import os; "
        f"start_factory('tcp://127.0.0.1:0', {str(tmp_path / 'spool2')!r}, workers=1); print(os.getpid())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip().splitlines()[-1]
    assert not list(tmp.glob(f"{IPC_PREFIX}{pid}-*"))


@pytest.mark.long
def test_a_query_fails_with_the_reason_when_factory_workers_keep_dying(spark: Any, tmp_path: Path) -> None:
    import cloudprofiler

    spool = tmp_path / "spool"
    query = (
        embedded_source(spark, spool, workers="2")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        cloudprofiler.wait_for_factory(str(spool), query)
        sp = Spool(spool)
        for _ in range(4):
            wait_for(lambda: sp.worker_states()["w1"].ready, 60, "worker w1 to run")
            victim = sp.worker_states()["w1"].pid
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            wait_for(
                lambda v=victim: sp.worker_states()["w1"].pid != v or not query.isActive,
                60,
                "a restart or the query's end",
            )
            if not query.isActive:
                break
        wait_for(lambda: not query.isActive, 60, "the query to fail")
        err = str(query.exception())
        assert "restart budget" in err and "w1" in err, err
    finally:
        if query.isActive:
            query.stop()


def test_the_segment_server_survives_a_failed_stats_write(tmp_path: Path) -> None:
    import pyarrow as pa

    from cp_source.hosts.segment_client import fetch_segment
    from cp_source.hosts.segment_protocol import SegmentRef
    from cp_source.hosts.segment_server import SegmentServer

    root = tmp_path / "spool"
    root.mkdir()
    seg = root / "w0-0.arrow"
    table = pa.table({"tuple_id": list(range(5))})
    with pa.OSFile(str(seg), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    ref = SegmentRef(str(seg), 5, seg.stat().st_size)
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")  # the stats file's directory is a file: every stats write fails
    server = SegmentServer(lambda w, n: ref, root, stats_path=blocker / "_stats.json")
    try:
        for _ in range(3):
            assert fetch_segment(server.endpoint, "w0", 0, timeout=10) == seg.read_bytes()
        # the server writes its stats after each reply: the third write may still be on its way
        wait_for(lambda: server.stats()["stats_write_errors"] == 3, 10, "the third failed stats write")
        assert server.stats()["segments_served"] == 3
    finally:
        server.stop()
