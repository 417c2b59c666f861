"""Profiling channels: each handler's file holds exactly what its rule says; nothing logged is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cp_sink.channels import (
    CHANNEL_HANDLERS,
    open_channel,
    parse_channel_handler,
    read_channel,
    read_channel_bytes,
)
from cp_sink.channels.files import encode_columns, file_header, narrow_deltas, narrow_runs
from cp_sink.channels.registry import FAMILIES
from tests.helpers.polling import wait_for

N = 20_000


def _log_known_sequence(ch) -> list[int]:
    """Ids 0..N-1: single calls, a batch, single calls again (the order a reader must see)."""
    for i in range(0, 7_000):
        ch.log(i)
    ch.log_batch(np.arange(7_000, 15_000, dtype=np.int64))
    for i in range(15_000, N):
        ch.log(i)
    return list(range(N))


@pytest.mark.parametrize("fmt", ["bin", "csv"])
@pytest.mark.parametrize(
    ("handler", "params", "rule"),
    [
        ("identity", {}, lambda ids: ids),
        ("buffered", {"block": 1000}, lambda ids: ids),
        ("downsample", {"n": 7, "block": 500}, lambda ids: [t for t in ids if t % 7 == 0]),
        ("xoy", {"x": 2, "y": 1024}, lambda ids: [t for t in ids if t % 1024 < 2]),
        ("firstlast", {}, lambda ids: [ids[0], ids[-1]]),
        ("null", {}, lambda ids: []),
    ],
)
def test_handler_output_is_exactly_its_rule(tmp_path, fmt, handler, params, rule) -> None:
    path = tmp_path / f"{handler}.{fmt}"
    with open_channel(f"t-{handler}", handler, path=path, fmt=fmt, **params) as ch:
        ids = _log_known_sequence(ch)
    f = read_channel(path)
    assert f.records["tuple_id"].to_pylist() == rule(ids)
    tsc = f.records["tsc"].to_numpy()
    assert np.all(np.diff(tsc) >= 0)  # stamps in logging order
    assert f.header["channel"] == f"t-{handler}"
    if handler != "identity":
        assert f.complete
        assert f.counts["seen"] == N
        assert f.counts["written"] == len(rule(ids))
    if handler == "firstlast":
        assert (f.counts["first_tuple_id"], f.counts["last_tuple_id"]) == (0, N - 1)


def test_periodic_counter_counts_sum_to_total(tmp_path) -> None:
    path = tmp_path / "pc.cpch"
    with open_channel("t-pc", "pc", path=path, periodMs=20) as ch:
        total = 0
        for k in range(6):
            for i in range(1000 * k):
                ch.log(i)
            ch.log_batch(np.arange(500))
            total += 1000 * k + 500
            time.sleep(0.03)
    f = read_channel(path)
    counts = f.periods["count"].to_pylist()
    assert sum(counts) == total == f.counts["seen"]
    assert len(counts) >= 6  # the sampling thread closed periods while we logged
    assert f.periods["period"].to_pylist() == list(range(len(counts)))
    assert f.records.num_rows == 0


def test_buffered_many_blocks_in_order(tmp_path) -> None:
    path = tmp_path / "many.cpch"
    ids = np.random.default_rng(7).integers(-(2**62), 2**62, size=300_000)
    with open_channel("t-many", "buffered", path=path, block=4096) as ch:
        for k in range(0, ids.size, 10_000):
            ch.log_batch(ids[k : k + 5_000])
            for t in ids[k + 5_000 : k + 10_000].tolist():
                ch.log(t)
    got = read_channel(path).records["tuple_id"].to_numpy()
    assert np.array_equal(got, ids)


def test_every_handler_has_a_family() -> None:
    assert set(FAMILIES) == set(CHANNEL_HANDLERS)
    assert parse_channel_handler("ID") == ("identity", {})


def test_bad_channel_settings(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown channel handler"):
        parse_channel_handler("bogus")
    with pytest.raises(ValueError, match="block"):
        parse_channel_handler("buffered", {"block": 0})
    with pytest.raises(ValueError, match="format"):
        open_channel("x", "null", path=tmp_path / "x", fmt="xml")
    with pytest.raises(ValueError, match="not a cloudprofiler channel"):
        (tmp_path / "junk").write_bytes(b"hello")
        read_channel(tmp_path / "junk")


CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    from cp_sink.channels import open_channel
    path, progress, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    ch = open_channel("child", "buffered", path=path, block=1 << 20)
    out = open(progress, "w")
    k = 0
    while True:
        if (k // 1000) % 5 == 4:
            ch.log_batch(np.arange(k, k + 1000))
        else:
            for i in range(k, k + 1000):
                ch.log(i)
        k += 1000
        out.write(f"{k}\\n"); out.flush()
        if mode == "exit" and k >= 50_000:
            break  # no close(): the atexit hook must flush
    """
)


