"""What a new user meets first: one-line errors for a misspelled sink option or an unusable spool,
one handler name, and a payload that does not fit the schema dead-lettered, not turned into nulls."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest

from cloudprofiler.children import CLI_ARGV
from cp_sink.handlers import parse_handler, selected_positions
from cp_sink.records import published_batches, read_records
from cp_sink.stream_writer import CloudprofilerStreamWriter

SINK_TYPO = (
    "unknown option for the cloudprofiler sink: 'handlr', did you mean 'handler'? "
    "(names as Spark passes them, lower-cased; valid: path, handler, n, x, y, periodMs, tupleIdColumn, "
    "keepColumns, windowColumn, durability, sync, syncEvery, curveKeys, syncPort)"
)


def _schema():  # type: ignore[no-untyped-def]
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("tuple_id", LongType())])


def test_sink_refuses_an_unknown_option_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        CloudprofilerStreamWriter(_schema(), {"path": str(tmp_path), "handlr": "null"}, False)
    assert str(e.value) == SINK_TYPO
    assert list(tmp_path.iterdir()) == []  # refused before anything is written
    # Spark's own options and any case of the sink's are accepted
    opts = {"PATH": str(tmp_path), "checkpointLocation": "c", "queryName": "q", "HANDLER": "xoy", "Y": "8"}
    w = CloudprofilerStreamWriter(_schema(), opts, False)
    assert w.spec.describe() == "xoy(x=2,y=8)"


def test_query_with_a_misspelled_sink_option_fails_naming_it(spark, tmp_path: Path) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    df = spark.range(0, 10).withColumnRenamed("id", "tuple_id")
    src = tmp_path / "in"
    df.write.parquet(str(src))
    stream = spark.readStream.schema("tuple_id long").parquet(str(src))
    q = (
        stream.writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "out"))
        .option("handlr", "null")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as e:  # awaitTermination raises the query's failure
        q.awaitTermination(180)
    # the first line of Spark's error ends with the sink's own, whole (no Python traceback before it)
    assert (
        str(e.value)
        .splitlines()[0]
        .endswith(f"Failed to initialize Python data source writer: ValueError: {SINK_TYPO}")
    )
    assert published_batches(tmp_path / "out") == {}
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("batch=*"))


def test_identity_is_the_one_handler_name_and_id_its_alias() -> None:
    ids = np.arange(10, dtype=np.int64)
    assert parse_handler("identity") == parse_handler("id") == parse_handler(" ID ")
    assert parse_handler("id").name == "identity"
    assert selected_positions(parse_handler("id"), ids) is None
    with pytest.raises(ValueError) as e:
        parse_handler("ident")
    assert str(e.value) == (
        "unknown handler 'ident', did you mean 'identity'? "
        "(expected one of identity, downsample, xoy, firstlast, pc, null)"
    )


def test_sink_default_handler_keeps_every_tuple(tmp_path: Path) -> None:
    import pyarrow as pa

    w = CloudprofilerStreamWriter(_schema(), {"path": str(tmp_path / "out")}, False)
    assert w.spec.name == "identity"
    batch = pa.record_batch([pa.array(np.arange(50, dtype=np.int64))], names=["tuple_id"])
    w.commit([w.write(iter([batch]))], 0)
    assert sorted(read_records(tmp_path / "out")["tuple_id"].to_pylist()) == list(range(50))


@pytest.mark.parametrize(
    ("spool", "why"),
    [
        ("/proc/x", "/proc is on a proc filesystem (made by the kernel), which holds no spool"),
        ("/proc/self/nope/deeper", "on a proc filesystem (made by the kernel), which holds no spool"),
        ("{file}/spool", "{file} is a file, not a directory"),
    ],
)
def test_factory_with_an_unusable_spool_says_which_path_and_why(tmp_path: Path, spool: str, why: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    spool, why = spool.format(file=afile), why.format(file=afile)
    run = subprocess.run(
        [*CLI_ARGV, "factory", "--spool", spool, "--endpoint", "tcp://127.0.0.1:0", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"cloudprofiler factory: error: --spool {spool}: cannot create {spool}: ")
    assert why in lines[0]
    assert lines[0].endswith("; give a directory on a disk you can write")


# ---- a payload that does not fit the schema ---------------------------------------------------


def _fields(ddl: str):  # type: ignore[no-untyped-def]
    from cp_source.wire.workloads import parse_ddl

    return parse_ddl(ddl)


@pytest.mark.parametrize("parser", ["orjson", "arrow"])
def test_a_line_with_none_of_the_schemas_fields_is_rejected_naming_them(parser: str) -> None:
    from cp_source.factory.parse_json import parse_arrow_json, parse_orjson
    from cp_source.wire.bucket import BucketError

    parse = parse_orjson if parser == "orjson" else parse_arrow_json
    fields = _fields("a INT, b STRING")
    ok = parse(b'{"a": 1, "b": "x"}\n{"a": null}\n{"b": "y", "other": 3}\n', fields, 3)
    assert ok.to_pydict() == {"a": [1, None, None], "b": ["x", None, "y"]}  # a missing key is null
    with pytest.raises(BucketError) as e:
        parse(b'{"a": 1}\n{"user_id": "u", "ad_id": "d"}\n', fields, 2)
    assert e.value.reason == "bad_json"
    assert str(e.value).endswith(
        "line 2 does not fit the schema: it has none of its fields (a, b); its keys: ad_id, user_id"
    )


@pytest.mark.parametrize("ddl", ["a INT", "a STRING"])  # the arrow parser, and the string-only one
def test_ysb_buckets_into_a_file_schema_are_dead_lettered_not_null_rows(tmp_path: Path, ddl: str) -> None:
    import zmq

    from cp_source.factory.deadletter import read_dead_letters
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.file_check import BadFileLine
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.wire.workloads import ysb_rows
    from tests.helpers.ready_sender import HandSender

    rows = tmp_path / "ysb.ndjson"
    rows.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ysb_rows(100)))
    f = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=1, workload="file:", schema=ddl)
    ctx = zmq.Context()
    try:
        # the generator, replaying the file without its schema, checks it against the factory's
        # (announced in its answer to the hello) and sends nothing
        with pytest.raises(
            BadFileLine, match=r"ysb.ndjson line 1: does not fit the schema: it has none of its fields \(a\)"
        ):
            run_generator(
                f.endpoint, GeneratorSettings(rate=20_000, duration=0.1, bucket=1000, workload=f"file:{rows}")
            )
        # another producer, which names no workload and checks nothing, reaches the workers
        hand = HandSender(ctx, f.endpoint, 4242)
        hand.data(0, 1, 50)
        hand.data(1, 2, 50)
        hand.end()
        hand.close()
        assert f.wait_drained(60, senders=[4242])
        st = f.spool_view().stats()
    finally:
        f.stop()
        ctx.term()
    assert st.rows == 0
    assert st.deadletters == {"bad_json": 100}  # every row rejected alone, with its reason
    assert st.rejected_buckets == 2
    letters = list(read_dead_letters(tmp_path / "spool" / "w0" / "deadletter.bin"))
    assert [reason for reason, _ in letters] == ["bad_json"] * 100


# ---- knowing when to start sending ------------------------------------------------------------


@pytest.mark.long  # over 8 s: keeps the quick tier within its budget
def test_generate_with_wait_ready_started_with_the_query_drops_nothing(spark, tmp_path: Path) -> None:
    """``generate --wait-ready`` started right after ``start()`` (the factory still starting) waits for
    the factory's acknowledgement: nothing is dropped and every tuple reaches the sink once. The send
    queue holds 1 s (--queue-ms) so a scheduling stall on a busy test machine is not a drop."""
    import json
    import socket

    import cloudprofiler
    from cp_sink.records import total_seen
    from tests.helpers.polling import wait_for

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cloudprofiler.register(spark)
    events = spark.readStream.format("cloudprofiler").option("endpoint", endpoint)
    events = events.option("spool", str(tmp_path / "spool")).load()
    records, summary = tmp_path / "records", tmp_path / "run.json"
    query = (
        events.writeStream.format("cloudprofiler")
        .option("path", str(records))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        gen = subprocess.run(
            [*CLI_ARGV, "generate", "--endpoint", endpoint, "--rate", "50000", "--duration", "1",
             "--wait-ready", "240", "--queue-ms", "1000", "--summary", str(summary)],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr
        s = json.loads(summary.read_text())
        first = s["senders"][0]["first_tuple_id"]
        where = [(lo - first, n) for lo, n in s["senders"][0]["dropped_ranges"]]  # (offset, count)
        assert (s["emitted"], s["dropped"], s["eos_delivered"]) == (50_000, 0, True), where
        wait_for(lambda: total_seen(records) >= 50_000 or not query.isActive, 240, "the sink")
        assert query.exception() is None
    finally:
        query.stop()
    ids = read_records(records)["tuple_id"].to_numpy()
    assert len(ids) == 50_000 == len(np.unique(ids))


def test_generate_queue_ms_sizes_each_senders_queue_in_buckets() -> None:
    from cp_source.generate.cli import MAX_QUEUE_BUCKETS, queue_buckets

    assert queue_buckets(None, 50_000, 1, 1000) is None  # the generator's own default
    assert queue_buckets(1000, 50_000, 1, 1000) == 50  # one second of a sender's buckets
    assert queue_buckets(1000, 50_000, 2, 1000) == 25
    assert queue_buckets(1, 1000, 1, 1000) == 8  # never below the default's floor
    assert queue_buckets(60_000, 1e8, 1, 1) == MAX_QUEUE_BUCKETS
