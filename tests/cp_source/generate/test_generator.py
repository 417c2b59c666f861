"""The generator against a real factory over ZeroMQ: exact rate, exact accounting, generator-bound runs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zmq

from cloudprofiler.children import CLI_ARGV, stop_processes
from cp_source.factory.supervisor import FactoryHandle, start_factory
from cp_source.generate import generator
from cp_source.generate.generator import run_generator
from cp_source.generate.payloads import BucketTooLarge
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.front_records import read_front_ledger
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import SenderIdInUse, answer_control
from tests.helpers.ingest_truth import expected_ids, published_ids, spool_drained


def _check_accounting(summary: dict) -> None:
    assert summary["offered"] == summary["emitted"] + summary["dropped"]
    for s in summary["senders"]:
        assert s["first_tuple_id"] == bk.tuple_id(s["id"], 0)
        assert s["next_tuple_id"] - s["first_tuple_id"] == s["emitted"] + s["dropped"]
        assert sum(c for _, c in s["dropped_ranges"]) == s["dropped"]
        assert s["eos_delivered"]
        # the factory's answer to the end of stream: it received every tuple that was emitted
        assert s["acknowledged"] and s["factory_accepted"] == s["emitted"] and s["disconnects"] == 0


def test_achieved_rate_is_within_one_percent_at_a_sustainable_rate(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    s = run_generator(f.endpoint, GeneratorSettings(rate=200_000, duration=2.0, bucket=1000))
    assert s["offered"] == 400_000
    assert abs(s["achieved_rate"] - 200_000) <= 0.01 * 200_000, s
    assert s["generator_bound"] is False
    assert set(s) >= {"emitted", "dropped", "target_rate", "achieved_rate", "generator_bound", "senders"}
    assert set(s["senders"][0]) >= {"id", "first_tuple_id", "emitted", "dropped", "dropped_ranges"}
    _check_accounting(s)


def test_asking_far_more_than_it_can_offer_is_flagged_generator_bound(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    s = run_generator(f.endpoint, GeneratorSettings(rate=2e9, duration=0.2, bucket=1000))
    assert s["generator_bound"] is True
    assert s["achieved_rate"] < 0.99 * 2e9
    _check_accounting(s)


def test_generate_command_writes_the_summary(factories: Callable[..., FactoryHandle], tmp_path: Path) -> None:
    f = factories(workers=1)
    out = tmp_path / "run.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloudprofiler.cli",
            "generate",
            "--endpoint",
            f.endpoint,
            "--rate",
            "20000",
            "--duration",
            "0.5",
            "--bucket",
            "500",
            "--sender-base",
            "4242",
            "--summary",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    s = orjson.loads(out.read_bytes())
    assert s["offered"] == 10_000 and s["senders"][0]["id"] == 4242
    assert orjson.loads(r.stdout)["emitted"] == s["emitted"]
    _check_accounting(s)


def test_bad_arguments_are_one_line_errors() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloudprofiler.cli",
            "generate",
            "--rate",
            "100",
            "--duration",
            "1",
            "--workload",
            "tpch",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "unknown workload" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ValueError, match="rate"):
        run_generator("tcp://127.0.0.1:1", GeneratorSettings(rate=0, duration=1))
    with pytest.raises(ValueError, match="sender ids"):
        run_generator(
            "tcp://127.0.0.1:1", GeneratorSettings(rate=10, duration=1, sender_base=bk.MAX_SENDER + 1)
        )


def test_bad_or_busy_endpoints_are_clear_errors(
    factories: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="invalid endpoint"):
        run_generator("foo", GeneratorSettings(rate=10, duration=1))
    f = factories(workers=1)
    with pytest.raises(OSError, match="cannot bind"):
        start_factory(f.endpoint, tmp_path / "other")


def _published_after(spool: Path, summaries: list[dict]) -> np.ndarray:
    """The spool's published ids once every run's senders ended their streams."""
    deadline = time.monotonic() + 60
    while not all(spool_drained(spool, s) for s in summaries):
        assert time.monotonic() < deadline, "the factory did not publish every run"
        time.sleep(0.1)
    return published_ids(spool)


def test_a_reused_sender_id_is_refused_and_the_first_runs_tuples_stay_whole(
    factories: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    f = factories(workers=1)
    first = run_generator(
        f.endpoint, GeneratorSettings(rate=20_000, duration=0.5, bucket=500, senders=2, sender_base=7000)
    )
    with pytest.raises(SenderIdInUse, match="refused sender id 700[01]: its spool already holds"):
        run_generator(
            f.endpoint, GeneratorSettings(rate=20_000, duration=0.5, bucket=500, senders=2, sender_base=7001)
        )
    want, _ = expected_ids(first)
    got = _published_after(tmp_path / "spool0", [first])
    assert np.array_equal(got, want) and len(got) == first["emitted"]
    assert f.front_counters()["hellos_refused"] >= 1


def test_a_random_base_the_factory_has_seen_is_drawn_again(
    factories: Callable[..., FactoryHandle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random base collides with an earlier run's 1 time in 65,535: forced here by the draw."""
    f = factories(workers=1)
    first = run_generator(
        f.endpoint, GeneratorSettings(rate=20_000, duration=0.5, bucket=500, sender_base=9000)
    )
    draws = iter([9000, 9256])
    monkeypatch.setattr(generator, "fresh_sender_base", lambda senders: next(draws))
    second = run_generator(f.endpoint, GeneratorSettings(rate=20_000, duration=0.5, bucket=500))
    assert [s["id"] for s in second["senders"]] == [9256]
    want = np.concatenate([expected_ids(first)[0], expected_ids(second)[0]])
    got = _published_after(tmp_path / "spool0", [first, second])
    assert np.array_equal(got, np.sort(want)) and len(got) == first["emitted"] + second["emitted"]


