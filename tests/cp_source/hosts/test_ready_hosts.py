"""``ordering=ready`` over factory hosts: one frontier over every sender of every factory.

Real `cloudprofiler factory --serve` processes on loopback, hand-driven senders on the real wire
protocol, and the stream reader driven the way Spark's runner drives it (its partitions read on the
executor side, fetching from the hosts' segment servers).
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
import zmq
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cp_source.hosts.ready_hosts import parse_plan, parse_ready
from cp_source.hosts.segment_client import ask_servers
from cp_source.hosts.segment_protocol import ControlRequest, parse_request
from cp_source.reader.options import ReaderOptions, source_schema
from cp_source.reader.source_watch import FactoriesStatus
from cp_source.reader.stream_reader import CloudprofilerStreamReader
from cp_source.ready.batch_plan import LATE_REASON, ReadySlice, ReadyState
from cp_source.ready.frontier import NO_FRONTIER
from cp_source.spool.segments import Spool
from tests.helpers.netns_hosts import FactoryHost
from tests.helpers.polling import wait_for
from tests.helpers.ready_sender import HandSender, rows_of, truth, wait_rows
from tests.helpers.typed_keys import assert_keys


@pytest.fixture
def two(tmp_path: Path) -> Iterator[list[FactoryHost]]:
    hosts = [FactoryHost(tmp_path / "spool-a"), FactoryHost(tmp_path / "spool-b")]
    try:
        yield hosts
    finally:
        for h in hosts:
            h.stop()


def _reader(hosts: list[FactoryHost], tmp_path: Path, **extra: str) -> CloudprofilerStreamReader:
    options = {
        "factories": ",".join(h.server for h in hosts),
        "statusDir": str(tmp_path / "status"),
        "ordering": "ready",
        "factoryTimeout": "0",
        **extra,
    }
    return CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)


def _batch(reader: CloudprofilerStreamReader, start: dict, end: dict) -> tuple[pa.Table, list[Any]]:
    """The batch as executors read it (the reader and its partitions pickled, as Spark ships them)."""
    parts = reader.partitions(start, end)
    executor = pickle.loads(pickle.dumps(reader))
    batches = [b for p in parts for b in executor.read(pickle.loads(pickle.dumps(p)))]
    if not batches:
        return pa.table({"tuple_id": pa.array([], pa.int64())}), parts
    table = pa.Table.from_batches(batches, batches[0].schema)
    return table.select(["event_time", "sender_id", "tuple_id"]), parts


def _rows_from(spool: Path, event_ms: int) -> int:
    """Rows in the published segments whose event times all are at or after ``event_ms``."""
    sp = Spool(spool)
    segs = [s for w, n in sp.latest().items() for s in sp.segments(w, -1, n)]
    return sum(s.rows for s in segs if s.event_time_min >= event_ms)


def _served(host: FactoryHost) -> int:
    c = zmq.Context()
    try:
        stats = ask_servers({host.server: {"op": "stats"}}, 20.0, c)[host.server]
    finally:
        c.term()
    assert isinstance(stats, dict), stats
    return int(stats["segments_served"])


def test_batches_over_two_hosts_hold_exactly_the_ready_tuples_merged_and_replay_identically(
    two: list[FactoryHost], ctx: zmq.Context, tmp_path: Path
) -> None:
    ha, hb = two
    a, b = HandSender(ctx, ha.endpoint, 6100), HandSender(ctx, hb.endpoint, 6101)
    try:
        for k in range(10):  # b (on the other host) lags 5 s behind a
            a.data(k, 10_000 + 1_000 * k, count=7)
            b.data(k, 5_000 + 1_000 * k, count=5)
        wait_rows(ha.spool, 70)
        wait_rows(hb.spool, 50)
        reader = _reader(two, tmp_path)
        start = reader.initialOffset()
        assert start["frontier"] == NO_FRONTIER
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert end1["frontier"] == 13_999  # the minimum over both hosts: b has shown 14_000
        assert set(end1["factories"]) == {Spool(h.spool).spool_id() for h in two}
        got1, parts = _batch(reader, start, end1)
        assert rows_of(got1) == truth([a, b], NO_FRONTIER, 13_999)
        servers = {src[0] for p in parts for src in p.sources}
        assert servers == {ha.server, hb.server}  # executors fetch from the hosts, never the driver
        assert all(isinstance(p, ReadySlice) for p in parts)
        served = [_served(h) for h in two]
        assert all(n > 0 for n in served)
        # a new driver (a restart) plans and reads the same batch from the offsets alone
        again = _reader(two, tmp_path)
        again.initialOffset()
        assert _batch(again, start, end1)[0].equals(got1)
        again.stop()
        reader.commit(end1)
        assert [ReadyState.read(h.spool).frontier for h in two] == [13_999, 13_999]
        assert reader.latestOffset(end1, ReadAllAvailable()) == end1  # nothing new is ready
        a.end()
        b.end()
        wait_for(lambda: reader.latestOffset(end1, ReadAllAvailable()) != end1, 30, "both ended")
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert end2["frontier"] == 19_000  # every sender of every host ended: all that is in
        got2, _ = _batch(reader, end1, end2)
        assert rows_of(got2) == truth([a, b], 13_999, 19_000)
        assert rows_of(got1)[-1] < rows_of(got2)[0]
        reader.commit(end2)
        for h in two:  # every segment read and deleted on its own host
            assert all(not list((h.spool / w).glob("seg-*.arrow")) for w in Spool(h.spool).workers())
        status = orjson.loads((tmp_path / "status" / "_factories.json").read_bytes())
        assert status["ready"]["frontier_ms"] == 19_000 and status["ready"]["holding"] == []
        reader.stop()
    finally:
        a.close()
        b.close()


def test_a_stopped_host_holds_the_frontier_and_is_read_exactly_once_when_it_returns(
    two: list[FactoryHost], ctx: zmq.Context, tmp_path: Path
) -> None:
    ha, hb = two
    a, b = HandSender(ctx, ha.endpoint, 6200), HandSender(ctx, hb.endpoint, 6201)
    try:
        for k in range(5):
            a.data(k, 1_000 * (k + 1))
            b.data(k, 1_000 * (k + 1))
        wait_rows(ha.spool, 50)
        wait_rows(hb.spool, 50)
        reader = _reader(two, tmp_path)
        start = reader.initialOffset()
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert end1["frontier"] == 4_999
        got1, _ = _batch(reader, start, end1)
        reader.commit(end1)
        os.killpg(hb.proc.pid, signal.SIGSTOP)  # host b is gone (its link, its machine)
        for k in range(5, 10):
            a.data(k, 1_000 * (k + 1))
        a.end()
        wait_for(lambda: _rows_from(ha.spool, 6_000) == 50, 30, "a's later buckets published")
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert end2 == end1  # b's last answer (4_999) holds the frontier: no batch past it
        status = orjson.loads((tmp_path / "status" / "_factories.json").read_bytes())
        assert status["waiting"] == [hb.server]
        assert status["ready"]["holding"] == [hb.server], status["ready"]
        assert status["ready"]["hosts"][hb.server]["answered"] is False
        os.killpg(hb.proc.pid, signal.SIGCONT)
        b.data(5, 6_000)
        b.end()
        wait_for(lambda: _rows_from(hb.spool, 6_000) == 10, 30, "b's later bucket published")
        wait_for(lambda: reader.latestOffset(end1, ReadAllAvailable())["frontier"] == 10_000, 60, "b back")
        end3 = reader.latestOffset(end1, ReadAllAvailable())
        got3, _ = _batch(reader, end1, end3)
        reader.commit(end3)
        assert sorted(rows_of(got1) + rows_of(got3)) == truth([a, b], NO_FRONTIER, 10_000)
        assert len(rows_of(got1) + rows_of(got3)) == a.emitted + b.emitted  # each tuple once
        reader.stop()
    finally:
        os.killpg(hb.proc.pid, signal.SIGCONT)
        a.close()
        b.close()


def test_rows_a_late_host_holds_behind_the_frontier_are_counted_on_that_host(
    two: list[FactoryHost], ctx: zmq.Context, tmp_path: Path
) -> None:
    ha, hb = two
    a = HandSender(ctx, ha.endpoint, 6300)
    late = None
    try:
        a.data(0, 10_000)
        a.data(1, 20_000)
        a.end()
        wait_rows(ha.spool, 20)
        reader = _reader(two, tmp_path)
        start = reader.initialOffset()
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert end1["frontier"] == 20_000  # host b has no sender: it does not hold the frontier
        assert len(_batch(reader, start, end1)[0]) == 20
        reader.commit(end1)
        late = HandSender(ctx, hb.endpoint, 6301)  # on host b, after the frontier passed its times
        late.data(0, 15_000, count=4)
        late.data(1, 25_000, count=3)
        late.end()
        wait_rows(hb.spool, 7)
        wait_for(lambda: reader.latestOffset(end1, ReadAllAvailable()) != end1, 30, "b's rows")
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert end2["frontier"] == 25_000
        got, _ = _batch(reader, end1, end2)
        assert rows_of(got) == truth([late], 20_000, 25_000)  # the 3 tuples at 25_000
        reader.commit(end2)
        reader.commit(end2)  # committed again (a restart): counted once
        recs = [r for r in Spool(hb.spool).skipped() if r["reason"] == LATE_REASON]
        assert len(recs) == 1 and recs[0]["rows"] == 4 and recs[0]["ranges"] == [[late.ids[0][0], 4]]
        assert not [r for r in Spool(ha.spool).skipped() if r["reason"] == LATE_REASON]
        reader.stop()
    finally:
        a.close()
        if late is not None:
            late.close()


def test_a_checkpoint_over_hosts_keeps_its_ordering(two: list[FactoryHost], tmp_path: Path) -> None:
    from cp_source.spool.segments import SpoolMismatchError

    ready = _reader(two, tmp_path)
    arrival = _reader(two, tmp_path, ordering="arrival")
    try:
        r0, a0 = ready.initialOffset(), arrival.initialOffset()
        with pytest.raises(SpoolMismatchError, match="ordering=arrival, this query reads with ordering=re"):
            ready.latestOffset(a0, ReadAllAvailable())
        with pytest.raises(SpoolMismatchError, match="ordering=ready, this query reads with ordering=arr"):
            arrival.latestOffset(r0, ReadAllAvailable())
    finally:
        ready.stop()
        arrival.stop()


# ---- the wire: requests and answers are checked and bounded -------------------------------------
@pytest.mark.parametrize(
    "msg",
    [
        {"op": "ready", "floor": "0", "timeout": 5},
        {"op": "ready", "floor": 0, "timeout": 0},
        {"op": "ready", "floor": 0, "timeout": 10**9},
        {"op": "ready", "floor": 1 << 62, "timeout": 5},
        {"op": "ready", "floor": 0, "timeout": 5, "cap": {"w0": "x"}},
        {"op": "ready_plan", "spool": "abcdef01", "lo": 5, "hi": 4, "offsets": {"w0": 1}},
        {"op": "ready_plan", "spool": "abcdef01", "lo": 0, "hi": 4, "offsets": {"w0": 1}, "after": [1]},
        {"op": "ready_plan", "spool": "abcdef01", "lo": 0, "hi": 4, "offsets": {"w0": 1}, "after": [-1, 0]},
        {"op": "ready_commit", "spool": "abcdef01", "frontier": 1.5, "offsets": {"w0": 1}},
        {"op": "ready_commit", "spool": "abcdef01", "frontier": 1, "offsets": {"w0": 1}, "since": True},
        {"op": "ready_commit", "frontier": 1, "offsets": {"w0": 1}},
    ],
)
def test_bad_ready_requests_are_rejected(msg: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_request(orjson.dumps(msg))


def test_ready_requests_parse() -> None:
    msg = {"op": "ready", "floor": NO_FRONTIER, "timeout": 2.5, "after": {"w1": 3}}
    want = {"floor": NO_FRONTIER, "timeout": 2.5, "cap": None}
    assert parse_request(orjson.dumps(msg)) == ControlRequest("ready", None, {"w1": 3}, want)
    raw = {"op": "ready_plan", "spool": "abcdef01", "lo": 1, "hi": 9, "offsets": {"w0": 4}, "after": [0, 2]}
    assert parse_request(orjson.dumps(raw)) == ControlRequest(
        "ready_plan", "abcdef01", {"w0": 4}, {"lo": 1, "hi": 9, "after": (0, 2)}
    )


GOOD_READY = {
    "frontier": 10,
    "holding": 1,
    "data_max": 20,
    "upto": {"w0": 3},
    "behind": False,
    "committed": {"w0": 1},
    "committed_frontier": 5,
    "senders": 2,
    "sender_ids": [1, 2],
    "ended": 1,
    "gone": [],
    "lost_buckets_declared": 0,
}


@pytest.mark.parametrize(
    "change",
    [
        {"frontier": "10"},
        {"holding": -1},
        {"upto": {"../w0": 3}},
        {"upto": {f"w{i}": 0 for i in range(65)}},
        {"behind": 0},
        {"sender_ids": list(range(1025))},
        {"committed": {"w0": 1 << 63}},
    ],
)
def test_a_malformed_ready_answer_is_refused(change: dict[str, Any]) -> None:
    assert parse_ready(GOOD_READY).frontier == 10
    with pytest.raises(ValueError):
        parse_ready({**GOOD_READY, **change})


@pytest.mark.parametrize(
    "reply",
    [
        {"segments": [[0, 1, 10, 5, 1, 2]], "more": "no"},
        {"segments": [[0, 1, 10, 5, 1]], "more": False},
        {"segments": [[64, 1, 10, 5, 1, 2]], "more": False},
        {"segments": [[0, -1, 10, 5, 1, 2]], "more": False},
        {"segments": [[0, 1, 10, 5, 1, 2]] * 8193, "more": False},
    ],
)
def test_a_malformed_ready_plan_is_refused(reply: dict[str, Any]) -> None:
    segs, more = parse_plan({"segments": [[1, 7, 10, 5, 1, 2]], "more": True}, "tcp://h:1", "abcdef01")
    assert more and segs[0].worker == "w1" and segs[0].number == 7
    with pytest.raises(ValueError):
        parse_plan(reply, "tcp://h:1", "abcdef01")


# ---- a real query over two factory hosts ---------------------------------------------------------
def _ready_query(spark: Any, hosts: list[FactoryHost], tmp_path: Path) -> Any:
    import cloudprofiler

    cloudprofiler.register(spark)
    return (
        spark.readStream.format("cloudprofiler")
        .option("factories", ",".join(h.server for h in hosts))
        .option("statusDir", str(tmp_path / "status"))
        .option("ordering", "ready")
        .option("senders", "2")
        .option("senderTimeout", "60")
        .option("progressLog", str(tmp_path / "plog"))
        .load()
        .writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "records"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


@pytest.mark.long
def test_a_ready_query_over_two_hosts_restarted_mid_stream_delivers_every_tuple_once_in_order(
    spark: Any, two: list[FactoryHost], tmp_path: Path
) -> None:
    import numpy as np

    import cloudprofiler
    from cp_sink import read_records
    from cp_source.reader.ingest_log import read_ingest_log
    from tests.helpers.ingest_truth import assert_exactly_once, expected_ids
    from tests.helpers.netns_hosts import GeneratorProcess

    def delivered() -> int:
        return len(read_records(tmp_path / "records")) if (tmp_path / "records").exists() else 0

    gens = [
        GeneratorProcess(h.endpoint, tmp_path / f"gen-{i}.json", 300 + i, 5_000, 12.0)
        for i, h in enumerate(two)
    ]
    query = _ready_query(spark, two, tmp_path)
    try:
        wait_for(lambda: delivered() > 10_000, 180, "the first batches", interval=0.2)
    finally:
        query.stop()  # mid-stream: a planned batch may be cut short and run again from the checkpoint
    first = delivered()
    summaries = [g.result() for g in gens]
    parts = [expected_ids(s, Spool(h.spool).stats())[0] for h, s in zip(two, summaries, strict=True)]
    want = np.sort(np.concatenate(parts))
    assert first < len(want), "the first query did not read everything"
    query = _ready_query(spark, two, tmp_path)  # the same checkpoint
    try:

        def done() -> bool:
            assert query.exception() is None, query.exception()
            return delivered() >= len(want)

        wait_for(done, 240, f"{len(want)} tuples in the sink", interval=0.5)
    finally:
        query.stop()
    assert_exactly_once(np.sort(read_records(tmp_path / "records")["tuple_id"].to_numpy()), want)
    # the batches' event times (from the ingest log, one row per bucket; a batch run again logs the
    # same buckets) are disjoint and ordered: every tuple of a batch is earlier than the next's
    log = read_ingest_log(tmp_path / "plog")
    assert sum(log["count"].to_pylist()) == len(want)
    spans = log.group_by("batch_key").aggregate([("event_ms_min", "min"), ("event_ms_max", "max")])
    pairs = sorted(
        zip(spans["event_ms_min_min"].to_pylist(), spans["event_ms_max_max"].to_pylist(), strict=True)
    )
    assert len(pairs) > 1 and all(a[1] < b[0] for a, b in zip(pairs, pairs[1:], strict=False)), pairs
    for h in two:
        assert _served(h) > 0, f"executors fetched from {h.server}"
        assert ReadyState.read(h.spool).frontier > NO_FRONTIER, f"a ready commit reached {h.server}"
        assert not [r for r in Spool(h.spool).skipped() if r["reason"] == LATE_REASON]
    status = cloudprofiler.source_status(tmp_path / "status")
    assert_keys(status, FactoriesStatus)  # the documented JSON form, section by section
    assert status["ready"]["frontier_ms"] >= max(b for _, b in pairs)
