"""The factory with real ZeroMQ and real worker processes: exactly once, SIGKILL and restart,
malformed input, and backpressure from a full spool."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
import zmq

from cp_source.factory.deadletter import read_dead_letters
from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.generator import run_generator
from cp_source.generate.payloads import build_payloads
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from tests.helpers.ingest_truth import expected_ids
from tests.helpers.polling import wait_for


def spool_ids(spool: Spool, commit: bool = False) -> np.ndarray:
    """All tuple ids in the spool's published segments (optionally committing them)."""
    parts = [np.empty(0, dtype=np.int64)]
    done = spool.committed()
    latest = spool.latest()
    for w, upto in latest.items():
        for seg in spool.segments(w, done.get(w, -1), upto):
            parts.append(read_segment(seg.path).column("tuple_id").to_numpy())
    if commit:
        spool.commit(latest)
    return np.concatenate(parts)


class GeneratorThread(threading.Thread):
    """run_generator in a background thread; the test joins it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(daemon=True)
        self.args, self.kw = args, kw
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            endpoint, *rest = self.args
            self.summary = run_generator(endpoint, GeneratorSettings(*rest, **self.kw))
        except BaseException as e:
            self.error = e

    def result(self, timeout: float = 120) -> dict[str, Any]:
        self.join(timeout)
        assert not self.is_alive(), "generator did not finish"
        if self.error:
            raise self.error
        assert self.summary is not None
        return self.summary


@pytest.fixture
def generator_threads() -> Iterator[Callable[..., GeneratorThread]]:
    threads: list[GeneratorThread] = []

    def start(*args: Any, **kw: Any) -> GeneratorThread:
        t = GeneratorThread(*args, **kw)
        threads.append(t)
        t.start()
        return t

    yield start
    for t in threads:
        t.join(60)


def test_every_emitted_id_arrives_exactly_once(factories: Callable[..., FactoryHandle]) -> None:
    f = factories(workers=2)
    s = run_generator(f.endpoint, GeneratorSettings(rate=100_000, duration=2.0, senders=2, bucket=1000))
    assert s["eos_delivered"] and len({x["id"] for x in s["senders"]}) == 2
    assert f.wait_drained(30)
    sp = f.spool_view()
    st = sp.stats()
    ids = spool_ids(sp)
    assert len(ids) == len(np.unique(ids))  # no duplicates
    np.testing.assert_array_equal(np.sort(ids), expected_ids(s, st)[0])
    assert st.lost_in_transit_total == 0 and st.deadletters_total == 0
    assert st.rows == s["emitted"] == len(ids)
    assert set(st.end_of_stream) == {int(x["id"]) for x in s["senders"]}
    # both workers took part, and the stamp columns are filled
    assert all(n >= 0 for n in sp.latest().values()) and len(sp.latest()) == 2
    seg = read_segment(sp.segments("w1", -1, 0)[0].path)
    assert seg.column("cp_tsc_factory").null_count == 0
    assert (seg.column("cp_tsc_factory").to_numpy() != 0).all()
    assert set(seg.column("sender_id").to_pylist()) <= {x["id"] for x in s["senders"]}


@pytest.mark.long  # 6-8 s: moved to keep the fast tier inside its 10 minutes
def test_sigkill_of_a_worker_then_restart_loses_exactly_the_counted_gap(
    factories: Callable[..., FactoryHandle], generator_threads: Callable[..., GeneratorThread]
) -> None:
    f = factories(workers=2, flush_ms=300)
    sp = f.spool_view()
    gen = generator_threads(f.endpoint, rate=60_000, duration=4.0, bucket=500)
    wait_for(lambda: sp.latest().get("w0", -1) >= 1, 30, "w0 to publish segments")
    victim = f.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    before = sp.latest()["w0"]
    # the factory's supervisor restarts it on its spool directory
    wait_for(lambda: f.worker_pids()[0] != victim, 30, "the supervisor to restart w0")
    assert f.alive() and [r[1] for r in f.restarts] == [0]
    s = gen.result()
    assert f.wait_drained(30)
    st = sp.stats()
    ids = spool_ids(sp)
    assert len(ids) == len(np.unique(ids))
    # delivered == emitted - dropped - lost in transit, and the loss is exactly the reported ranges
    np.testing.assert_array_equal(np.sort(ids), expected_ids(s, st)[0])
    sender = int(s["senders"][0]["id"])
    assert st.lost_in_transit_total == sum(c for _, c in st.lost_in_transit[sender])
    assert st.lost_buckets[sender] * 500 == st.lost_in_transit_total
    # the restarted worker continued its numbering after its last published segment, and published more
    lines = [orjson.loads(x) for x in (Path(f.spool) / "w0" / "manifest.ndjson").read_bytes().splitlines()]
    assert [d["number"] for d in lines] == list(range(len(lines)))
    assert sp.latest()["w0"] > before
    assert st.per_worker["w0"].counters["restarts"] == 1


def _send(sock: zmq.Socket, frames: list[bytes]) -> None:
    sock.send_multipart(frames)


def test_malformed_input_is_counted_and_dead_lettered_while_good_data_flows(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1, max_frame_bytes=1 << 18, flush_ms=50)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)  # the factory's front end is a ROUTER
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(f.endpoint)
    sender, dom = 321, "fuzz-node@00000001"
    pk = bk.HeaderPacker(sender, dom)
    payload = build_payloads("ysb", 100, pool=1)[0]
    first = bk.tuple_id(sender, 0)
    seq = 0
    nid = first

    def data(count: int = 100, body: bytes = payload, declared: int | None = None) -> list[bytes]:
        nonlocal seq, nid
        h = bytes(pk.pack(bk.KIND_DATA, seq, nid, count, len(body) if declared is None else declared, 1, 2))
        seq += 1
        nid += count
        return [h, body]

    good_ids: list[int] = []
    expected: dict[str, int] = {}

    def bad(reason: str, frames: list[bytes]) -> None:
        expected[reason] = expected.get(reason, 0) + 1
        _send(sock, frames)

    def good() -> None:
        good_ids.extend(range(nid, nid + 100))
        _send(sock, data())

    def bad_row(row: int, body: bytes) -> None:
        """A bucket with one bad row: that row is rejected alone, the other 99 are published."""
        good_ids.extend(i for i in range(nid, nid + 100) if i != nid + row)
        bad("bad_json", data(body=body))

    good()
    bad("bad_magic", [b"NOPE" + bytes(pk.pack(bk.KIND_DATA, 0, 0, 1, 1, 0, 0))[4:], b"x"])
    good()
    bad("truncated_header", [b"CPBK\x01", payload])
    bad("bad_header", [payload])  # one frame that is no header
    bad("frame_count", data()[:1])  # a header alone
    bad("frame_count", [*data(), b"extra"])
    good()
    bad("count_mismatch", data(count=99))
    bad_row(99, payload[:-40] + b"\n")
    bad_row(0, payload.replace(b'"ad_type"', b"ad_type", 1))
    bad("length_mismatch", data(declared=len(payload) + 1))
    bad("count_mismatch", data(body=payload * 3))  # 300 rows under a 100-row header
    bad("oversized", data(body=payload * 20))  # ~430 KB, past the 256 KiB bound
    good()
    bad("replayed_seq", [bytes(pk.pack(bk.KIND_DATA, 0, first, 100, len(payload), 1, 2)), payload])
    bad("bad_control", [bytes(pk.pack(bk.KIND_EOS, seq, 0, 0, 3, 1, 2)), b"{x}"])
    good()
    eos = bk.EndOfStream(sender, first, nid, seq, nid - first, 0, [])
    body = eos.to_json()
    _send(sock, [bytes(pk.pack(bk.KIND_EOS, seq, 0, 0, len(body), 1, 2)), body])
    sock.close()
    ctx.term()
    assert f.wait_drained(30)
    sp = f.spool_view()
    st = sp.stats()
    assert st.deadletters == expected
    ids = spool_ids(sp)
    np.testing.assert_array_equal(np.sort(ids), np.array(good_ids, dtype=np.int64))
    # buckets with a valid header but a bad payload are rejected ranges, not loss in transit
    assert st.lost_in_transit == {sender: []}
    # rejected with a trusted header: both count mismatches, both bad rows, the length mismatch, the
    # oversized payload and both frame-count errors (their header was valid)
    assert st.rejected_buckets == 8 and st.rejected_rows == 99 + 5 * 100 + 2
    letters = list(read_dead_letters(Path(f.spool) / "w0" / "deadletter.bin"))
    assert len(letters) == sum(expected.values())
    by_reason: dict[str, int] = {}
    for reason, frames in letters:
        by_reason[reason] = by_reason.get(reason, 0) + 1
        assert all(len(stored) <= 64 << 10 and orig >= len(stored) for orig, stored in frames)
    assert by_reason == expected


@pytest.mark.parametrize(
    ("lead", "ask"),
    # the factory turning credit off is the same drop path as a sender not asking: long tier
    [("auto", True), pytest.param(0, True, marks=pytest.mark.long), ("auto", False)],
)
def test_a_full_spool_holds_the_sender_or_turns_into_counted_drops(
    factories: Callable[..., FactoryHandle],
    generator_threads: Callable[..., GeneratorThread],
    lead: str | int,
    ask: bool,
) -> None:
    # with flow control (the default) the sender waits for credit; without it (the factory's
    # max_lead_buckets=0, or a sender that does not ask, as maxrate's), its sends fail as counted drops
    f = factories(workers=1, max_spool_bytes=400_000, flush_ms=50, max_lead_buckets=lead)
    sp = f.spool_view()
    gen = generator_threads(f.endpoint, rate=50_000, duration=2.0, bucket=500, flow_control=ask)
    time.sleep(2.5)  # no reader: the spool fills and stays full
    assert sp.used_bytes() >= 400_000
    got = [spool_ids(sp, commit=True)]
    while gen.is_alive() or not f.wait_drained(2, quiet=0.5):
        got.append(spool_ids(sp, commit=True))
        time.sleep(0.1)
    s = gen.result()
    got.append(spool_ids(sp, commit=True))
    ids = np.concatenate(got)
    assert s["eos_delivered"]
    if lead == 0 or not ask:
        assert s["dropped"] > 0 and s["senders"][0]["credit_waits"] == 0
    else:
        assert s["dropped"] == 0 and s["senders"][0]["credit_waits"] > 0
    st = sp.stats()
    assert st.lost_in_transit_total == 0
    assert len(ids) == len(np.unique(ids)) == s["emitted"]
    np.testing.assert_array_equal(np.sort(ids), expected_ids(s)[0])


def test_file_workload_replays_ndjson_with_a_ddl_schema(
    factories: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    src = tmp_path / "events.ndjson"
    lines = [{"name": f"item-{i}", "price": i * 0.5, "qty": i, "extra": "ignored"} for i in range(7)]
    src.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    f = factories(workers=1, workload="file:", schema="name STRING, price DOUBLE, qty BIGINT", flush_ms=50)
    s = run_generator(
        f.endpoint, GeneratorSettings(rate=5000, duration=1.0, bucket=100, workload=f"file:{src}")
    )
    assert f.wait_drained(30)
    sp = f.spool_view()
    assert sp.stats().deadletters_total == 0
    parts = [read_segment(seg.path) for seg in sp.segments("w0", -1, sp.latest()["w0"])]
    rows = [r for t in parts for r in t.select(["tuple_id", "name", "price", "qty"]).to_pylist()]
    np.testing.assert_array_equal(np.sort([r["tuple_id"] for r in rows]), expected_ids(s, sp.stats())[0])
    first = s["senders"][0]["first_tuple_id"]
    pool_rows = len(build_payloads(f"file:{src}", 100)) * 100
    for r in rows:  # every tuple is one line of the file; the first pool of buckets replays it in order
        n = r["qty"]
        assert (r["name"], r["price"]) == (f"item-{n}", n * 0.5)
        if r["tuple_id"] - first < pool_rows:
            assert n == (r["tuple_id"] - first) % 7
    assert {r["qty"] for r in rows} == set(range(7))
    assert parts[0].schema.field("qty").type == pa.int64()
