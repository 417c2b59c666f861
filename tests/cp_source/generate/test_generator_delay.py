"""Injected network delay in the generator (``delay=``, ``--delay``), through a real factory."""

from __future__ import annotations

import bisect
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
import pytest
import zmq

import native_tsc
from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.delay import MAX_HELD_BUCKETS, ZIPF_RANKS, draw_delays_ms, parse_delay
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.ledger import read_records
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import answer_control
from tests.helpers.ingest_truth import assert_ledger_balances, published_ids

START_MS = 1_700_000_000_000
WAIT_S = 60.0  # generous: the machine is shared
# TSC ticks are converted with a calibrated frequency, and the loop times the hold with
# CLOCK_MONOTONIC (which NTP may slew by up to 500 ppm): a relative 1e-3 and 5 us absorb both.
REL_TOL, ABS_TOL_MS = 1e-3, 0.005


def _spool_table(f: FactoryHandle, summary: dict[str, Any]) -> pa.Table:
    """Every published tuple (id, gen and factory TSC stamps, event time), sorted by tuple id."""
    deadline = time.monotonic() + WAIT_S
    sp = Spool(f.spool)
    while not sp.drained({int(s["id"]) for s in summary["senders"]}):
        assert time.monotonic() < deadline, "the factory did not publish the run in time"
        time.sleep(0.05)
    cols = ["tuple_id", "cp_tsc_gen", "cp_tsc_factory", "event_time"]
    parts = [
        read_segment(seg.path).select(cols)
        for w, upto in sp.latest().items()
        for seg in sp.segments(w, -1, upto)
    ]
    return pa.concat_tables(parts).sort_by("tuple_id")


def _bucket_records(f: FactoryHandle) -> np.ndarray:
    """(sender, seq, first_id, count) of every published bucket, one worker's, in publication order."""
    sp = Spool(f.spool)
    (worker,) = sp.workers()
    return read_records(Path(f.spool) / worker / "buckets.bin")[:, 1:5]


# -- the distributions, written out independently of the generator --------------------------------


def _want(kind: str, a: float, b: float, seed: int, n: int) -> list[float]:
    rnd = random.Random(seed)
    out: list[float] = []
    if kind == "zipf":
        w = [k**-a for k in range(1, ZIPF_RANKS + 1)]
        cdf = list(np.cumsum(w) / math.fsum(w))
    while len(out) < n:
        if kind == "uniform":
            out.append(a + (b - a) * rnd.random())
        elif kind == "zipf":
            rank = min(bisect.bisect_right(cdf, rnd.random()), ZIPF_RANKS - 1) + 1
            out.append(rank * b / ZIPF_RANKS)
        else:
            d = rnd.normalvariate(a, b) if kind == "normal" else rnd.expovariate(1 / a)
            top = a + 6 * b if kind == "normal" else 20 * a
            if 0 <= d <= top:  # out-of-range draws are redrawn
                out.append(d)
    return out


@pytest.mark.parametrize(
    ("spec", "kind", "a", "b"),
    [
        ("normal:50,10", "normal", 50.0, 10.0),
        ("normal:5,10", "normal", 5.0, 10.0),  # a third of the draws below 0: redrawn
        ("exp:20", "exp", 20.0, 0.0),
        ("uniform:10,30", "uniform", 10.0, 30.0),
        ("zipf:0.99,200", "zipf", 0.99, 200.0),
    ],
)
def test_draw_delays_ms_is_the_documented_distribution(spec: str, kind: str, a: float, b: float) -> None:
    got = draw_delays_ms(spec, 77, 5000)
    want = _want(kind, a, b, 77, 5000)
    assert got.dtype == np.float64 and np.allclose(got, want, rtol=1e-12, atol=0)
    assert (got >= 0).all() and got.max() <= parse_delay(spec).max_ms
    assert not np.array_equal(got, draw_delays_ms(spec, 78, 5000))
    assert draw_delays_ms(spec, 77, 0).tolist() == []


