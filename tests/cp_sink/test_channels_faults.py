"""Profiling channels when the disk fills: the error surfaces on the next call, the ledger is exact.

The full-disk tests mount a real 256 KiB tmpfs (root only; skipped with the reason
otherwise) and fill it through a channel at high volume; the healthy-disk tests
check the same ledger where nothing is lost.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from cp_sink.channels import ChannelWriteError, close_all, open_channel, read_channel, read_channel_bytes
from cp_sink.channels.channel import Channel
from cp_sink.channels.files import file_header
from tests.helpers.tmpfs import small_tmpfs

SMALL_FS = "256k"
CLOSE_TIMEOUT_S = 30.0
FILL_LIMIT = 8_000_000  # ids logged before giving up on filling the small filesystem
CHUNK = 8192

# handler -> (params, the ids it keeps)
Rule = Callable[[np.ndarray], np.ndarray]
HANDLERS: dict[str, tuple[dict[str, int], Rule]] = {
    "identity": ({}, lambda ids: ids),
    "buffered": ({"block": 4096}, lambda ids: ids),
    "downsample": ({"n": 2, "block": 4096}, lambda ids: ids[ids % 2 == 0]),
    "xoy": ({"x": 512, "y": 1024, "block": 4096}, lambda ids: ids[ids % 1024 < 512]),
}


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted afterwards."""
    with small_tmpfs(tmp_path / "small", SMALL_FS) as mnt:
        yield mnt


def _channel_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("cp-channel") and t.is_alive()}


