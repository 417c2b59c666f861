"""maxrate on a user's data and a user's query: the workload and --query checked up front, and a
real search on a file workload through a transformation loaded from a user's module."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cloudprofiler.cli import main
from cloudprofiler.errors import CommandError
from cloudprofiler.jobs.user_query import apply_query, load_query, query_transform

SCHEMA = "name STRING, price DOUBLE"
QUERY = """
import time

from pyspark.sql import functions as F

from cp_source.wire.bucket import SEQ_BITS


def transform(events):
    # drops every third tuple and adds a column: what the sink gets is not what the source read
    return events.filter(F.col("tuple_id") % 3 != 0).withColumn("label", F.upper("name"))


def no_id(events):
    return events.drop("tuple_id")


def no_stamp(events):
    return events.select("tuple_id", "name")


def string_id(events):
    return events.withColumn("tuple_id", F.col("tuple_id").cast("string"))


def boom(events):
    raise RuntimeError("user code failed")


def not_a_frame(events):
    return 42


def counts(events):
    latest = F.struct("event_time", "tuple_id")
    return (
        events.withWatermark("event_time", "2 seconds")
        .groupBy(F.window("event_time", "1 second"), "name")
        .agg(*(F.max_by(c, latest).alias(c) for c in ("tuple_id", "cp_tsc_gen", "cp_node_gen")))
    )


def static_lookup(events):
    # an aggregation on a static table joined to the stream is per tuple on the stream's side
    lookup = events.sparkSession.createDataFrame([("a", 1)], "name string, k int").groupBy("name").count()
    return events.join(F.broadcast(lookup), "name")


def _first_200(tuple_id):
    # a sender's tuples from the 391st on take 0.4 s each: the end of a 400-tuple load is read late
    seq = tuple_id & ((1 << SEQ_BITS) - 1)
    if seq >= 390:
        time.sleep(0.4)
    return seq < 200


def first_200(events):
    # keeps each sender's first 200 tuples: half of a 400-tuple load, all of a 100-tuple one
    return events.filter(F.udf(_first_200, "boolean")("tuple_id"))


def _explode(tuple_id):
    raise ValueError(f"user code failed on tuple {tuple_id}")


def fails_when_run(events):
    # builds fine; the first micro-batch with rows fails in the user's function
    return events.filter(F.udf(_explode, "boolean")("tuple_id"))