def test_a_restarted_factory_remembers_the_sender_ids_of_its_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    f = start_factory("tcp://127.0.0.1:0", spool, workers=1)
    try:
        first = run_generator(
            f.endpoint, GeneratorSettings(rate=20_000, duration=0.5, bucket=500, sender_base=5000)
        )
        _published_after(spool, [first])
    finally:
        f.stop()
    f = start_factory("tcp://127.0.0.1:0", spool, workers=1)
    try:
        r = subprocess.run(
            [*CLI_ARGV, "generate", "--endpoint", f.endpoint, "--rate", "1000", "--duration", "0.2"]
            + ["--sender-base", "5000"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        f.stop()
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "cloudprofiler generate: error: the factory refused sender id 5000: its spool already holds tuples "
        "of that sender (an earlier run with the same --sender-base); leave --sender-base unset for a "
        "fresh random one, or pick another"
    ]
    assert np.array_equal(published_ids(spool), expected_ids(first)[0])


# -- buckets over the factory's frame cap -------------------------------------------------------


def _big_lines(path: Path, n: int, size: int) -> list[bytes]:
    """An NDJSON file of ``n`` lines of ``size`` bytes of text each (and their newline)."""
    lines = [orjson.dumps({"name": f"n{i}", "blob": "x" * size}) for i in range(n)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def _factory_process(spool: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """``cloudprofiler factory`` in its own process, one worker; and its endpoint."""
    proc = subprocess.Popen(
        [*CLI_ARGV, "factory", "--endpoint", "tcp://127.0.0.1:0", "--spool", str(spool), "--workers", "1"]
        + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "factory listening on" in line, line
    return proc, line.split("factory listening on ")[1].split(",")[0]


def test_a_bucket_over_the_factorys_frame_cap_is_refused_before_any_is_sent(tmp_path: Path) -> None:
    """4 lines of 40 KB in buckets of 150 (6 MB) to a factory taking 1,000,000 bytes per payload."""
    data = tmp_path / "big.ndjson"
    lines = _big_lines(data, 4, 40_000)
    size = sum(len(lines[i % 4]) + 1 for i in range(150))  # a bucket: 150 lines, newline-terminated
    spool = tmp_path / "spool"
    proc, endpoint = _factory_process(
        spool, "--workload", "file", "--schema", "name STRING, blob STRING", "--max-frame-bytes", "1000000"
    )
    try:
        r = subprocess.run(
            [*CLI_ARGV, "generate", "--endpoint", endpoint, "--rate", "300", "--duration", "2"]
            + ["--bucket", "150", "--workload", f"file:{data}", "--sender-base", "5151"]
            + ["--summary", str(tmp_path / "gen.json")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip().splitlines() == [
            f"cloudprofiler generate: error: a bucket of 150 tuples of file:{data} is {size:,} bytes, over "
            "the factory's frame cap of 1,000,000 bytes (its --max-frame-bytes): nothing was sent; use "
            "--bucket 24 or smaller, or start the factory with a larger --max-frame-bytes"
        ]
        assert r.stdout == "" and not (tmp_path / "gen.json").exists(), "no summary of a run not made"
        # two senders: both refuse, neither sends a bucket (the one that fails first stops the other)
        with pytest.raises(BucketTooLarge, match=f"is {size:,} bytes, over the factory's frame cap"):
            run_generator(
                endpoint,
                GeneratorSettings(300, 2.0, senders=2, bucket=150, workload=f"file:{data}", sender_base=6000),
            )
        sp = Spool(spool)
        assert sp.drained({5151, 6000, 6001})
        st = sp.stats()
        assert proc.poll() is None, "the factory runs on"
    finally:
        stop_processes([proc])
    # the ledger balances: each sender closed its stream with nothing emitted, nothing reached the
    # factory, and nothing is counted as lost
    front = read_front_ledger(spool)
    for sid in (5151, 6000, 6001):
        first = bk.tuple_id(sid, 0)
        eos = st.end_of_stream[sid]
        assert (eos["first_tuple_id"], eos["next_tuple_id"], eos["buckets_sent"]) == (first, first, 0)
        assert (eos["emitted"], eos["dropped"]) == (0, 0)
        assert st.lost_in_transit[sid] == [] and (front[sid]["buckets"], front[sid]["ids"]) == (0, [])
    assert st.rows == 0 and st.deadletters == {} and st.rejected_ranges == []


def _old_factory(sock: zmq.Socket[Any], stop: threading.Event) -> None:
    """A factory of before acknowledgements said more: a bare answer to hello and end of stream."""
    while not stop.is_set():
        if sock.poll(50):
            frames = sock.recv_multipart()
            h = bk.parse_header(frames[1])
            if h.kind in (bk.KIND_HELLO, bk.KIND_EOS):
                answer_control(sock, frames[0], h)


def test_a_generator_whose_connection_was_dropped_never_exits_as_a_clean_run(tmp_path: Path) -> None:
    """A factory that names no cap and no count drops the connection of each bucket over its socket's
    MAXMSGSIZE; the generator, told nothing else, sees the dropped connections and exits 1."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.MAXMSGSIZE, 64 << 10)  # a ysb bucket of 1000 rows is about 250 KB
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()
    th = threading.Thread(target=_old_factory, args=(sock, stop))
    th.start()
    try:
        r = subprocess.run(
            [*CLI_ARGV, "generate", "--endpoint", f"tcp://127.0.0.1:{port}", "--rate", "2000"]
            + ["--duration", "1", "--bucket", "1000", "--sender-base", "5200"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop.set()
        th.join()
        sock.close(0)
        ctx.term()
    assert r.returncode == 1, r.stdout + r.stderr
    summary = orjson.loads(r.stdout)
    s = summary["senders"][0]
    assert summary["eos_delivered"] and not summary["acknowledged"], summary
    assert s["emitted"] == 2000 and s["factory_accepted"] is None and s["disconnects"] >= 1
    assert r.stderr.strip().splitlines() == [
        f"error: sender 5200 emitted 2,000 tuples, the factory did not say how many it received, "
        f"{s['disconnects']} dropped connection(s): tuples were lost on the way to the factory (a "
        "connection it dropped: a frame over its hard cap, or the factory restarting)"
    ]
