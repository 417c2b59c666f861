"""A batch being planned makes the workers publish what they hold (cp_source.spool.demand): a tuple
waits for the next micro-batch, not for a worker's flush. Real factory, real ZeroMQ, the reader's
driver side called as Spark's runner calls it."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import zmq
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cp_source.factory.supervisor import FactoryHandle
from cp_source.reader import source_status
from cp_source.reader.options import ReaderOptions, source_schema
from cp_source.reader.stream_reader import CloudprofilerStreamReader
from cp_source.spool.demand import (
    ACK_FILE,
    COUNTS_EVERY_S,
    COUNTS_FILE,
    POLL_S,
    WAIT_S,
    Demand,
    DemandAnswer,
    read_counts,
)
from cp_source.spool.segments import Spool
from tests.helpers.polling import wait_for
from tests.helpers.ready_sender import HandSender


def _pending_rows(spool: Path, worker: str) -> int:
    try:
        return int(orjson.loads((spool / worker / "stats.json").read_bytes()).get("pending_rows", 0))
    except FileNotFoundError:
        return 0


def _four_buckets(
    factory: FactoryHandle, ctx: zmq.Context, sender_id: int
) -> tuple[CloudprofilerStreamReader, dict, HandSender]:
    """The reader's driver side on the factory's spool, its initial offset, and a sender that sent
    four buckets of 10 tuples (the front end spreads them over the workers)."""
    options = {"spool": factory.spool, "factory": "external"}
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    start = reader.initialOffset()
    sender = HandSender(ctx, factory.endpoint, sender_id=sender_id)
    for seq in range(4):
        sender.data(seq, int(time.time() * 1000), count=10)
    return reader, start, sender


@pytest.mark.factory(workers=2, flush_ms=5000)
def test_latest_offset_publishes_what_the_workers_hold(factory: FactoryHandle, ctx: zmq.Context) -> None:
    """Each worker holds buckets it would publish only after 5 s (flush_ms); latestOffset offers them
    at once (within 2 s on a loaded machine, a few ms on a quiet one), every one of their ids."""
    spool = Path(factory.spool)
    reader, start, sender = _four_buckets(factory, ctx, sender_id=77)
    try:
        wait_for(
            lambda: _pending_rows(spool, "w0") + _pending_rows(spool, "w1") == 40,
            20,
            "the workers to hold 40 rows",
        )
        assert _pending_rows(spool, "w0") and _pending_rows(spool, "w1")  # both workers hold rows
        t0 = time.monotonic()
        end = start
        # as Spark asks again while nothing is new; each worker publishes one segment
        while min(end.get("w0", -1), end.get("w1", -1)) < 0 and time.monotonic() - t0 < 3:
            end = reader.latestOffset(start, ReadAllAvailable())
            time.sleep(0.01)
        took = time.monotonic() - t0
        parts = reader.partitions(start, end)
        executor = pickle.loads(pickle.dumps(reader))
        ids = [b.column("tuple_id").to_numpy() for p in parts for b in executor.read(p)]
        got = np.sort(np.concatenate(ids)) if ids else np.empty(0, np.int64)
        want = np.concatenate([np.arange(first, first + n) for first, n, _ in sender.ids])
        np.testing.assert_array_equal(got, want)
        assert took < 2.0, f"the rows were offered after {took:.3f} s"
        # the bounds and every demand, beside the result: source_status shows them
        counts = source_status(spool)["demand"]
        assert counts["wait_ms"] == WAIT_S * 1000 and counts["poll_ms"] == POLL_S * 1000
        assert counts["asks"] >= 1 and 0 <= counts["late_asks"] <= counts["asks"]
        assert set(counts["late_by_worker"]) <= {"w0", "w1"}
    finally:
        sender.close()
        reader.stop()


def test_a_worker_that_never_answers_is_counted_late_and_the_wait_stays_bounded(tmp_path: Path) -> None:
    """A worker holding rows that dies before it answers (killed, or stuck): the reader waits its
    bound and no longer, names that worker alone, and counts it; the counts survive the reader's
    restart. The live worker answers from its own thread, polling as a worker does."""
    spool = tmp_path / "spool"
    for w in ("w0", "w1"):
        (spool / w).mkdir(parents=True)
    live = DemandAnswer(spool, spool / "w0")
    DemandAnswer(spool, spool / "w1").holding()  # holds rows, then never looks again
    stop = threading.Event()

    def answering() -> None:  # holds rows again as soon as it answered: every demand waits for it
        while not stop.is_set():
            live.holding()
            if live.due():
                live.answer()
            time.sleep(POLL_S)

    worker = threading.Thread(target=answering, daemon=True)
    worker.start()
    try:
        demand = Demand(spool)
        for _ in range(3):
            t0 = time.monotonic()
            late = demand.ask(["w0", "w1"])
            took = time.monotonic() - t0
            assert late == ["w1"] and WAIT_S <= took < WAIT_S + 2.0, (late, took)
    finally:
        stop.set()
        worker.join()
    live.answer()  # it published what it held: it holds nothing now
    counts = read_counts(spool)
    assert (counts["asks"], counts["late_asks"], counts["late_by_worker"]) == (3, 3, {"w1": 3})
    # a reader restarted on the spool counts on; the dead worker's answer file gone with its
    # restart, no one waits for it
    (spool / "w1" / ACK_FILE).unlink()
    assert Demand(spool).ask(["w0", "w1"]) == []
    counts = read_counts(spool)
    assert (counts["asks"], counts["late_asks"], counts["late_by_worker"]) == (4, 3, {"w1": 3})


def test_garbled_demand_counts_read_as_zero_not_as_an_error(tmp_path: Path) -> None:
    """The counts are the reader's own file; a torn or foreign one reads as no demand yet."""
    for raw in (b"", b"[1, 2]", b'{"asks": -5, "late_asks": "x", "late_by_worker": [1]}', b"\xff\xfe"):
        (tmp_path / COUNTS_FILE).write_bytes(raw)
        counts = read_counts(tmp_path)
        assert counts["asks"] == 0 and counts["late_asks"] == 0 and counts["late_by_worker"] == {}