NOT_CALLABLE = 3
"""


@pytest.fixture
def query_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_q.py"
    path.write_text(textwrap.dedent(QUERY))
    return path


def _maxrate_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["maxrate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_bad_workload_is_one_line_before_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "events.ndjson"
    data.write_text('{"name": "a", "price": 1.0}\n')
    assert "unknown workload" in _maxrate_error(["--workload", "kafka:x"], capsys)
    assert "schema" in _maxrate_error(["--workload", f"file:{data}"], capsys)
    missing = tmp_path / "absent.ndjson"
    err = _maxrate_error(["--workload", f"file:{missing}", "--schema", SCHEMA], capsys)
    assert f"{missing}: no such NDJSON file" in err
    assert "file:PATH" in _maxrate_error(["--workload", "file", "--schema", SCHEMA], capsys)
    err = _maxrate_error(["--workload", f"file:{tmp_path}", "--schema", SCHEMA], capsys)
    assert f"{tmp_path}: not a file (give one NDJSON file)" in err
    assert f"{tmp_path}/absent.parquet" in _maxrate_error(
        ["--workload", f"parquet:{tmp_path}/absent.parquet"], capsys
    )
    err = _maxrate_error(["--sink", str(tmp_path), "--spool", str(tmp_path), "--query", "m:f"], capsys)
    assert "not with --sink" in err


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("no_colon_here", "expected module:function"),
        ("cp_no_such_module_xyz:transform", "no module named 'cp_no_such_module_xyz'"),
        ("json:no_such_function", "json has no 'no_such_function'"),
        ("{file}:NOT_CALLABLE", "'NOT_CALLABLE' is not a function (a int)"),
        ("{dir}/absent.py:transform", "absent.py does not exist"),
        ("{file}:", "expected module:function"),
    ],
)
def test_a_bad_query_spec_is_one_line_naming_it(
    spec: str, why: str, query_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec.format(file=query_file, dir=query_file.parent)
    err = _maxrate_error(["--query", spec], capsys)
    assert f"--query {spec}: " in err and why in err, err


def test_a_module_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("raise ImportError('needs a package you do not have')\n")
    with pytest.raises(CommandError, match=r"importing .*broken.py raised ImportError: needs a package"):
        load_query(f"{bad}:transform")


def test_a_module_is_found_in_the_current_directory(
    query_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(query_file.parent)
    monkeypatch.delitem(sys.modules, "user_q", raising=False)
    try:
        fn = load_query("user_q:transform")
        assert fn.__name__ == "transform" and fn.__module__ == "user_q"
        assert str(query_file.parent) not in sys.path  # the directory was added for the import only
    finally:
        sys.modules.pop("user_q", None)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("boom", "raised RuntimeError: user code failed"),
        ("not_a_frame", "returned int, expected a DataFrame"),
        ("no_id", "the result lacks tuple_id"),
        ("no_stamp", "the result lacks cp_tsc_gen, cp_node_gen"),
        ("string_id", "tuple_id is string, expected bigint"),
        ("counts", "Aggregate on the stream keeps state across micro-batches"),
    ],
)
def test_what_the_query_returns_is_checked(spark: Any, query_file: Path, name: str, why: str) -> None:
    """Checked on a stream of the source's columns before any query starts (analysis only)."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("rate")
        .load()
        .select(
            F.lit("a").alias("name"),
            F.col("value").alias("tuple_id"),
            F.col("value").alias("cp_tsc_gen"),
            F.lit("n").alias("cp_node_gen"),
            F.col("timestamp").alias("event_time"),
        )
    )
    spec = f"{query_file}:{name}"
    with pytest.raises(CommandError) as e:
        apply_query(load_query(spec), spec, events)
    assert str(e.value).startswith(f"--query {spec}: ") and why in str(e.value), str(e.value)
    for fine, last in (("transform", "label"), ("static_lookup", "count")):
        assert apply_query(load_query(f"{query_file}:{fine}"), fine, events).columns[-1] == last


@pytest.mark.long  # a real query and 2 generator runs: about 40 s on a loaded 2-core machine
@pytest.mark.timeout(300)
def test_search_on_a_file_through_a_users_query(spark: Any, tmp_path: Path, query_file: Path) -> None:
    """A tiny linear search on a file workload through a user's filter + withColumn.

    Every trial's ledger balances (emitted = in the sink + lost + filtered by the query), and the
    sink holds exactly the ids of the trial that the query keeps (ids % 3 != 0, none dropped).
    """
    from cloudprofiler.jobs.maxrate import find_max_rate
    from cloudprofiler.jobs.queries import start_source_query
    from cp_sink.records import read_records

    data = tmp_path / "events.ndjson"
    data.write_text("".join(json.dumps({"name": f"n{i}", "price": i / 4}) + "\n" for i in range(40)))
    target, query = start_source_query(
        spark,
        tmp_path / "q",
        transform=query_transform(f"{query_file}:transform"),
        may_filter=True,
        workload=f"file:{data}",
        schema=SCHEMA,
        handler="id",
        bucket=100,
    )
    try:
        result, trial, attempts = find_max_rate(
            target,
            method="linear",
            start=300,
            increment=300,
            max_rate=600,
            duration=1.0,
            grace=30.0,  # the first trial starts Spark's Python workers
            retries=0,
            warm_up=False,
            max_steps=2,
        )
    finally:
        query.stop()
    assert result.max_rate == 600 and len(attempts) == 2, (result, attempts)
    ids = read_records(target.sink)["tuple_id"].to_pylist()
    assert len(set(ids)) == len(ids)
    for step, h in zip(attempts, trial.history, strict=True):
        assert step.verdict == "sustained" and step.dropped == 0 and step.lost == 0, step
        assert step.emitted == step.received + step.filtered + step.lost
        sent = {i for first, nxt in h["id_ranges"] for i in range(first, nxt)}
        assert len(sent) == step.emitted and not h["dropped_ranges"]
        kept = {i for i in sent if i % 3 != 0}
        assert {i for i in ids if i in sent} == kept
        assert step.received == len(kept) and step.filtered == len(sent) - len(kept) > 0