def _close_within(ch: Channel, timeout: float = CLOSE_TIMEOUT_S) -> BaseException | None:
    """close() in a thread: fails the test if it hangs; returns what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            ch.close()
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run, name="test-close")
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"close() still running after {timeout} s"
    return raised[0] if raised else None


def _fill(ch: Channel, mode: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, OSError]:
    """Log random ids until a call raises.

    Returns (ids of the calls that returned, ids of the call that raised, the error).
    """
    done: list[np.ndarray] = []
    log, log_batch = ch.log, ch.log_batch  # kept in locals, as a hot loop does
    total = 0
    while total < FILL_LIMIT:
        ids = rng.integers(0, 2**62, size=CHUNK)  # random: compresses badly, fills fast
        if mode == "batch":
            try:
                log_batch(ids)
            except OSError as e:
                # the first batch may already not fit: a CSV line grows with the TSC's digits
                return (np.concatenate(done) if done else np.empty(0, np.int64)), ids, e
            done.append(ids)
        else:
            for k, t in enumerate(ids.tolist()):
                try:
                    log(t)
                except OSError as e:
                    done.append(ids[:k])
                    return np.concatenate(done), ids[k : k + 1], e
            done.append(ids)
        total += ids.size
    pytest.fail(f"the {SMALL_FS} filesystem never filled after {total} ids")


def _assert_names_the_problem(e: BaseException, ch: Channel) -> None:
    assert isinstance(e, ChannelWriteError), repr(e)
    assert e.errno == errno.ENOSPC
    assert str(ch.path) in str(e) and "No space left on device" in str(e) and ch.name in str(e)
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC


def _assert_balanced(st: dict) -> None:
    assert st["logged"] == st["written"] + st["buffered"] + st["lost"], st
    assert st["lost"] == st["lost_write_error"] + st["lost_not_int64"], st


@pytest.mark.parametrize("mode", ["log", "batch"])
@pytest.mark.parametrize("fmt", ["bin", "csv"])
@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_full_disk_is_reported_and_counted_exactly(small_fs, handler, fmt, mode) -> None:
    params, rule = HANDLERS[handler]
    path = small_fs / f"fill.{fmt}"
    before = _channel_threads()
    ch = open_channel(f"fill-{handler}", handler, path=path, fmt=fmt, **params)
    returned, failing, err = _fill(ch, mode, np.random.default_rng(7))
    _assert_names_the_problem(err, ch)
    # The channel stays refused: later calls raise too and take nothing.
    with pytest.raises(ChannelWriteError, match="No space left on device"):
        ch.log(1)
    with pytest.raises(ChannelWriteError, match="No space left on device"):
        ch.log_batch(np.arange(10))
    live = ch.stats()  # the error was raised already: stats() answers
    assert live["error"] and "No space left on device" in live["error"]
    _assert_balanced(live)
    assert _close_within(ch) is None  # already reported: close() neither hangs nor raises again
    st = ch.stats()
    f = read_channel(path)
    got = f.records["tuple_id"].to_numpy()
    _assert_balanced(st)
    assert st["buffered"] == 0 and st["lost_write_error"] > 0
    assert st["written"] == got.size  # exactly what the file holds
    assert st["synced"] == st["written"]
    kept_returned, kept_tried = rule(returned), rule(np.concatenate([returned, failing]))
    # A call that raised took nothing, except that identity's log_batch may have put a prefix in the file.
    if handler == "identity" and mode == "batch":
        assert kept_returned.size <= st["logged"] <= kept_tried.size
    else:
        assert st["logged"] == kept_returned.size
        assert st["seen"] == returned.size
    assert np.array_equal(got, kept_tried[: got.size])  # a prefix of what was logged, in order
    assert np.all(np.diff(f.records["tsc"].to_numpy()) >= 0)
    if f.complete:  # the counts frame found room after the cut-back: it must agree
        assert (f.counts["written"], f.counts["lost"]) == (st["written"], st["lost"])
    assert _channel_threads() <= before, "a channel thread outlived close()"


def test_stats_is_the_call_that_reports_a_background_failure(small_fs) -> None:
    path = small_fs / "stats.cpch"
    ch = open_channel("stats-first", "buffered", path=path, block=1 << 20)
    ch.log_batch(np.random.default_rng(3).integers(0, 2**62, size=200_000))  # one block, far over 256 KiB
    deadline = time.monotonic() + CLOSE_TIMEOUT_S
    while True:  # until the I/O thread has failed; before that, stats() answers
        try:
            st = ch.stats()
        except OSError as e:
            _assert_names_the_problem(e, ch)
            break
        _assert_balanced(st)
        assert time.monotonic() < deadline, f"no write error after {CLOSE_TIMEOUT_S} s: {st}"
        time.sleep(0.001)
    st = ch.stats()  # reported once: now it answers, with the error
    _assert_balanced(st)
    assert (st["written"], st["lost_write_error"], st["buffered"]) == (0, 200_000, 0)
    assert _close_within(ch) is None
    assert read_channel(path).records.num_rows == 0


def test_close_reports_a_failure_no_call_saw(small_fs) -> None:
    path = small_fs / "close.cpch"
    ch = open_channel("close-first", "buffered", path=path, block=1 << 20)
    ch.log_batch(np.random.default_rng(4).integers(0, 2**62, size=200_000))
    e = _close_within(ch)
    assert e is not None
    _assert_names_the_problem(e, ch)
    st = ch.stats()
    assert (st["logged"], st["written"], st["lost"]) == (200_000, 0, 200_000)
    assert _close_within(ch) is None  # idempotent, quiet the second time


def _fill_with_a_file(d: Path) -> None:
    with open(d / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC


# The counting handlers write a few hundred bytes at close, which fit in the slack of the
# tmpfs page their header already holds; a file-size limit (RLIMIT_FSIZE, in a child so
# pytest's own files are not limited) refuses them instead, with EFBIG.
LIMITED_CLOSE = textwrap.dedent(
    """
    import os, resource, signal, sys, orjson
    from cp_sink.channels import ChannelWriteError, open_channel, read_channel
    path, handler = sys.argv[1], sys.argv[2]
    ch = open_channel("late-" + handler, handler, path=path, **({"periodMs": 20} if handler == "pc" else {}))
    for i in range(1000):
        ch.log(i)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    size = os.path.getsize(path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        ch.close()
        err = None
    except ChannelWriteError as e:
        err = {"str": str(e), "errno": e.errno}
    f = read_channel(path)
    print(orjson.dumps({"err": err, "stats": ch.stats(), "rows": f.records.num_rows,
                        "complete": f.complete, "size": size}).decode())
    """
)


@pytest.mark.parametrize("handler", ["firstlast", "null", "pc"])
def test_a_refused_write_at_close_is_raised_by_close(tmp_path, handler) -> None:
    path = tmp_path / f"{handler}.cpch"
    r = subprocess.run(
        [sys.executable, "-c", LIMITED_CLOSE, str(path), handler],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out = orjson.loads(r.stdout.splitlines()[-1])
    err, st = out["err"], out["stats"]
    assert err is not None, out
    assert err["errno"] == errno.EFBIG and str(path) in err["str"] and "File too large" in err["str"]
    _assert_balanced(st)
    assert st["seen"] == 1000 and st["error"] == err["str"]
    assert st["written"] == out["rows"] == 0 and not out["complete"]
    assert path.stat().st_size == out["size"]  # nothing but whole writes: the header alone
    if handler == "firstlast":
        assert (st["logged"], st["lost_write_error"]) == (2, 2)


def test_full_disk_at_open_fails_the_open(small_fs) -> None:
    _fill_with_a_file(small_fs)
    path = small_fs / "open.cpch"
    with pytest.raises(ChannelWriteError, match="No space left on device") as info:
        open_channel("no-room", "buffered", path=path)
    assert str(path) in str(info.value)


def test_close_all_warns_with_the_error(small_fs) -> None:
    ch = open_channel("at-exit", "buffered", path=small_fs / "exit.cpch", block=1 << 20)
    ch.log_batch(np.random.default_rng(5).integers(0, 2**62, size=200_000))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        close_all()
    assert ch.closed
    assert any("No space left on device" in str(w.message) for w in caught), [str(w.message) for w in caught]


# ---- a healthy disk: the same ledger, nothing lost ---------------------------------------------------

N = 50_000


def _log_mixed(ch: Channel, ids: np.ndarray) -> None:
    for k in range(0, ids.size, 10_000):
        for t in ids[k : k + 5_000].tolist():
            ch.log(t)
        ch.log_batch(ids[k + 5_000 : k + 10_000])


@pytest.mark.parametrize("fmt", ["bin", "csv"])
@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_healthy_disk_counts_are_exact(tmp_path, handler, fmt) -> None:
    params, rule = HANDLERS[handler]
    path = tmp_path / f"ok.{fmt}"
    ids = np.random.default_rng(11).integers(0, 2**62, size=N)
    ch = open_channel(f"ok-{handler}", handler, path=path, fmt=fmt, **params)
    _log_mixed(ch, ids)
    live = ch.stats()
    _assert_balanced(live)
    assert live["lost"] == 0 and live["error"] is None and live["synced"] == 0
    assert live["logged"] == rule(ids).size and live["seen"] == N
    ch.close()
    st = ch.stats()
    f = read_channel(path)
    assert st["written"] == f.records.num_rows == rule(ids).size == st["logged"]
    assert (st["buffered"], st["lost"], st["synced"], st["seen"]) == (0, 0, st["written"], N)
    assert np.array_equal(f.records["tuple_id"].to_numpy(), rule(ids))
    if handler != "identity":  # identity has no counts frame: the file is the count
        assert f.complete and f.counts == {k: v for k, v in st.items() if k != "synced"}


@pytest.mark.parametrize("handler", ["firstlast", "null", "pc"])
def test_healthy_disk_counting_handlers(tmp_path, handler) -> None:
    path = tmp_path / f"{handler}.cpch"
    with open_channel(f"ok-{handler}", handler, path=path) as ch:
        _log_mixed(ch, np.arange(N, dtype=np.int64))
        _assert_balanced(ch.stats())
    st = ch.stats()
    f = read_channel(path)
    _assert_balanced(st)
    assert st["seen"] == N and st["written"] == f.records.num_rows == st["logged"]
    assert st["logged"] == (2 if handler == "firstlast" else 0) and st["synced"] == st["written"]


def test_csv_cut_inside_its_last_line_reads_whole_lines_only() -> None:
    data = b'# {"channel":"x"}\ntsc,tuple_id\n1,10\n2,20\n3,3'  # "3,3" may be the start of "3,30"
    f = read_channel_bytes(data)
    assert f.records["tuple_id"].to_pylist() == [10, 20]
    assert read_channel_bytes(file_header({"channel": "x"})).records.num_rows == 0
