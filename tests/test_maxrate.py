"""maxrate: trials against a real query, and the search finding a known capacity."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudprofiler.cli import main
from cloudprofiler.maxrate import find_max_rate, plot_ingestion
from cloudprofiler.pipeline_trial import PipelineTrial
from cloudprofiler.queries import start_source_query, throttle, ysb_stateless
from cloudprofiler.sink_counter import SinkCounter

CAPACITY = 10_000.0  # rows/s the throttled stage lets through; well below this machine's unthrottled query


@pytest.fixture
def throttled(spark: Any, tmp_path: Path) -> Iterator[Any]:
    """The cloudprofiler source -> YSB join -> a stage capped at CAPACITY rows/s -> the sink."""
    target, query = start_source_query(
        spark,
        tmp_path / "q",
        transform=lambda ev: throttle(ysb_stateless(ev), CAPACITY, tmp_path / "thr"),
        max_spool_bytes=32 << 20,
        bucket=500,
        handler="id",
    )
    yield target
    query.stop()


@pytest.mark.long
@pytest.mark.timeout(400)
def test_maxrate_finds_throttled_capacity(throttled: Any, tmp_path: Path) -> None:
    result, trial, attempts = find_max_rate(
        throttled,
        method="bisect",
        start=CAPACITY * 0.9,
        tolerance=0.08,
        duration=10.0,
        grace=None,
        retries=1,
        max_steps=10,
        progress=print,
    )
    print("grace", trial.grace, "landing", trial.landing_s)
    assert result.max_rate is not None, result.stopped_because
    assert abs(result.max_rate - CAPACITY) <= 0.10 * CAPACITY, (result.max_rate, result.stopped_because)
    # every sustained attempt: the sink committed exactly what the generator emitted, nothing dropped
    sustained = [s for s in attempts if s.verdict == "sustained"]
    assert sustained and all(s.received == s.emitted and s.dropped == 0 and s.lost == 0 for s in sustained)
    assert any(s.rate > CAPACITY and s.verdict in ("drop", "backlog") for s in attempts)
    # the id handler kept every tuple: the records hold each sustained trial's ids exactly once
    from cp_sink.records import read_records

    ids = read_records(throttled.sink)["tuple_id"].to_numpy()
    assert len(set(ids.tolist())) == len(ids)
    for h, s in zip(trial.history, attempts, strict=True):
        if s.verdict == "sustained":
            assert sum(int(i) >> 39 in set(h["senders"]) for i in ids) == s.emitted
    plot = tmp_path / "rate.png"
    plot_ingestion(throttled.sink, trial.history, plot)
    assert plot.stat().st_size > 0


def test_sink_counter_attributes_by_sender(spark: Any, tmp_path: Path) -> None:
    """Counts of the real sink attributed to senders by tuple id, exactly."""
    from pyspark.sql import functions as F

    import cloudprofiler

    cloudprofiler.register(spark)
    ids = [(5 << 39) + i for i in range(300)] + [(9 << 39) + i for i in range(200)]
    df = spark.createDataFrame([(i,) for i in ids], "tuple_id long").repartition(1)
    df.write.mode("overwrite").parquet(str(tmp_path / "in"))
    stream = spark.readStream.schema("tuple_id long").parquet(str(tmp_path / "in"))
    from conftest import run_available_now

    run_available_now(
        stream.repartition(2, F.shiftright("tuple_id", 39)),
        "cloudprofiler",
        str(tmp_path / "ck"),
        str(tmp_path / "sink"),
        options={"handler": "null"},
    )
    c = SinkCounter(tmp_path / "sink")
    c.poll()
    assert c.received({5}) == 300 and c.received({9}) == 200 and c.received({5, 9}) == 500
    assert not c.mixed


def test_trial_counts_exactly(spark: Any, tmp_path: Path) -> None:
    """One low-rate trial through the real pipeline: emitted == received, by sender."""
    target, query = start_source_query(spark, tmp_path / "q", max_spool_bytes=32 << 20, handler="null")
    try:
        trial = PipelineTrial(target, duration=1.0, grace=20.0)
        step = trial(5_000)
        assert step.judge(None) == "sustained", step
        assert step.emitted == 5_000 and step.received == 5_000 and step.dropped == 0
        h = trial.history[0]
        assert trial.counter.received(set(h["senders"])) == 5_000
    finally:
        query.stop()


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["maxrate", "--tolerance", "1.5"]) == 2
    assert "--tolerance" in capsys.readouterr().err
    assert main(["maxrate", "--spool", "/nonexistent"]) == 2
    assert "--sink" in capsys.readouterr().err
    assert main(["maxrate", "--sink", "/nonexistent/records", "--spool", "/nonexistent"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_result_json_roundtrip() -> None:
    from cloudprofiler.rate_search import SearchResult, Step

    r = SearchResult(max_rate=10.0, method="bisect", steps=[Step(10.0, 5, 0, 0, 5, False)])
    assert json.loads(json.dumps(r.to_json()))["steps"][0]["emitted"] == 5
