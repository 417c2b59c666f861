"""Event times (schedule clock, lag, jitter) and heartbeats from the generator, through a real factory."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import zmq

from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.events import EventSettings, schedule_event_ms
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.front_records import FRONT_DIR, PROGRESS_FILE, FrontProgress, read_front_progress
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import open_link
from cp_source.wire.workloads import ysb_fields

START_MS = 1_700_000_000_000
WAIT_S = 60.0  # generous: the machine is shared


def _spool_table(f: FactoryHandle, summary: dict[str, Any]) -> pa.Table:
    """Every published tuple of the run (tuple id, event time ms, payload fields), sorted by tuple id."""
    deadline = time.monotonic() + WAIT_S
    sp = Spool(f.spool)
    while not sp.drained({int(s["id"]) for s in summary["senders"]}):
        assert time.monotonic() < deadline, "the factory did not publish the run in time"
        time.sleep(0.05)
    cols = ["tuple_id", "event_time", *(fl.name for fl in ysb_fields())]
    parts = [
        read_segment(seg.path).select(cols)
        for w, upto in sp.latest().items()
        for seg in sp.segments(w, -1, upto)
    ]
    t = pa.concat_tables(parts).sort_by("tuple_id")
    ms = pc.divide(t.column("event_time").cast(pa.int64()), 1000)
    return t.set_column(1, "event_ms", ms)


def _truth(summary: dict[str, Any], lag: float, jitter: float) -> tuple[np.ndarray, np.ndarray]:
    """Tuple ids and event times (ms) every tuple must carry, from schedule_event_ms and the shares."""
    senders, bucket = len(summary["senders"]), summary["bucket"]
    ids, evs = [], []
    for i, s in enumerate(summary["senders"]):
        n = s["next_tuple_id"] - s["first_tuple_id"]
        n_buckets = math.ceil(n / bucket)
        ev = schedule_event_ms(
            summary["event_start_ms"],
            summary["target_rate"] / senders,
            bucket,
            n_buckets,
            i,
            s["id"],
            lag,
            jitter,
        )
        assert (s["event_ms_first"], s["event_ms_last"]) == (int(ev[0]), int(ev[-1]))
        ids.append(np.arange(s["first_tuple_id"], s["next_tuple_id"], dtype=np.int64))
        evs.append(np.repeat(ev, bucket)[:n])
    return np.concatenate(ids), np.concatenate(evs)


def _by_sender(t: pa.Table, sender: int) -> np.ndarray:
    """Event times (ms) of one sender's tuples in tuple-id order."""
    ids = t.column("tuple_id").to_numpy()
    return t.column("event_ms").to_numpy()[(ids >> bk.SEQ_BITS) == sender]


def test_schedule_event_ms_is_the_documented_formula() -> None:
    # the formula written out independently: base from the schedule, lag, a seeded jitter, then max()
    rate, bucket, n, index, sid, lag, jit = 333.0, 7, 400, 2, 4242, 12.5, 40.0
    rnd = random.Random(sid)
    want, prev, held = [], -(1 << 62), 0
    for k in range(n):
        e = math.floor(START_MS + math.floor(k * bucket / rate * 1000) - index * lag - rnd.random() * jit)
        held += e < prev
        prev = max(prev, e)
        want.append(prev)
    got = schedule_event_ms(START_MS, rate, bucket, n, index, sid, lag, jit)
    assert got.dtype == np.int64 and got.tolist() == want
    assert (np.diff(got) >= 0).all()
    assert held > 0  # jitter (40 ms) above the bucket period (21 ms): the max() held some buckets
    assert got.tolist() != schedule_event_ms(START_MS, rate, bucket, n, index, sid + 1, lag, jit).tolist()
    assert schedule_event_ms(START_MS, rate, bucket, 0, 0, sid).tolist() == []