@pytest.mark.factory(workers=2, flush_ms=5000)
def test_a_worker_killed_holding_rows_while_a_batch_is_planned_costs_one_bound_and_is_counted(
    factory: FactoryHandle, ctx: zmq.Context
) -> None:
    """Both workers hold rows; w0 is SIGKILLed just before latestOffset asks. The demand waits its
    bound for w0 and no longer, w1's rows are in the batch, w0 is counted late; the restarted w0 is
    waited for by no later demand; the ledger balances: every id in the spool or lost in the factory."""
    spool = Path(factory.spool)
    reader, start, sender = _four_buckets(factory, ctx, sender_id=78)
    try:
        wait_for(
            lambda: _pending_rows(spool, "w0") and _pending_rows(spool, "w1"), 20, "both workers to hold rows"
        )
        victim = factory.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        end = reader.latestOffset(start, ReadAllAvailable())
        took = time.monotonic() - t0
        assert took < WAIT_S + 2.0, f"latestOffset waited {took:.3f} s for a dead worker"
        wait_for(lambda: end.get("w1", -1) >= 0 or _published(reader, start, "w1"), 10, "w1's rows")
        late = read_counts(spool)["late_by_worker"]
        # a restarted worker answers only once it runs (its imports alone take longer than the wait)
        assert late.get("w0", 0) >= 1, late
        wait_for(lambda: factory.worker_pids()[0] != victim, 30, "the supervisor to restart w0")
        wait_for(
            lambda: (spool / "w0" / ACK_FILE).exists() and _pending_rows(spool, "w0") == 0, 30, "w0 to answer"
        )
        time.sleep(COUNTS_EVERY_S)  # the plain count of demands is rewritten at most once a second
        before = read_counts(spool)
        reader.latestOffset(start, ReadAllAvailable())
        after = read_counts(spool)
        assert after["asks"] == before["asks"] + 1 and after["late_asks"] == before["late_asks"]
        sender.end()
        assert factory.wait_drained(60)
        stats = Spool(spool).stats()
        assert stats.rows + stats.lost_in_transit_total == sender.emitted == 40
        assert stats.lost_in_transit_total > 0  # what the killed worker held, counted
    finally:
        sender.close()
        reader.stop()


def _published(reader: CloudprofilerStreamReader, start: dict, worker: str) -> bool:
    return reader.latestOffset(start, ReadAllAvailable()).get(worker, -1) >= 0


def test_the_plain_count_of_demands_is_rewritten_at_most_once_a_second_and_whole_at_stop(
    tmp_path: Path,
) -> None:
    """A rewrite of the counts costs ten demands: an idle query asking every 10 ms rewrites them once
    a second, and the reader's stop writes the exact count."""
    (tmp_path / "w0").mkdir()
    demand = Demand(tmp_path)
    t0 = time.monotonic()
    for _ in range(50):
        assert demand.ask(["w0"]) == []
    quick = time.monotonic() - t0 < COUNTS_EVERY_S
    assert 1 <= read_counts(tmp_path)["asks"] <= 50
    if quick:  # the first demand wrote the file, the next 49 within the second did not
        assert read_counts(tmp_path)["asks"] == 1
    demand.write_counts()
    assert read_counts(tmp_path)["asks"] == 50
