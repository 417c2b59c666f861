"""The front end records a new sender at constant cost: a snapshot of the senders and an
append-only log of their changes (``cp_source.spool.front_records.FrontProgress``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

import cp_source.spool.front_records as fr
from cp_source.spool.front_records import FRONT_DIR, PROGRESS_FILE, FrontProgress, read_front_progress
from cp_source.wire import bucket as bk
from tests.helpers.hello_flood import flood, running_front

ROOT = Path(__file__).resolve().parents[3]


def _logs(spool: Path) -> list[str]:
    return sorted(p.name for p in (spool / FRONT_DIR).glob("progress.*.log"))


def test_a_hello_flood_costs_the_same_per_hello_up_to_20000_senders(ctx: zmq.Context, tmp_path: Path) -> None:
    """20,000 distinct senders say hello to a real front end: the cheapest block of 200 hellos among
    the last 2,000 costs less than 3x the cheapest among the first 2,000 (CPU time of this process,
    front end and sender; the cheapest block is the one least disturbed by other load). Rewriting
    every known sender per hello made the last ones cost 8x the first."""
    with running_front(ctx, str(tmp_path)) as fe:
        blocks = flood(ctx, fe.endpoint, 1, 20_000, 200)
        assert fe.counters["hellos"] == 20_000 and fe.counters["senders_unrecorded"] == 0
    cost = [b.cpu_s / b.hellos for b in blocks]
    early, late = min(cost[:10]), min(cost[-10:])
    assert late < 3 * early, f"per hello: {early * 1e6:.0f} us early, {late * 1e6:.0f} us late"
    assert set(read_front_progress(tmp_path)) == set(range(1, 20_001))
    # folded into a new snapshot at least once on the way, the old logs removed
    assert len(_logs(tmp_path)) == 1 and _logs(tmp_path) != ["progress.1.log"]


_FRONT_PROCESS = """
import sys, time, zmq
from tests.helpers.hello_flood import running_front
with running_front(zmq.Context(), sys.argv[1]) as fe:
    print(fe.endpoint, flush=True)
    time.sleep(120)
"""


def test_a_front_end_killed_after_acknowledging_keeps_every_acknowledged_sender(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    """SIGKILL right after the last acknowledgement: every acknowledged sender is on file, and a
    front end started again on the spool goes on from there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _FRONT_PROCESS, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        assert endpoint.startswith("tcp://"), endpoint
        flood(ctx, endpoint, 1, 3_000, 3_000)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert set(read_front_progress(tmp_path)) == set(range(1, 3_001))
    with running_front(ctx, str(tmp_path)) as fe:
        flood(ctx, fe.endpoint, 3_001, 100, 100)
    assert set(read_front_progress(tmp_path)) == set(range(1, 3_101))


def _hb(sender: int, seq: int, event_ms: int) -> bk.Header:
    return bk.Header(bk.KIND_HEARTBEAT, sender, seq, 0, 0, 0, 1, event_ms * 1_000_000, "d")


def test_a_torn_last_line_is_left_out_and_a_restart_never_appends_to_it(tmp_path: Path) -> None:
    d = tmp_path / FRONT_DIR
    d.mkdir()
    p = FrontProgress(d, durable=True)
    for sid in (1, 2, 3):
        p.hello(sid)
    p.maybe_write(force=True)
    p.heartbeat(_hb(2, 4, 700))
    p.maybe_write(force=True)
    p.close()
    log = d / _logs(tmp_path)[0]
    with open(log, "ab") as f:  # a line that does not validate, then one cut by a crash
        f.write(b'{"s": 5, "hello_wall": "soon"}\n{"s": 4, "hello_wall": 1.5, "heartb')
    got = read_front_progress(tmp_path)
    assert sorted(got) == [1, 2, 3] and got[2]["heartbeat"] == [4, 700]
    again = FrontProgress(d, durable=False)  # folds the log into a new snapshot and a fresh log
    assert log.name not in _logs(tmp_path) and len(_logs(tmp_path)) == 1
    again.hello(6)
    again.close()
    got = read_front_progress(tmp_path)
    assert sorted(got) == [1, 2, 3, 6] and got[2]["heartbeat"] == [4, 700]


def test_a_reader_never_misses_a_sender_while_the_log_is_folded_into_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the log folded as soon as it outgrows the snapshot, a reader reading all along sees the
    senders recorded so far: always 1..k, k never going back."""
    monkeypatch.setattr(fr, "LOG_MIN_BYTES", 0)
    d = tmp_path / FRONT_DIR
    d.mkdir()
    p = FrontProgress(d, durable=False)
    done = threading.Event()
    seen: list[int] = []
    wrong: list[list[int]] = []  # reads that were not 1..k (asserted in the test's own thread)

    read_once = threading.Event()  # the reader has read since the writer last paused

    def read() -> None:
        while not done.is_set():
            got = read_front_progress(tmp_path)
            if set(got) != set(range(1, len(got) + 1)):
                wrong.append(sorted(got))
            seen.append(len(got))
            read_once.set()

    reader = threading.Thread(target=read)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the reader runs between the writer's steps, a compaction's too
    try:
        reader.start()
        for sid in range(1, 3_001):
            p.hello(sid)
            p.write()
            if sid % 300 == 0:  # let the reader read at least once here: a loaded machine may starve it
                read_once.clear()
                assert read_once.wait(30)
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(switch)
    p.close()
    assert not wrong and seen == sorted(seen) and len(set(seen)) >= 5
    assert len(read_front_progress(tmp_path)) == 3_000
    assert int(_logs(tmp_path)[0].split(".")[1]) > 5  # folded several times
    snap = (d / PROGRESS_FILE).stat().st_size
    assert (d / _logs(tmp_path)[0]).stat().st_size <= snap + 100  # the log stays within the snapshot


def test_senders_past_the_cap_are_answered_counted_and_not_recorded(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fr, "MAX_GREETED", 5)
    with running_front(ctx, str(tmp_path)) as fe:
        flood(ctx, fe.endpoint, 1, 8, 8)  # every hello acknowledged
        assert fe.counters["senders_unrecorded"] == 3
    assert set(read_front_progress(tmp_path)) == {1, 2, 3, 4, 5}


def test_a_full_disk_loses_no_sender_once_it_has_room_again(tmp_path: Path) -> None:
    """On a real full disk (a small tmpfs) appends fail, cut short or not at all; the front end goes
    on, and once there is room the senders are all written (a new snapshot, never after a torn line)."""
    from tests.helpers.tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "mnt") as mnt:
        d = mnt / FRONT_DIR
        d.mkdir()
        p = FrontProgress(d, durable=False)
        for sid in range(1, 101):
            p.hello(sid)
        p.maybe_write(force=True)
        filler = mnt / "filler"
        # fill every free page: appends then fill the log's last page, one is cut short, then none lands
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 4096)
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        assert free < 4096, free
        for sid in range(101, 2_001):
            p.hello(sid)
            p.maybe_write(force=True)  # fails, and again only every SNAPSHOT_S
        filler.unlink()
        time.sleep(fr.SNAPSHOT_S)
        p.maybe_write(force=True)
        assert set(read_front_progress(mnt)) == set(range(1, 2_001))
        p.close()
        assert len(_logs(mnt)) == 1