def test_the_schedule_clock_gives_identical_tuples_in_every_run(
    factories: Callable[..., FactoryHandle],
) -> None:
    # 2001 tuples: shares 1001 and 1000, buckets of 30 with a partial last one
    args: dict[str, Any] = {
        "rate": 4002.0,
        "duration": 0.5,
        "senders": 2,
        "bucket": 30,
        "sender_base": 4096,
        "event_start_ms": START_MS,
        "event_lag_ms": 7.0,
        "event_jitter_ms": 45.5,
    }
    tables = []
    for _ in range(2):
        f = factories(workers=1)
        s = run_generator(f.endpoint, GeneratorSettings(**args))
        assert s["offered"] == 2001 and s["dropped"] == 0, s
        assert (s["event_start_ms"], s["event_lag_ms"], s["event_jitter_ms"]) == (START_MS, 7.0, 45.5)
        tables.append(_spool_table(f, s))
    assert tables[0].equals(tables[1])
    ids, ev = _truth(s, 7.0, 45.5)
    assert tables[0].column("tuple_id").to_numpy().tolist() == ids.tolist()
    assert tables[0].column("event_ms").to_numpy().tolist() == ev.tolist()
    for sid in (4096, 4097):
        assert (np.diff(_by_sender(tables[0], sid)) >= 0).all()


def test_sender_i_lags_i_times_the_lag_on_the_schedule_clock(factories: Callable[..., FactoryHandle]) -> None:
    f = factories(workers=1)
    s = run_generator(
        f.endpoint,
        GeneratorSettings(
            rate=2000,
            duration=0.5,
            senders=2,
            bucket=25,
            sender_base=8192,
            event_start_ms=START_MS,
            event_lag_ms=250,
            heartbeat_ms=0,
        ),
    )
    t = _spool_table(f, s)
    ev0, ev1 = _by_sender(t, 8192), _by_sender(t, 8193)
    assert len(ev0) == len(ev1) == 500
    assert (ev0 - ev1).tolist() == [250] * 500
    assert ev0[0] == START_MS and ev0[-1] == START_MS + 475  # bucket 19: 19 x 25 ms


