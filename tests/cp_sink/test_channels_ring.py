"""Channels that log into the ring: exact files from several writer threads and from a ring that
fills between drains, a closed channel refusing, the Python ring on the fallback clock, and the
exit flush of identity."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cp_sink.channels import open_channel, read_channel
from cp_sink.channels.channel import Channel

RING_HANDLERS = [("identity", {}), ("buffered", {"block": 4096})]


@pytest.mark.parametrize("fmt", ["bin", "csv"])
@pytest.mark.parametrize(("handler", "params"), RING_HANDLERS)
def test_a_ring_that_fills_between_drains_loses_nothing(tmp_path, monkeypatch, handler, params, fmt) -> None:
    monkeypatch.setattr(Channel, "ring_records", 16)  # full every 16 calls: the calls drain it
    path = tmp_path / f"spill.{fmt}"
    with open_channel("spill", handler, path=path, fmt=fmt, **params) as ch:
        for t in range(3000):
            ch.log(t)
        ch.log_batch(np.arange(3000, 5000))
        for t in range(5000, 6000):
            ch.log(t)
        st = ch.stats()
    f = read_channel(path)
    assert f.records["tuple_id"].to_pylist() == list(range(6000))
    assert np.all(np.diff(f.records["tsc"].to_numpy()) >= 0)
    assert (st["seen"], st["logged"], st["lost"], st["lost_ring_full"]) == (6000, 6000, 0, 0)
    assert st["written"] + st["buffered"] == 6000


@pytest.mark.parametrize(("handler", "params"), RING_HANDLERS)
def test_writers_in_several_threads(tmp_path, monkeypatch, handler, params) -> None:
    monkeypatch.setattr(Channel, "ring_records", 64)
    path = tmp_path / "threads.cpch"
    per, threads = 4000, 4
    ch = open_channel("threads", handler, path=path, **params)

    start = threading.Barrier(threads)

    def write(k: int) -> None:
        log = ch.log
        start.wait()
        for t in range(k * per, (k + 1) * per):
            log(t)
            if t % 8 == 0:
                time.sleep(0)  # gives up the GIL: the writers interleave every few records

    workers = [threading.Thread(target=write, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ch.close()
    st = ch.stats()
    ids = read_channel(path).records["tuple_id"].to_numpy()
    # Every id is in the file exactly once, or counted as a full-ring drop (3 refills in a row
    # by other threads while one drains: rare; the ledger says how many).
    assert st["seen"] == st["logged"] == per * threads
    assert st["written"] == ids.size == np.unique(ids).size
    assert st["written"] + st["lost_ring_full"] == per * threads and st["lost_write_error"] == 0
    for k in range(threads):  # each writer's ids in its own order
        mine = ids[(ids >= k * per) & (ids < (k + 1) * per)]
        assert np.all(np.diff(mine) > 0)
    assert np.count_nonzero(np.diff(ids // per)) > threads  # they did interleave


@pytest.mark.parametrize("handler", ["identity", "buffered", "downsample", "null"])
def test_a_closed_channel_refuses_log(tmp_path, handler) -> None:
    params = {"n": 2} if handler == "downsample" else {}
    ch = open_channel("closed", handler, path=tmp_path / "c.cpch", **params)
    ch.log(2)
    ch.log_batch(np.arange(4))
    ch.close()
    if handler == "null":  # counts only: nothing to refuse, nothing written
        assert ch.stats()["seen"] == 5
        return
    with pytest.raises(ValueError, match="channel closed is closed"):
        ch.log(4)
    assert ch.stats()["seen"] == 5 and read_channel(ch.path).records.num_rows == ch.stats()["written"]


def test_null_counts_calls_and_batches(tmp_path) -> None:
    with open_channel("null", "null", path=tmp_path / "n.cpch") as ch:
        for t in range(1000):
            ch.log(t)
        ch.log_batch(np.arange(500))
        ch.log_batch([])
    f = read_channel(ch.path)
    assert f.counts["seen"] == 1500 and f.records.num_rows == 0


def test_fallback_clock_rings_and_the_exit_flush(tmp_path: Path) -> None:
    # Without the C clock the ring is its Python twin, stamping with that clock's nanoseconds;
    # an identity channel left open has its ring and buffer flushed at exit.
    script = textwrap.dedent(
        """
        import sys, time
        import numpy as np
        import native_tsc
        from native_tsc import ring_python
        from cp_sink.channels import open_channel
        assert native_tsc.BACKEND == "fallback-monotonic-raw"
        for h in ("identity", "buffered"):
            ch = open_channel(h, h, path=f"{sys.argv[1]}/{h}.cpch")
            assert isinstance(ch._ring, ring_python.Ring)
            for t in range(1000):
                ch.log(t)
            ch.log_batch(np.arange(1000, 1500))
            ch.close()
        print(time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW))
        ch = open_channel("exit", "identity", path=f"{sys.argv[1]}/exit.cpch")
        for t in range(30_000):
            ch.log(t)  # no close(): the exit hook must flush
        """
    )
    env = {**os.environ, "CP_TSC_BACKEND": "fallback"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr.decode()
    end_ns = int(proc.stdout.split()[-1])
    for h in ("identity", "buffered"):
        f = read_channel(tmp_path / f"{h}.cpch")
        assert f.records["tuple_id"].to_pylist() == list(range(1500))
        tsc = f.records["tsc"].to_numpy()
        assert np.all(np.diff(tsc) >= 0) and 0 < tsc[0] <= tsc[-1] <= end_ns
    assert read_channel(tmp_path / "exit.cpch").records["tuple_id"].to_pylist() == list(range(30_000))
