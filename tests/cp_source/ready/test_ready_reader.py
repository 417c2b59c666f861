"""``ordering=ready`` in the stream reader, driven the way Spark's runner drives it: batches cut at the
ready frontier, merged in event-time order, replayed identically by a new driver, rows that arrive
behind the frontier counted with their ids, and the options refused where they make no sense."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
import zmq
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cp_source.factory.supervisor import FactoryHandle, start_factory
from cp_source.reader.options import ReaderOptions, source_schema
from cp_source.reader.source_watch import SourceStatus
from cp_source.reader.stream_reader import CloudprofilerStreamReader
from cp_source.ready.batch_plan import LATE_REASON, ReadyState, read_report
from cp_source.ready.frontier import NO_FRONTIER
from cp_source.spool.segments import Spool
from tests.helpers.ready_sender import HandSender, rows_of, truth, wait_rows
from tests.helpers.typed_keys import assert_keys

# the `factory` fixture (tests/conftest.py): an external factory writing tmp_path/spool
pytestmark = pytest.mark.factory(workers=2, flush_ms=20)


def _reader(spool: Path, **extra: str) -> CloudprofilerStreamReader:
    options = {"spool": str(spool), "factory": "external", "fetch": "local", "ordering": "ready", **extra}
    return CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)


def _batch(reader: CloudprofilerStreamReader, start: dict, end: dict) -> pa.Table:
    parts = reader.partitions(start, end)
    batches = [b for p in parts for b in reader.read(p)]
    schema = batches[0].schema if batches else None
    if schema is None:
        return pa.table({"tuple_id": pa.array([], pa.int64())})
    return pa.Table.from_batches(batches, schema).select(["event_time", "sender_id", "tuple_id"])


def test_batches_hold_exactly_the_ready_tuples_in_merged_order_and_replay_identically(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    a, b = HandSender(ctx, factory.endpoint, 6000), HandSender(ctx, factory.endpoint, 6001)
    try:
        for k in range(10):  # b lags 5 s behind a
            a.data(k, 10_000 + 1_000 * k, count=7)
            b.data(k, 5_000 + 1_000 * k, count=5)
        wait_rows(spool, 120)
        reader = _reader(spool)
        start = reader.initialOffset()
        assert start["frontier"] == NO_FRONTIER
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert end1["frontier"] == 13_999  # b has shown 14_000
        got1 = _batch(reader, start, end1)
        assert rows_of(got1) == truth([a, b], NO_FRONTIER, 13_999)
        # a new driver (a restart) plans and reads the same batch from the offsets alone
        again = _reader(spool)
        again.initialOffset()
        assert _batch(again, start, end1).equals(got1)
        again.stop()
        reader.commit(end1)
        assert ReadyState.read(spool).frontier == 13_999
        assert reader.latestOffset(end1, ReadAllAvailable()) == end1  # nothing new is ready
        a.end()
        b.end()
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert end2["frontier"] == 19_000  # both ended: everything in is ready
        got2 = _batch(reader, end1, end2)
        assert rows_of(got2) == truth([a, b], 13_999, 19_000)
        assert rows_of(got1)[-1] < rows_of(got2)[0]  # batch 1 entirely before batch 2
        reader.commit(end2)
        assert all(not list((spool / w).glob("seg-*.arrow")) for w in Spool(spool).workers())  # all read
        rep = read_report(spool)
        assert rep is not None and rep["frontier_ms"] == 19_000 and rep["gone"] == []
        reader.stop()
    finally:
        a.close()
        b.close()


def test_rows_behind_the_frontier_are_counted_with_their_ids_not_lost(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    a = HandSender(ctx, factory.endpoint, 7000)
    late = None
    try:
        a.data(0, 10_000)
        a.data(1, 20_000)
        a.end()
        wait_rows(spool, 20)
        reader = _reader(spool)
        start = reader.initialOffset()
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert end1["frontier"] == 20_000
        assert len(_batch(reader, start, end1)) == 20
        reader.commit(end1)
        late = HandSender(ctx, factory.endpoint, 7001)  # appears after the frontier passed its times
        late.data(0, 15_000, count=4)
        late.data(1, 25_000, count=3)
        late.end()
        wait_rows(spool, 27)
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert end2["frontier"] == 25_000
        got = _batch(reader, end1, end2)
        assert rows_of(got) == truth([late], 20_000, 25_000)  # the 3 tuples at 25_000
        reader.commit(end2)
        reader.commit(end2)  # Spark may commit an end again after a restart: counted once
        recs = [r for r in Spool(spool).skipped() if r["reason"] == LATE_REASON]
        first = late.ids[0][0]
        assert len(recs) == 1 and recs[0]["rows"] == 4 and recs[0]["ranges"] == [[first, 4]]
        assert recs[0]["frontier_ms"] == 20_000
        import cloudprofiler

        full = cloudprofiler.source_status(spool)
        assert_keys(full, SourceStatus)  # the documented JSON form, section by section
        status = full["ready"]  # what a user watching the query sees
        assert status["frontier_ms"] == 25_000 and status["behind_frontier_rows"] == 4
        assert status["senders"]["7001"]["done"] and status["gone"] == []
        reader.stop()
    finally:
        a.close()
        if late is not None:
            late.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ordering": "sorted"}, "ordering"),
        ({"senders": "2"}, "senders"),
        ({"senderTimeout": "5"}, "senderTimeout"),
        ({"ordering": "ready", "maxRecordsPerTrigger": "100"}, "maxRecordsPerTrigger"),
        ({"ordering": "ready", "startingOffsets": "latest"}, "startingOffsets"),
        ({"ordering": "ready", "senderIds": "1,x"}, "senderIds"),
        ({"ordering": "ready", "senderTimeout": "0"}, "senderTimeout"),
        ({"ordering": "ready", "senders": "0"}, "senders"),
    ],
)
def test_bad_ready_option_is_named(options: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ReaderOptions.parse(options)


def test_a_checkpoint_keeps_its_ordering(tmp_path: Path) -> None:
    from cp_source.spool.segments import SpoolMismatchError

    spool = tmp_path / "spool"
    ready = _reader(spool)
    offset: dict[str, Any] = ready.initialOffset()
    options = {"spool": str(spool), "factory": "external", "fetch": "local"}
    arrival = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    with pytest.raises(SpoolMismatchError, match="written with ordering=ready"):
        arrival.latestOffset(offset, ReadAllAvailable())
    with pytest.raises(SpoolMismatchError, match="written with ordering=arrival"):
        ready.latestOffset(orjson.loads(orjson.dumps(arrival.initialOffset())), ReadAllAvailable())
    ready.stop()
    arrival.stop()


@pytest.mark.long  # over 8 s: keeps the quick tier within its budget
def test_a_worker_killed_with_buckets_in_hand_leaves_a_gap_the_frontier_passes_and_the_ledger_counts(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    import time

    spool = tmp_path / "spool"
    # buckets wait 3 s in a worker before they are published: a kill in between loses them
    factory = start_factory("tcp://127.0.0.1:0", spool, workers=2, flush_ms=3000)
    a = HandSender(ctx, factory.endpoint, 8000)
    try:
        for k in range(4):
            a.data(k, 1_000 * (k + 1))
        wait_rows(spool, 40)
        a.data(4, 5_000)
        time.sleep(0.3)  # in a worker's hands, not yet published
        factory.restart_worker(0)
        factory.restart_worker(1)
        a.data(5, 6_000)
        a.data(6, 7_000)
        a.end()
        wait_rows(spool, 60)
        reader = _reader(spool, senderTimeout="1")
        start = reader.initialOffset()
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert end1["frontier"] == 3_999  # seq 4 missing: seqs 5 and 6 wait behind it
        got1 = _batch(reader, start, end1)
        reader.commit(end1)
        time.sleep(1.2)
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert end2["frontier"] == 7_000  # the gap declared lost; the sender had ended
        got2 = _batch(reader, end1, end2)
        reader.commit(end2)
        report = read_report(spool)
        assert report is not None and report["senders"]["8000"]["lost_seqs"] == [[4, 1]]
        reader.stop()
        assert factory.wait_drained(30)
        stats = Spool(spool).stats()
        lost = stats.lost_in_transit[8000]
        read_ids = sorted(rows_of(got1) + rows_of(got2))
        seq4 = a.ids[4][0]
        assert lost == [[seq4, 10]]
        # the ledger balances: every id emitted is read once or counted lost, with its id
        assert sorted(t for _, _, t in read_ids) == [
            first + i for k, (first, count, _) in enumerate(a.ids) if k != 4 for i in range(count)
        ]
        assert rows_of(got1)[-1] < rows_of(got2)[0]
    finally:
        a.close()
        factory.stop()