def test_wall_clock_event_times_never_decrease_and_lag_per_sender(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    before = time.time_ns() // 1_000_000
    s = run_generator(
        f.endpoint,
        GeneratorSettings(
            rate=2000, duration=1.0, senders=2, bucket=20, event_lag_ms=300, event_jitter_ms=20
        ),
    )
    after = time.time_ns() // 1_000_000
    t = _spool_table(f, s)
    base = s["sender_base"]
    ev0, ev1 = _by_sender(t, base), _by_sender(t, base + 1)
    assert len(ev0) == len(ev1) == 1000
    for ev, lag in ((ev0, 0), (ev1, 300)):
        assert (np.diff(ev) >= 0).all()
        assert before - lag - 20 <= ev[0] and ev[-1] <= after - lag
    # the two processes send bucket k at about the same time: 300 ms apart, give or take the jitter
    # and a loaded machine's scheduling
    per_bucket = ev0[::20] - ev1[::20]
    assert 200 <= float(np.median(per_bucket)) <= 400, per_bucket


def _watch_progress(spool: Path, stop: threading.Event, seen: list[tuple[int, int]]) -> None:
    """Every distinct heartbeat the progress file showed while the run went on."""
    while not stop.is_set():
        for p in read_front_progress(spool).values():
            hb = p["heartbeat"]
            if hb is not None and (not seen or seen[-1] != tuple(hb)):
                seen.append(tuple(hb))
        time.sleep(0.02)


def test_a_slow_sender_sends_heartbeats_with_the_next_buckets_event_time(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    stop, seen = threading.Event(), list[tuple[int, int]]()
    watcher = threading.Thread(target=_watch_progress, args=(f.spool, stop, seen))
    watcher.start()
    hello_before = time.time()
    try:
        # 4 buckets, 500 ms apart: a heartbeat every 100 ms while a wait has more than 100 ms left
        s = run_generator(
            f.endpoint,
            GeneratorSettings(rate=20, duration=2.0, bucket=10, sender_base=300, event_start_ms=START_MS),
        )
    finally:
        time.sleep(3 * 0.2)  # the front end's snapshot interval
        stop.set()
        watcher.join()
    sender = s["senders"][0]
    assert s["heartbeats"] == sender["heartbeats"] >= 1
    assert f.front_counters()["heartbeats"] == s["heartbeats"]  # each one reached the front end
    ev = schedule_event_ms(START_MS, 20, 10, 4, 0, 300)
    assert ev.tolist() == [START_MS, START_MS + 500, START_MS + 1000, START_MS + 1500]
    prog = read_front_progress(f.spool)
    assert set(prog) == {300}
    assert hello_before <= prog[300]["hello_wall"] <= time.time()
    q, hb_ms = prog[300]["heartbeat"]
    # sent while waiting for bucket q: q buckets were out, and bucket q's event time is exact
    assert 1 <= q < sender["buckets_sent"] == 4 and hb_ms == ev[q]
    assert seen and all(1 <= sq < 4 and e == ev[sq] for sq, e in seen)
    assert seen == sorted(seen)  # never moved back


def test_wall_clock_heartbeats_bound_the_event_times_still_to_come(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    s = run_generator(
        f.endpoint,
        GeneratorSettings(
            rate=20, duration=2.0, bucket=10, sender_base=600, event_lag_ms=40, event_jitter_ms=30
        ),
    )
    t = _spool_table(f, s)
    bucket_ev = _by_sender(t, 600)[::10]
    assert len(bucket_ev) == 4 and (np.diff(bucket_ev) >= 0).all()
    q, hb_ms = read_front_progress(f.spool)[600]["heartbeat"]
    assert 1 <= q < 4
    assert bucket_ev[q - 1] <= hb_ms <= bucket_ev[q]
    assert (
        s["senders"][0]["event_ms_first"] == bucket_ev[0]
        and s["senders"][0]["event_ms_last"] == bucket_ev[-1]
    )


def test_heartbeat_ms_zero_sends_none(factories: Callable[..., FactoryHandle]) -> None:
    f = factories(workers=1)
    # the waits that would carry heartbeats (see the test above), with heartbeats off
    s = run_generator(f.endpoint, GeneratorSettings(rate=20, duration=2.0, bucket=10, heartbeat_ms=0))
    time.sleep(3 * 0.2)
    assert s["heartbeats"] == 0 and s["heartbeat_ms"] == 0 and s["senders"][0]["buckets_sent"] == 4
    assert f.front_counters()["heartbeats"] == 0
    prog = read_front_progress(f.spool)
    assert set(prog) == {s["sender_base"]}
    assert prog[s["sender_base"]]["heartbeat"] is None
    assert isinstance(prog[s["sender_base"]]["hello_wall"], float)


def _hb(sender: int, seq: int, event_ms: int) -> bk.Header:
    return bk.Header(bk.KIND_HEARTBEAT, sender, seq, 0, 0, 0, 1, event_ms * 1_000_000, "d")


def test_front_progress_never_moves_a_heartbeat_back_and_survives_a_restart(tmp_path: Path) -> None:
    d = tmp_path / FRONT_DIR
    d.mkdir()
    p = FrontProgress(d, durable=True)
    p.heartbeat(_hb(5, 3, 100))  # no hello: not a sender of this spool
    p.hello(5)
    hello = p.senders[5]["hello_wall"]
    p.hello(5)  # the first hello's time stays
    for seq, ms in ((3, 100), (4, 90), (2, 500), (4, 80)):
        p.heartbeat(_hb(5, seq, ms))
    p.maybe_write(force=True)
    assert p.ignored == 1
    got = read_front_progress(tmp_path)
    assert got[5]["heartbeat"] == [4, 90] and got[5]["hello_wall"] == hello
    assert isinstance(got[5]["heartbeat_wall"], float)
    again = FrontProgress(d, durable=False)  # a restarted front end keeps what it had recorded
    assert again.senders[5]["heartbeat"] == [4, 90] and again.senders[5]["hello_wall"] == hello


def test_read_front_progress_tolerates_missing_torn_and_malformed_files(tmp_path: Path) -> None:
    assert read_front_progress(tmp_path) == {}
    path = tmp_path / FRONT_DIR / PROGRESS_FILE
    path.parent.mkdir()
    path.write_bytes(b'{"1": {"hello_wall": 1.5, "heartb')
    assert read_front_progress(tmp_path) == {}
    path.write_bytes(b"[1, 2]")
    assert read_front_progress(tmp_path) == {}
    doc = {
        "1": {"hello_wall": 1.5, "heartbeat": None},
        "2": {"hello_wall": 2, "heartbeat": [3, 1700]},
        "3": {"hello_wall": "soon", "heartbeat": None},
        "4": {"hello_wall": 1.0, "heartbeat": [1.5, 3]},
        "5": {"hello_wall": 1.0, "heartbeat": [1, 2, 3]},
        "6": {"heartbeat": None},
        "7": [1, 2],
        "x": {"hello_wall": 1.0, "heartbeat": None},
        str(bk.MAX_SENDER + 1): {"hello_wall": 1.0, "heartbeat": None},
        "8": {"hello_wall": True, "heartbeat": None},
        "9": {"hello_wall": 1.0, "heartbeat": [-1, 3]},
        "10": {"hello_wall": 1.0, "heartbeat": [True, 3]},
    }
    path.write_bytes(orjson.dumps(doc))
    assert read_front_progress(tmp_path) == {
        1: {"hello_wall": 1.5, "heartbeat": None},
        2: {"hello_wall": 2.0, "heartbeat": [3, 1700]},
    }


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--event-lag-ms", "-1", "--event-lag-ms must be"),
        ("--event-jitter-ms", "abc", "--event-jitter-ms: not a number"),
        ("--event-jitter-ms", "inf", "--event-jitter-ms must be"),
        ("--heartbeat-ms", "0.5", "--heartbeat-ms must be 0 (off) or at least 1"),
        ("--event-start-ms", "1.5", "--event-start-ms: not a whole number"),
        ("--event-start-ms", "-3", "--event-start-ms must be an integer"),
    ],
)
def test_bad_event_options_are_one_line_errors(option: str, value: str, message: str) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloudprofiler.cli",
            "generate",
            "--rate",
            "10",
            "--duration",
            "1",
            "--endpoint",
            "tcp://127.0.0.1:1",
            option,
            value,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_bad_event_settings_are_rejected_before_any_sender_starts() -> None:
    with pytest.raises(ValueError, match="event_jitter_ms"):
        run_generator(
            "tcp://127.0.0.1:1", GeneratorSettings(rate=10, duration=1, event_jitter_ms=float("nan"))
        )
    with pytest.raises(ValueError, match="event_start_ms"):
        run_generator("tcp://127.0.0.1:1", GeneratorSettings(rate=10, duration=1, event_start_ms=1.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="heartbeat_ms"):
        EventSettings(heartbeat_ms=-1).check()


def test_generate_help_lists_the_event_options() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "cloudprofiler.cli", "generate", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0
    for opt in ("--event-lag-ms", "--event-jitter-ms", "--event-start-ms", "--heartbeat-ms", "--sender-base"):
        assert opt in r.stdout


def test_a_heartbeat_past_the_seq_window_does_not_pin_a_senders_progress(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    packer = bk.HeaderPacker(77, "test-domain")
    ctx: zmq.Context[Any] = zmq.Context()
    sock, _ = open_link(ctx, f.endpoint, packer, 16, WAIT_S)
    try:
        for seq, ms in ((10, 5), (bk.SEQ_WINDOW + 1, 9), (11, 6)):
            sock.send_multipart([bytes(packer.pack(bk.KIND_HEARTBEAT, seq, 0, 0, 0, 1, ms * 1_000_000)), b""])
        deadline = time.monotonic() + WAIT_S
        while read_front_progress(f.spool).get(77, {}).get("heartbeat") != [11, 6]:
            assert time.monotonic() < deadline, read_front_progress(f.spool)
            time.sleep(0.05)
        assert f.front_counters()["heartbeats"] == 3
    finally:
        sock.close(0)
        ctx.term()
