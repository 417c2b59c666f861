"""The "cloudprofiler" stream reader: options, the segment server, offsets, admission control, reads."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from cp_source.hosts.segment_client import fetch_segment, server_stats
from cp_source.hosts.segment_protocol import MAX_REQUEST_BYTES, FetchError, SegmentRef, validate_request
from cp_source.hosts.segment_server import SegmentServer
from cp_source.reader.options import ReaderOptions, source_schema
from tests.helpers.filled_spool import fill_spool, spool_source

# ---- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"workers": "two"}, "workers"),
        ({"workers": "0"}, "workers"),
        ({"fetch": "nfs"}, "fetch"),
        ({"factory": "remote"}, "factory"),
        ({"maxRecordsPerTrigger": "-5"}, "maxRecordsPerTrigger"),
        ({"endpoint": "http://x"}, "endpoint"),
        ({"workload": "kafka"}, "workload"),
        ({"workload": "file:/tmp/x.ndjson"}, "schema"),
        ({"schema": "a INT"}, "schema"),
        ({"fetchTimeout": "soon"}, "fetchTimeout"),
        ({"maxRecordPerTrigger": "10"}, "'maxRecordPerTrigger', did you mean 'maxRecordsPerTrigger'"),
        ({"startingOffsets": "newest"}, "startingOffsets"),
    ],
)
def test_bad_option_is_named(options: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ReaderOptions.parse(options)


def test_options_are_case_insensitive_and_defaulted() -> None:
    o = ReaderOptions.parse({"MAXRECORDSPERTRIGGER": "1000", "Workers": "3", "fetch": "NETWORK"})
    assert (o.max_records, o.workers, o.fetch, o.factory) == (1000, 3, "network", "embedded")
    assert o.starting_offsets == "earliest"  # loses nothing; see docs/reader.md
    assert ReaderOptions.parse({"STARTINGOFFSETS": " Latest "}).starting_offsets == "latest"
    assert o.server_bind == "127.0.0.1"
    assert o.spool  # a per-endpoint default under the temp dir


def test_schema_has_segment_columns_and_source_stamps(tmp_path: Path) -> None:
    names = source_schema(ReaderOptions.parse({})).fieldNames()
    for col in (
        "ad_id",
        "event_type",
        "event_time",
        "tuple_id",
        "sender_id",
        "cp_tsc_gen",
        "cp_node_gen",
        "cp_tsc_factory",
        "cp_node_factory",
    ):
        assert col in names
    assert names[-2:] == ["cp_tsc_source", "cp_node_source"]
    data = tmp_path / "x.ndjson"  # the file is there: a missing one fails (test_reader_errors.py)
    data.write_text('{"name": "a", "price": 1.5}\n')
    ddl = ReaderOptions.parse({"workload": f"file:{data}", "schema": "name STRING, price DOUBLE"})
    file_names = source_schema(ddl).fieldNames()
    assert file_names[:2] == ["name", "price"] and file_names[-2:] == ["cp_tsc_source", "cp_node_source"]


# ---- segment server ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"op": "rm"}',
        b'{"op": "segment", "worker": "../../etc", "number": 1}',
        b'{"op": "segment", "worker": "w0/../w1", "number": 1}',
        b'{"op": "segment", "worker": "w0", "number": -1}',
        b'{"op": "segment", "worker": "w0", "number": "1"}',
        b'{"op": "segment", "worker": "w0", "number": true}',
        b'{"op": "segment", "worker": "w0", "number": 1e300}',
        b'{"op": "segment", "worker": "w0", "number": 99999999999999999999999999}',
        b'{"op": "segment", "worker": "w0", "number": 4611686018427387904}',
        b'{"op": "segment", "worker": "w0", "number": 1, "pad": "' + b"x" * MAX_REQUEST_BYTES + b'"}',
    ],
)
def test_bad_requests_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValueError):
        validate_request(raw)


@given(
    st.one_of(
        st.binary(max_size=600),
        st.builds(
            orjson.dumps,
            st.dictionaries(
                st.sampled_from(["op", "worker", "number", "x"]),
                st.one_of(
                    st.text(max_size=20),
                    st.integers(-(2**63), 2**63 - 1),
                    st.floats(),
                    st.booleans(),
                    st.none(),
                ),
            ),
        ),
    )
)
@settings(max_examples=300, deadline=None)
def test_request_parser_never_crashes(raw: bytes) -> None:
    try:
        op, worker, number = validate_request(raw)
    except ValueError:
        return
    assert op in ("stats", "segment")
    if op == "segment":
        assert worker is not None and worker[0] == "w" and worker[1:].isdigit()
        assert isinstance(number, int) and number >= 0


def _write_ipc(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


@pytest.fixture
def served(tmp_path: Path):
    """A segment server over two Arrow IPC files in tmp_path, and a file outside it."""
    root = tmp_path / "spool"
    root.mkdir()
    tables = {("w0", 0): pa.table({"tuple_id": list(range(5))}), ("w1", 3): pa.table({"tuple_id": [7, 8]})}
    refs: dict[tuple[str, int], SegmentRef] = {}
    for (w, n), t in tables.items():
        p = root / f"{w}-{n}.arrow"
        _write_ipc(p, t)
        refs[(w, n)] = SegmentRef(str(p), t.num_rows, p.stat().st_size)
    outside = tmp_path / "secret.arrow"
    _write_ipc(outside, pa.table({"x": [1]}))
    refs[("w9", 0)] = SegmentRef(str(outside), 1, outside.stat().st_size)
    server = SegmentServer(lambda w, n: refs.get((w, n)), root, stats_path=root / "_stats.json")
    yield server, tables, root
    server.stop()


def test_segment_server_serves_exact_bytes_and_counts(served) -> None:
    server, tables, root = served
    assert server.endpoint.startswith("tcp://127.0.0.1:")
    for (w, n), t in tables.items():
        body = fetch_segment(server.endpoint, w, n, timeout=10)
        assert pa.ipc.open_file(pa.py_buffer(body)).read_all().equals(t)
    with pytest.raises(FetchError, match="not in the spool"):
        fetch_segment(server.endpoint, "w0", 1, timeout=10)
    with pytest.raises(FetchError, match="outside the spool"):
        fetch_segment(server.endpoint, "w9", 0, timeout=10)
    stats = server_stats(server.endpoint)
    assert stats["segments_served"] == 2 and stats["rows_served"] == 7
    assert stats["missing"] == 1 and stats["rejected"] == 1
    assert orjson.loads((root / "_stats.json").read_bytes())["segments_served"] == 2


def test_segment_server_survives_garbage_frames(served) -> None:
    server, tables, _ = served
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(server.endpoint)
        dealer.send_multipart([b"no delimiter", b"x"])  # not REQ framing: dropped
        dealer.send_multipart([b"", b"\xff" * 100])  # REQ framing, not JSON: answered with an error
        assert dealer.poll(10_000)
        head = orjson.loads(dealer.recv_multipart()[-1])
        assert head["ok"] is False
        dealer.close(0)
    finally:
        ctx.term()
    body = fetch_segment(server.endpoint, "w1", 3, timeout=10)
    assert pa.ipc.open_file(pa.py_buffer(body)).read_all().equals(tables[("w1", 3)])


def test_server_bound_to_all_interfaces_advertises_the_given_host(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    root.mkdir()
    p = root / "w0-0.arrow"
    _write_ipc(p, pa.table({"tuple_id": [1, 2, 3]}))
    ref = SegmentRef(str(p), 3, p.stat().st_size)
    server = SegmentServer(
        lambda w, n: ref if (w, n) == ("w0", 0) else None,
        root,
        bind="tcp://0.0.0.0:0",
        advertise_host="127.0.0.1",
    )
    try:
        assert server.bound.startswith("tcp://0.0.0.0:")
        assert server.endpoint == "tcp://127.0.0.1:" + server.bound.rsplit(":", 1)[1]
        assert len(fetch_segment(server.endpoint, "w0", 0, timeout=10)) == ref.nbytes
    finally:
        server.stop()


def test_fetch_times_out_when_nobody_answers() -> None:
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(FetchError, match="no answer"):
            fetch_segment(f"tcp://127.0.0.1:{port}", "w0", 0, timeout=0.5)
    finally:
        silent.close(0)
        ctx.term()


# ---- reading a spool with Spark ----------------------------------------------------------------------


def _read_ids(spark, path: Path) -> list[int]:
    return [r.tuple_id for r in spark.read.parquet(str(path)).select("tuple_id").collect()]


@pytest.mark.parametrize("fetch", ["local", "network"])
def test_available_now_reads_every_row_once_and_commits(spark, tmp_path: Path, fetch: str) -> None:
    import native_tsc
    from cp_source.spool.segments import Spool
    from tests.helpers.streaming import run_available_now

    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [300, 200, 100], "w1": [50, 250]})
    df = spool_source(spark, spool, fetch=fetch, segmentsPerPartition="2")
    out = tmp_path / "out"
    run_available_now(df, "parquet", str(tmp_path / "ckpt"), str(out))
    got = spark.read.parquet(str(out))
    assert got.columns[-2:] == ["cp_tsc_source", "cp_node_source"]
    ids_out = _read_ids(spark, out)
    assert len(ids_out) == len(ids) and set(ids_out) == ids
    stamps = got.select("cp_tsc_source", "cp_node_source").distinct().collect()
    assert {r.cp_node_source for r in stamps} == {native_tsc.domain_id()}
    assert all(r.cp_tsc_source > 0 for r in stamps)
    assert got.filter("event_type NOT IN ('view', 'click', 'purchase')").count() == 0
    # Spark commits a batch's end to the source only when it plans the next batch with data, so
    # after a single batch nothing is committed and every segment is still there to replay.
    assert Spool(spool).committed() == {"w0": -1, "w1": -1}
    assert len(list(spool.glob("w*/seg-*.arrow"))) == 5
    stats_file = spool / "_segment_server.json"
    if fetch == "network":
        served = orjson.loads(stats_file.read_bytes())
        assert served["segments_served"] == 5 and served["rows_served"] == len(ids)
    else:
        assert not stats_file.exists()  # fetch=local starts no segment server


def test_admission_control_admits_whole_segments_interleaved(spark, tmp_path: Path) -> None:
    from tests.helpers.streaming import await_query

    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [10, 20, 10], "w1": [5, 5]})
    df = spool_source(spark, spool, maxRecordsPerTrigger="25", fetch="local")
    out = tmp_path / "out"
    writer = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .option("path", str(out))
        .trigger(availableNow=True)
    )
    query = writer.start()
    await_query(query, 120)
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    sizes = [p["numInputRows"] for p in progress]
    # w0: 10 + w1: 5, then 20 + 5 (a third segment would pass 25 rows), then the last 10.
    assert sizes == [15, 25, 10]
    # reportLatestOffset: the progress shows how far the spool is ahead of each batch
    from cp_source.spool.segments import Spool

    latest = [p["sources"][0]["latestOffset"] for p in progress]
    want = {"spool": Spool(spool).spool_id(), "w0": 2, "w1": 1}  # an offset names its spool
    assert [json.loads(x) if isinstance(x, str) else x for x in latest] == [want] * 3
    assert sorted(_read_ids(spark, out)) == sorted(ids)
    # The second batch's end was committed when the third was planned: its segments are gone,
    # the last batch's segment stays until a later batch commits it.
    assert Spool(spool).committed() == {"w0": 1, "w1": 1}
    assert sorted(p.name for p in spool.glob("w*/seg-*.arrow")) == ["seg-000000000002.arrow"]


def test_bad_option_fails_the_query_with_the_option_named(spark) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    with pytest.raises(Exception, match="option fetch='nfs'"):
        spark.readStream.format("cloudprofiler").option("fetch", "nfs").load()


def test_file_workload_with_a_ddl_schema(spark, tmp_path: Path) -> None:
    """A user's NDJSON replayed by the generator, parsed by the factory, typed by the reader's schema."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool
    from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, output_ids
    from tests.helpers.streaming import run_available_now

    data = tmp_path / "events.ndjson"
    data.write_text(
        "".join(
            orjson.dumps({"name": f"item{i}", "price": i * 0.5, "qty": i}).decode() + "\n" for i in range(7)
        )
    )
    ddl = "name STRING, price DOUBLE, qty BIGINT"
    spool = tmp_path / "spool"
    with start_factory("tcp://127.0.0.1:0", spool, workers=1, workload="file", schema=ddl) as factory:
        summary = run_generator(
            factory.endpoint, GeneratorSettings(rate=5_000, duration=1.0, bucket=100, workload=f"file:{data}")
        )
        assert factory.wait_drained(30)
    df = spool_source(spark, spool, workload=f"file:{data}", schema=ddl)
    assert [f.simpleString() for f in df.schema.fields[:3]] == ["name:string", "price:double", "qty:bigint"]
    out = tmp_path / "out"
    run_available_now(df, "parquet", str(tmp_path / "ckpt"), str(out))
    want, _ = expected_ids(summary, Spool(spool).stats())
    assert_exactly_once(output_ids(spark, out), want)
    rows = spark.read.parquet(str(out)).select("name", "price", "qty").distinct().collect()
    assert sorted((r.name, r.price, r.qty) for r in rows) == [(f"item{i}", i * 0.5, i) for i in range(7)]


def test_embedded_factory_on_a_busy_endpoint_names_the_option(spark, tmp_path: Path) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    ctx = zmq.Context()
    holder = ctx.socket(zmq.PULL)
    holder.setsockopt(zmq.LINGER, 0)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    try:
        df = (
            spark.readStream.format("cloudprofiler")
            .option("endpoint", f"tcp://127.0.0.1:{port}")
            .option("spool", str(tmp_path / "spool"))
            .load()
        )
        query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start()
        try:
            with pytest.raises(Exception, match="option endpoint="):
                query.awaitTermination(120)
        finally:
            query.stop()
    finally:
        holder.close(0)
        ctx.term()