@pytest.mark.long  # a real query, two loads, and 4 s of a UDF's sleep: about 30 s on a loaded 2-core machine
@pytest.mark.timeout(300)
def test_a_trial_whose_filtered_tuples_are_read_after_the_grace_is_not_sustained(
    spark: Any, tmp_path: Path, query_file: Path
) -> None:
    """A query that filters half of a load's tuples, and reads the filtered half late.

    The kept half (the first 200 tuples) is written at once; the last 10 tuples take 4 s of a UDF,
    so the query has read the load only seconds after the grace ran out. The trial lands late and
    is not sustained; what was received and filtered is counted at the instant the grace ran out.
    """
    from cloudprofiler.jobs.pipeline_trial import PipelineTrial
    from cloudprofiler.jobs.queries import start_source_query
    from cp_sink.records import read_records
    from cp_source.wire.bucket import SEQ_BITS

    data = tmp_path / "events.ndjson"
    data.write_text("".join(json.dumps({"name": f"n{i}", "price": i / 4}) + "\n" for i in range(40)))
    target, query = start_source_query(
        spark,
        tmp_path / "q",
        transform=query_transform(f"{query_file}:first_200"),
        may_filter=True,
        workload=f"file:{data}",
        schema=SCHEMA,
        handler="id",
        bucket=50,
    )
    trial = PipelineTrial(target, duration=1.0, grace=30.0)  # the first load starts Python workers
    try:
        warm = trial(100)
        # 400 tuples in 4 s: the kept half in the first 2 s, the slow tail 2 s after it
        trial.duration, trial.grace = 4.0, 1.5
        slow = trial(100)
    finally:
        query.stop()
    assert warm.judge(None) == "sustained" and (warm.emitted, warm.received, warm.filtered) == (100, 100, 0)
    assert slow.landing is not None and slow.grace == 1.5 and slow.landing > slow.grace + 1, slow
    assert slow.judge(None) == "backlog", slow
    assert slow.emitted == 400 and slow.dropped == slow.lost == 0, slow
    assert slow.received + slow.filtered + slow.pending == 400 and slow.pending > 0, slow
    # drained: the sink holds exactly the kept half, the other half was read and filtered
    h = trial.history[-1]
    sent = {i for first, nxt in h["id_ranges"] for i in range(first, nxt)}
    kept = {i for i in sent if i & ((1 << SEQ_BITS) - 1) < 200}
    ids = read_records(target.sink)["tuple_id"].to_pylist()
    assert {i for i in ids if i in sent} == kept and len(kept) == 200
    assert (h["received_after_drain"], h["filtered_after_drain"]) == (200, 200)
    # the run's page: both trials' ledgers, the ingestion rate, the latency of the sustained trial's records
    from cloudprofiler.jobs.maxrate import ingestion_rows
    from cloudprofiler.jobs.rate_search import SearchResult
    from cloudprofiler.report.runs import maxrate_latency, write_maxrate_run
    from cp_store.location import resolve

    attempts = [warm, slow]
    page = write_maxrate_run(
        resolve(tmp_path / "run"),
        SearchResult(100.0, "linear", attempts, "backlog at 100 tuples/s"),
        attempts,
        argparse.Namespace(duration=4.0),
        "q",
        ingestion_rows(target.sink, trial.history),
        maxrate_latency(target.sink, attempts, trial.history),
    )
    text = Path(page.path).read_text()
    assert "data-plot='ingestion'" in text and "data-plot='latency'" in text
    assert "<td data-q='count'>100</td>" in text  # the sustained trial's records, not the backlog's


@pytest.mark.long  # a real query through one trial: about 20 s
def test_a_query_that_fails_during_a_trial_is_one_line_and_exit_1(
    spark: Any, tmp_path: Path, query_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial whose query dies is not the user's arguments (exit 2) but a failed run (exit 1), told
    in one line that names the user's error, never a traceback."""
    data = tmp_path / "events.ndjson"
    data.write_text("".join(json.dumps({"name": f"n{i}", "price": i / 4}) + "\n" for i in range(10)))
    argv = ["maxrate", "--workload", f"file:{data}", "--schema", SCHEMA]
    argv += ["--query", f"{query_file}:fails_when_run", "--start", "100", "--duration", "0.5"]
    argv += ["--retries", "0", "--max-steps", "1", "--grace", "30", "--out", str(tmp_path / "run")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("cloudprofiler maxrate: failed: the query under test stopped: "), err
    assert "ValueError: user code failed on tuple" in err, err