def _child(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path, progress = tmp_path / "child.cpch", tmp_path / "progress"
    progress.write_text("")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), str(progress), mode], stderr=subprocess.PIPE
    )
    return proc, path, progress


def _logged(progress: Path) -> int:
    lines = progress.read_text().split()
    return int(lines[-1]) if lines else 0


def test_sigterm_flushes_every_logged_id(tmp_path) -> None:
    proc, path, progress = _child(tmp_path, "forever")
    try:
        wait_for(lambda: _logged(progress) >= 200_000 or proc.poll() is not None, 60, "the child to log")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reported = _logged(progress)  # every id below this was logged before the signal
    assert proc.returncode == -signal.SIGTERM
    f = read_channel(path)
    ids = f.records["tuple_id"].to_numpy()
    assert f.complete
    assert ids.size >= reported
    assert np.array_equal(ids, np.arange(ids.size))
    assert f.counts["seen"] == ids.size


def test_atexit_flushes_an_unclosed_channel(tmp_path) -> None:
    proc, path, _ = _child(tmp_path, "exit")
    proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    f = read_channel(path)
    assert f.complete
    assert np.array_equal(f.records["tuple_id"].to_numpy(), np.arange(50_000))


def test_default_path_uses_channel_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CP_CHANNEL_DIR", str(tmp_path))
    with open_channel("dir/test", "firstlast") as ch:
        ch.log(3)
    assert ch.path == tmp_path / f"dir_test-{os.getpid()}.cpch"
    assert read_channel(ch.path).records["tuple_id"].to_pylist() == [3]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(min_value=0, max_value=6)
        ),
        min_size=1,
        max_size=6,
    ).filter(lambda runs: sum(n for _, n in runs) > 0)
)
def test_run_encoding_equals_delta_encoding_and_round_trips(runs) -> None:
    values, lengths = [v for v, _ in runs], [n for _, n in runs]
    col = np.concatenate([np.full(n, v, np.int64) for v, n in runs])
    assert narrow_runs(values, lengths) == narrow_deltas(col)
    ids = np.arange(col.size, dtype=np.int64) * 3 - 7
    f = read_channel_bytes(file_header({"channel": "x"}) + encode_columns(b"R", [col, ids]))
    assert f.records["tsc"].to_pylist() == col.tolist()
    assert f.records["tuple_id"].to_pylist() == ids.tolist()


def test_reader_stops_cleanly_at_a_frame_cut_short(tmp_path) -> None:
    path = tmp_path / "cut.cpch"
    with open_channel("cut", "buffered", path=path, block=1000) as ch:
        ch.log_batch(np.arange(1000))
        ch.log_batch(np.arange(1000, 2000))
    data = path.read_bytes()
    whole = read_channel_bytes(data)
    assert whole.complete and whole.records.num_rows == 2000
    cut = read_channel_bytes(data[:-40])  # inside the counts frame: both record frames survive
    assert not cut.complete and cut.records["tuple_id"].to_pylist() == list(range(2000))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_after_the_header_is_refused_or_ignored(junk: bytes) -> None:
    data = file_header({"channel": "x"}) + junk
    try:
        f = read_channel_bytes(data)
    except ValueError:
        return
    assert f.records.num_rows <= len(junk)


def test_ids_outside_int64_are_refused_and_the_rest_kept(tmp_path) -> None:
    path = tmp_path / "bad.cpch"
    ch = open_channel("bad", "buffered", path=path)
    for t in (1, 2, 2**70, 3):
        ch.log(t)
    with pytest.raises(ValueError, match="int64"):
        ch.close()
    f = read_channel(path)
    assert f.records["tuple_id"].to_pylist() == [1, 2, 3]
    assert f.counts["lost_not_int64"] == 1 and f.counts["seen"] == 4 and f.counts["written"] == 3
    assert f.counts["logged"] == f.counts["written"] + f.counts["lost"]
