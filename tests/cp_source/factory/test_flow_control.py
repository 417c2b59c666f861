"""Flow control end to end: a real factory (worker processes, its ZeroMQ front end), real generator
sender processes, and a slow sender that holds the frontier where the test puts it.

The slow sender is a real ZeroMQ peer driven by the test: it says hello and then heartbeats at the
event time the test sets, so the frontier moves exactly when the test says, and the fast senders'
buckets accepted at each step are exact numbers, not timings.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from cp_source.factory.supervisor import start_factory
from cp_source.generate.settings import SenderSettings
from cp_source.spool.front_records import read_front_ledger
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import await_ack, close_stream
from cp_source.wire.workload_id import hello_payload, identify
from tests.helpers.ingest_truth import published_ids
from tests.helpers.sender_proc import start_sender

START = 1_700_000_000_000  # event times on the schedule clock: a fast sender's bucket k is at START + 5k ms
BOUND = 4
BUCKET = 100


class SlowPeer:
    """A sender that holds the frontier at ``event_ms``: hello, then a heartbeat every 0.1 s; ``end()``
    closes its stream (nothing sent) and returns whether the factory acknowledged it."""

    def __init__(self, endpoint: str, sender_id: int, event_ms: int) -> None:
        self.endpoint, self.sender_id, self.event_ms = endpoint, sender_id, event_ms
        self.ready, self._end = threading.Event(), threading.Event()
        self.acknowledged: bool | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.ready.wait(60), "the factory never answered the slow sender's hello"

    def _run(self) -> None:
        ctx: zmq.Context[Any] = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        packer = bk.HeaderPacker(self.sender_id, "slow-peer")
        hello = hello_payload(identify("ysb", None), credit=True)
        sock.send_multipart([bytes(packer.pack(bk.KIND_HELLO, 0, 0, 0, len(hello), 1, 0)), hello])
        if await_ack(sock, self.sender_id, bk.KIND_HELLO, 0, 60):
            self.ready.set()
        while not self._end.wait(0.1):
            hdr = packer.pack(bk.KIND_HEARTBEAT, 0, 0, 0, 0, 1, self.event_ms * 1_000_000)
            sock.send_multipart([bytes(hdr), b""])
        first = bk.tuple_id(self.sender_id, 0)
        eos = bk.EndOfStream(self.sender_id, first, first, 0, 0, 0, []).to_json()
        self.acknowledged = close_stream(sock, packer, 0, eos, 30)
        sock.close(0)
        ctx.term()

    def end(self) -> bool | None:
        self._end.set()
        self._thread.join(60)
        return self.acknowledged


def _start_sender(endpoint: str, sender_id: int, tuples: int) -> tuple[mp.Process, Any]:
    s = SenderSettings(
        sender_id, 20_000, tuples, bucket=BUCKET, event_start_ms=START, heartbeat_ms=50, ready_timeout=60
    )
    return start_sender(endpoint, s)


def _accepted(spool: Path, sender_id: int) -> int:
    """The data buckets of ``sender_id`` the front end accepted (its record, written every 0.2 s)."""
    return int(read_front_ledger(spool).get(sender_id, {}).get("buckets", 0))


def _settles_at(spool: Path, want: dict[int, int], timeout: float = 60.0) -> None:
    """Each sender's accepted buckets reach ``want`` and stay there for 0.5 s (it is held, not slow)."""
    deadline = time.monotonic() + timeout
    while any(_accepted(spool, s) < n for s, n in want.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert {s: _accepted(spool, s) for s in want} == want


def _ids(sender_id: int, n: int) -> np.ndarray:
    return np.arange(bk.tuple_id(sender_id, 0), bk.tuple_id(sender_id, n), dtype=np.int64)


def test_a_fast_sender_is_held_within_the_bound_and_one_that_dies_waiting_loses_nothing(
    tmp_path: Path,
) -> None:
    """Two generator processes run ahead of a slow sender: each is held at exactly the bound, moves
    on exactly as far as the frontier lets it, and the spool holds the exact tuple ids: all of the
    one that finished, and of the one killed while it waited, exactly the buckets it was let send."""
    spool = tmp_path / "spool"
    f = start_factory(
        "tcp://127.0.0.1:0", spool, workers=1, flush_ms=20, max_lead_buckets=BOUND, sender_timeout=1
    )
    procs: list[mp.Process] = []
    try:
        peer = SlowPeer(f.endpoint, 40, START - 10)  # the frontier: START - 11, below every fast bucket
        (pa, qa), (pc, _) = _start_sender(f.endpoint, 41, 3000), _start_sender(f.endpoint, 42, 3000)
        procs += [pa, pc]
        _settles_at(spool, {41: BOUND, 42: BOUND})  # the hello's credit: BOUND buckets, then a wait
        peer.event_ms = START + 12  # the frontier passes the buckets at +0, +5, +10: three more each
        _settles_at(spool, {41: BOUND + 3, 42: BOUND + 3})
        pc.kill()  # sender 42 dies while it waits for credit
        pc.join(30)
        assert peer.end() is True  # the slow sender ends; the dead one holds 41 back until its timeout
        a = qa.get(timeout=60)
        pa.join(30)
        assert f.wait_drained(senders=[40, 41])
        counters = f.front_counters()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        f.stop()
    assert a["emitted"] == 3000 and a["dropped"] == 0 and a["acknowledged"] and a["factory_accepted"] == 3000
    assert a["credit_waits"] >= 2 and a["credit_wait_s"] > 0.5 and not a["credit_lapsed"]
    assert 0 < counters["credit_ahead_max"] <= BOUND + 1 and counters["credit_senders"] == 3
    got = published_ids(spool)
    want = np.concatenate([_ids(41, 3000), _ids(42, (BOUND + 3) * BUCKET)])
    assert len(got) == len(want) and np.array_equal(np.sort(got), np.sort(want))  # none lost, none twice
    ledger = read_front_ledger(spool)
    assert ledger[42]["eos"] is None and ledger[42]["ids"] == [[bk.tuple_id(42, 0), (BOUND + 3) * BUCKET]]


@pytest.mark.long
def test_a_sender_waiting_on_a_factory_that_died_goes_on_to_its_successor(tmp_path: Path) -> None:
    """The factory stops while a sender waits for credit; a new factory takes over the endpoint and the
    spool. The sender hears nothing for SILENCE_S, stops waiting, sends the rest to the new factory,
    and every tuple is in the spool exactly once."""
    spool = tmp_path / "spool"
    f = start_factory("tcp://127.0.0.1:0", spool, workers=1, flush_ms=20, max_lead_buckets=BOUND)
    endpoint = f.endpoint
    p: mp.Process | None = None
    g = None
    try:
        peer = SlowPeer(endpoint, 50, START - 10)
        p, q = _start_sender(endpoint, 51, 2000)
        _settles_at(spool, {51: BOUND})
        f.stop()  # the factory dies while sender 51 waits
        g = start_factory(endpoint, spool, workers=1, flush_ms=20, max_lead_buckets=BOUND)
        assert peer.end() is True  # its end of stream, resent, reaches the new factory
        r = q.get(timeout=120)
        p.join(30)
        assert g.wait_drained(senders=[51])
    finally:
        if p is not None and p.is_alive():
            p.kill()
        f.stop()
        if g is not None:
            g.stop()
    assert r["emitted"] == 2000 and r["dropped"] == 0 and r["acknowledged"] and r["credit_lapsed"]
    got = published_ids(spool)
    assert len(got) == 2000 and np.array_equal(np.sort(got), _ids(51, 2000))