def test_the_distributions_have_their_shape() -> None:
    n = 20_000
    normal = draw_delays_ms("normal:5,10", 1, n)
    # N(5, 10) kept on [0, 65]: the median is where Phi((x - 5) / 10) = 0.3085 + 0.6915 / 2, x = 8.96
    assert normal.min() >= 0 and abs(float(np.median(normal)) - 8.96) < 0.4
    assert abs(float(draw_delays_ms("exp:20", 1, n).mean()) - 20.0) < 0.6
    z = draw_delays_ms("zipf:0.99,1000", 1, n)  # rank = delay in ms
    ranks = np.rint(z).astype(np.int64)
    assert np.allclose(z, ranks) and ranks.min() >= 1 and ranks.max() <= 1000
    h = sum(k**-0.99 for k in range(1, 1001))
    for k in (1, 2, 10):  # P(rank k) = k**-0.99 / H
        assert abs(float((ranks == k).mean()) - k**-0.99 / h) < 0.01
    assert draw_delays_ms("uniform:7,7", 3, 10).tolist() == [7.0] * 10
    assert draw_delays_ms("zipf:0,0", 3, 4).tolist() == [0.0] * 4


# -- through a real factory ----------------------------------------------------------------------


def _measured_ms(t: pa.Table, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket (every ``bucket``-th tuple in id order): factory stamp minus gen stamp (ms), event ms."""
    gen = t.column("cp_tsc_gen").to_numpy()[::bucket]
    fac = t.column("cp_tsc_factory").to_numpy()[::bucket]
    ev = t.column("event_time").cast(pa.int64()).to_numpy()[::bucket] // 1000
    return (fac - gen) / native_tsc.frequency_hz() * 1e3, ev


@pytest.mark.long  # four factories and runs: about 20 s
@pytest.mark.parametrize(
    ("spec", "seed"),
    [("normal:50,10", 42), ("exp:20", None), ("zipf:0.99,300", 5), ("uniform:0,80", None)],
)
def test_each_bucket_arrives_at_least_its_drawn_delay_late_and_none_is_lost(
    factories: Callable[..., FactoryHandle], spec: str, seed: int | None
) -> None:
    f = factories(workers=1)
    # 300 buckets of 10 tuples, 10 ms apart; a send queue that holds them all, so a factory stalled
    # by a loaded machine delays a bucket (which the bound below allows) rather than dropping it
    s = run_generator(
        f.endpoint,
        GeneratorSettings(rate=1000, duration=3.0, bucket=10, delay=spec, delay_seed=seed, hwm=300),
    )
    assert s["delay"] == spec and s["delay_seed"] == seed
    assert s["offered"] == 3000 and s["dropped"] == 0 and not s["generator_bound"], s
    sender = s["senders"][0]
    assert sender["delay_seed"] == (seed if seed is not None else sender["id"])
    drawn = draw_delays_ms(spec, sender["delay_seed"], 300)
    assert sender["delay_ms_mean"] == pytest.approx(float(drawn.mean()), rel=1e-12)
    assert sender["delay_ms_max"] == float(drawn.max())
    t = _spool_table(f, s)
    assert_ledger_balances(s, Spool(f.spool).stats(), published_ids(f.spool))
    assert t.num_rows == 3000
    measured, _ = _measured_ms(t, 10)
    short = measured < drawn * (1 - REL_TOL) - ABS_TOL_MS
    assert not short.any(), (np.flatnonzero(short)[:5], measured[short][:5], drawn[short][:5])
    # the distribution matches the injected one: each decile within a few ms above it (a loaded
    # machine adds scheduling delay on top, never less)
    q = np.linspace(0.1, 0.9, 9)
    gap = np.quantile(measured, q) - np.quantile(drawn, q)
    assert (gap >= -ABS_TOL_MS).all() and (gap < 8.0).all(), gap
    assert float(np.median(measured - drawn)) < 3.0


@pytest.mark.long  # two sender processes through the command line
def test_the_command_line_delays_two_sender_processes_by_their_own_draws(
    factories: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    f = factories(workers=1)
    out = tmp_path / "run.json"
    r = subprocess.run(
        [sys.executable, "-m", "cloudprofiler.cli", "generate", "--endpoint", f.endpoint, "--rate", "2000"]
        + ["--duration", "1", "--senders", "2", "--bucket", "10", "--delay", "exp:15", "--summary", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    s = orjson.loads(out.read_bytes())
    assert s["delay"] == "exp:15" and s["delay_seed"] is None and s["offered"] == 2000 and s["dropped"] == 0
    t = _spool_table(f, s)
    assert_ledger_balances(s, Spool(f.spool).stats(), published_ids(f.spool))
    ids = t.column("tuple_id").to_numpy()
    for sender in s["senders"]:
        assert sender["delay_seed"] == sender["id"]  # no seed given: each sender draws from its id
        drawn = draw_delays_ms("exp:15", sender["id"], 100)
        assert sender["delay_ms_mean"] == pytest.approx(float(drawn.mean()), rel=1e-12)
        measured, _ = _measured_ms(t.filter(pa.array((ids >> bk.SEQ_BITS) == sender["id"])), 10)
        assert len(measured) == 100 and (measured >= drawn * (1 - REL_TOL) - ABS_TOL_MS).all()
    a, b = (draw_delays_ms("exp:15", x["id"], 100) for x in s["senders"])
    assert not np.array_equal(a, b)


def test_normal_delay_matches_its_distribution(factories: Callable[..., FactoryHandle]) -> None:
    f = factories(workers=1)
    # a send queue that holds the whole run: a factory stalled by a loaded machine delays buckets
    # (the quantiles below allow for it) instead of making the generator drop them
    settings = GeneratorSettings(
        rate=1000, duration=4.0, bucket=10, delay="normal:50,10", delay_seed=9, hwm=400
    )
    s = run_generator(f.endpoint, settings)
    measured, _ = _measured_ms(_spool_table(f, s), 10)
    assert len(measured) * 10 == s["offered"] == 4000 and s["dropped"] == 0, s
    assert 50.0 - 1.5 < float(measured.mean()) < 50.0 + 5.0
    # quantiles of N(50, 10) at 10..90 %: the sample's sit above by the transit, within sampling noise
    z = np.array([-1.2816, -0.8416, -0.5244, -0.2533, 0.0, 0.2533, 0.5244, 0.8416, 1.2816])
    gap = np.quantile(measured, np.linspace(0.1, 0.9, 9)) - (50.0 + 10.0 * z)
    assert (gap > -3.0).all() and (gap < 8.0).all(), gap


def test_wide_delays_overtake_with_seq_gapless_in_send_order(factories: Callable[..., FactoryHandle]) -> None:
    f = factories(workers=1)
    # 10 ms between buckets, delays of 0..200 ms: most buckets overtake or are overtaken
    s = run_generator(
        f.endpoint,
        GeneratorSettings(
            rate=1000,
            duration=2.0,
            bucket=10,
            sender_base=2048,
            event_start_ms=START_MS,
            delay="uniform:0,200",
            hwm=200,  # every bucket fits the send queue: a stalled factory delays, never drops
        ),
    )
    assert s["offered"] == 2000 and s["dropped"] == 0, s
    t = _spool_table(f, s)
    first = s["senders"][0]["first_tuple_id"]
    recs = _bucket_records(f)
    assert (recs[:, 0] == 2048).all() and len(recs) == 200
    by_seq = recs[np.argsort(recs[:, 1])]
    assert by_seq[:, 1].tolist() == list(range(200))  # gapless
    k_by_seq = (by_seq[:, 2] - first) // 10
    assert sorted(k_by_seq.tolist()) == list(range(200)) and (by_seq[:, 3] == 10).all()  # ids as generated
    inversions = int((np.diff(k_by_seq) < 0).sum())
    assert inversions > 20, inversions  # overtaking happened
    # seq follows the send order: the factory (one worker, one connection) received them in seq order
    fac_first = t.column("cp_tsc_factory").to_numpy()[::10]
    assert (np.diff(fac_first[k_by_seq]) >= 0).all()
    # and the send order is generation + drawn delay: pairs more than 5 ms apart are in that order
    send_at = np.arange(200) * 10.0 + draw_delays_ms("uniform:0,200", 2048, 200)
    pos = np.empty(200, np.int64)
    pos[k_by_seq] = np.arange(200)
    i, j = np.triu_indices(200, 1)
    apart = np.abs(send_at[i] - send_at[j]) > 5.0
    agree = (send_at[i] < send_at[j]) == (pos[i] < pos[j])
    assert float(agree[apart].mean()) > 0.99
    # event times: non-decreasing in generation order, exactly the schedule's; not in seq order
    _, ev = _measured_ms(t, 10)
    assert ev.tolist() == [START_MS + 10 * k for k in range(200)]
    assert (np.diff(ev[k_by_seq]) < 0).any()


# -- heartbeats: every message in order, on a ROUTER that answers like a factory -----------------


def _receive_all(sock: zmq.Socket[Any], out: list[bk.Header], stop: threading.Event) -> None:
    """Acknowledge hello and end of stream like the factory's front end; keep every header in order.

    The factory's front end keeps only each sender's latest heartbeat; this keeps all of them, so
    each can be checked against the buckets that came after it."""
    while not stop.is_set():
        if not sock.poll(50):
            continue
        frames = sock.recv_multipart()
        h = bk.parse_header(frames[1])
        out.append(h)
        if h.kind in (bk.KIND_HELLO, bk.KIND_EOS):
            answer_control(sock, frames[0], h)


def test_heartbeats_never_bound_above_a_held_buckets_event_time() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    got: list[bk.Header] = []
    stop = threading.Event()
    th = threading.Thread(target=_receive_all, args=(sock, got, stop))
    th.start()
    try:
        # 12 buckets 250 ms apart, held 0..1000 ms: several are held during most waits
        s = run_generator(
            f"tcp://127.0.0.1:{port}",
            GeneratorSettings(
                rate=40,
                duration=3.0,
                bucket=10,
                sender_base=700,
                event_start_ms=START_MS,
                heartbeat_ms=20,
                delay="uniform:0,1000",
                delay_seed=3,
            ),
        )
    finally:
        stop.set()
        th.join()
        sock.close(0)
        ctx.term()
    assert s["eos_delivered"] and s["dropped"] == 0 and s["senders"][0]["buckets_sent"] == 12
    data = [(i, h) for i, h in enumerate(got) if h.kind == bk.KIND_DATA]
    beats = [(i, h) for i, h in enumerate(got) if h.kind == bk.KIND_HEARTBEAT]
    assert [h.seq for _, h in data] == list(range(12))
    assert len(beats) == s["heartbeats"] >= 20
    below_sent = 0
    for i, hb in beats:
        later = [h.wall_ns for j, h in data if j > i]
        sent = [h.wall_ns for j, h in data if j < i]
        assert hb.seq == len(sent)
        # on the schedule clock the bound is exact: the oldest event time not yet sent
        assert later and hb.wall_ns == min(later), (hb, later)
        below_sent += bool(sent) and hb.wall_ns < max(sent)
    assert below_sent > 0  # a bucket was held behind a later one that had already gone
    ev = [h.wall_ns // 1_000_000 for _, h in data]
    assert sorted(ev) == [START_MS + 250 * k for k in range(12)]


# -- bad input -----------------------------------------------------------------------------------


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cloudprofiler.cli", "generate", "--rate", "10", "--duration", "1"]
    return subprocess.run(
        [*cmd, "--endpoint", "tcp://127.0.0.1:1", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--delay", "gauss:5,1"), "--delay 'gauss:5,1': expected normal:MEAN_MS,SD_MS"),
        (("--delay", "normal:50"), "expected 2 number(s) after the colon, got 1"),
        (("--delay", "exp:abc"), "--delay 'exp:abc': not a number"),
        (("--delay", "uniform:9,3"), "LO_MS 9 is above HI_MS 3"),
        (("--delay", "exp:-2"), "must be finite and >= 0"),
        (("--delay", "uniform:0,nan"), "must be finite and >= 0"),
        (("--delay", "normal:100,10000"), "above 60000 ms (normal reaches MEAN + 6 SD)"),
        (("--delay", "exp:5000"), "above 60000 ms (exp reaches 20 x MEAN)"),
        (("--delay", "zipf:11,100"), "the Zipf exponent S must be in 0..10"),
        (("--delay", "exp:5", "--delay-seed", "x"), "--delay-seed: not a whole number"),
        (("--delay", "exp:5", "--delay-seed", "-1"), "--delay-seed must be an integer"),
    ],
)
def test_bad_delay_options_are_one_line_errors(args: tuple[str, ...], message: str) -> None:
    r = _generate(*args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_a_hold_queue_that_could_grow_too_long_is_refused_up_front() -> None:
    # 1e6 buckets/s held up to 1 s: a million buckets
    with pytest.raises(ValueError, match=f"may hold 1000001 buckets, above {MAX_HELD_BUCKETS}"):
        run_generator(
            "tcp://127.0.0.1:1", GeneratorSettings(rate=1e6, duration=1, bucket=1, delay="uniform:0,1000")
        )
    with pytest.raises(ValueError, match="delay_seed"):
        run_generator(
            "tcp://127.0.0.1:1", GeneratorSettings(rate=10, duration=1, delay="exp:5", delay_seed=True)
        )


def test_generate_help_lists_the_delay_options() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "cloudprofiler.cli", "generate", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0
    for text in ("--delay DIST", "--delay-seed N", "normal:MEAN_MS,SD_MS", "zipf:S,MAX_MS"):
        assert text in r.stdout
