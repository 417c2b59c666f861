"""Spark's micro-batch phases collected by a listener and placed on the driver's TSC axis: one real
query (Spark's rate-micro-batch source into a foreachBatch that stamps the driver's TSC inside
addBatch), watched by two collectors at once, checked against Spark's own recentProgress."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import native_tsc
from cloudprofiler.spark_phases import (
    PHASE_ORDER,
    SLEW_PPM,
    TRIGGER,
    PhaseCollector,
    phases_metadata,
    read_phases,
    summarize,
    summary_text,
    write_phases,
)
from cp_store.location import StoreError
from tests.helpers.s3_server import s3  # noqa: F401  (the fixture of the S3 case)

ROWS = 50
TRIGGER_MS = 200
BATCHES = 4
SPARK_PHASES = {TRIGGER, *PHASE_ORDER} - {"getOffset"}  # getOffset: a V1 source's, not rate-micro-batch's


def _run_query(spark: Any, name: str, stamps: dict[int, int]) -> Any:
    """Spark's rate-micro-batch source into a foreachBatch that stamps each batch's TSC on the driver."""

    def stamp(df: Any, batch_id: int) -> None:
        stamps[batch_id] = native_tsc.now()
        df.count()  # the rows are read, so Spark counts them in numInputRows

    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
    )
    query = (
        df.writeStream.queryName(name)
        .foreachBatch(stamp)
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )
    deadline = time.monotonic() + 60
    while len(query.recentProgress) < BATCHES and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    return query


@pytest.fixture(scope="module")
def run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("phases") / "spark_phases.parquet"
    stamps: dict[int, int] = {}
    before = native_tsc.now()
    full = PhaseCollector(spark, out, query="phases-test", trigger_interval_ms=TRIGGER_MS).start()
    capped = PhaseCollector(spark, query="phases-test", max_batches=2).start()
    query = _run_query(spark, "phases-test", stamps)
    after = native_tsc.now()
    written = full.stop()
    capped.stop()
    stopped = native_tsc.now()  # no progress event reached the listeners after this
    progress = [p for p in query.recentProgress if TRIGGER in p.durationMs]
    assert len(progress) >= BATCHES
    return {
        "full": full,
        "capped": capped,
        "out": written,
        "progress": progress,
        "stamps": stamps,
        "before": before,
        "after": after,
        "stopped": stopped,
    }


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


def test_every_batch_once_with_all_phases_and_sparks_durations(run: dict[str, Any]) -> None:
    rows = _rows(run["full"].table())
    truth = {(p.batchId, k): v for p in run["progress"] for k, v in p.durationMs.items()}
    got = [(r["batch_id"], r["phase"]) for r in rows]
    assert len(got) == len(set(got))  # each batch and phase exactly once
    assert set(got) == set(truth)  # every batch Spark reported, with every phase it reported
    assert {p for _, p in got} == SPARK_PHASES
    assert {(r["batch_id"], r["phase"]): r["duration_ms"] for r in rows} == truth
    assert {r["num_input_rows"] for r in rows} == {ROWS} == {p.numInputRows for p in run["progress"]}
    assert {r["node"] for r in rows} == {native_tsc.domain_id()}
    assert {r["trigger_interval_ms"] for r in rows} == {TRIGGER_MS}
    assert {r["query_id"] for r in rows} == {str(run["progress"][0].id)}
    assert {r["query_name"] for r in rows} == {"phases-test"}
    assert run["full"].table(query=str(run["progress"][0].id)).equals(run["full"].table())
    assert run["full"].table(query="another query").num_rows == 0


def test_phases_lie_within_their_batch_on_the_driver_tsc(run: dict[str, Any]) -> None:
    hz = native_tsc.frequency_hz()
    rows = _rows(run["full"].table())
    ms_ticks = round(hz / 1000)
    for batch in sorted({r["batch_id"] for r in rows}):
        mine = {r["phase"]: r for r in rows if r["batch_id"] == batch}
        top = mine.pop(TRIGGER)
        start, end, bound = top["start_tsc"], top["end_tsc"], round(top["start_bound_ns"] * hz / 1e9)
        assert end - start == round(top["duration_ms"] * hz / 1000)
        # the bound is the ms of truncation, half the pair's read spread (under 1 ms) and the wall
        # clock's slew over the listener's lag, which is at most the whole run: never looser
        slew = round(SLEW_PPM / 1e6 * (run["stopped"] - run["before"]))
        assert ms_ticks < bound < 2 * ms_ticks + slew, (bound / ms_ticks, slew / ms_ticks)
        assert run["before"] - bound <= start and end <= run["after"] + bound
        # the driver's own stamp inside addBatch lies in the batch as placed (its bound and 1 ms of
        # Spark's duration rounding)
        assert start - bound <= run["stamps"][batch] <= end + bound + ms_ticks
        order = [p for p in PHASE_ORDER if p in mine]
        for prev, phase in zip(order, order[1:], strict=False):
            assert mine[prev]["end_tsc"] <= mine[phase]["start_tsc"] or mine[phase]["placement"] == "pushed"
        for r in mine.values():
            assert start <= r["start_tsc"] <= r["end_tsc"] <= end
            if r["placement"] == "laid-out":
                assert r["end_tsc"] - r["start_tsc"] == round(r["duration_ms"] * hz / 1000)


def test_table_reads_back_equal_from_a_local_path_and_s3(run: dict[str, Any], s3: Any) -> None:  # noqa: F811
    table = run["full"].table()
    assert read_phases(run["out"]).equals(table, check_metadata=True)
    for name in ("phases.parquet", "phases.json"):
        loc = write_phases(table, f"s3://results/run/{name}")
        back = read_phases(loc)
        assert back.equals(table, check_metadata=True), name
        assert phases_metadata(back)["batches_kept"] == len(run["progress"])


def test_a_cap_on_batches_is_said_beside_the_summary(run: dict[str, Any]) -> None:
    table = run["capped"].table()
    assert set(table.column("batch_id").to_pylist()) == {0, 1}
    meta = phases_metadata(table)
    not_kept = len(run["progress"]) - 2
    assert (meta["batches_kept"], meta["batches_not_kept"], meta["max_batches"]) == (2, not_kept, 2)
    assert summary_text(table).endswith(f"; {not_kept} later batches not kept (max_batches=2)")
    assert "not kept" not in summary_text(run["full"].table())


def test_summary_per_phase_from_sparks_durations(run: dict[str, Any]) -> None:
    table = run["full"].table()
    trigger_total = sum(p.durationMs[TRIGGER] for p in run["progress"])
    stats = {s.phase: s for s in summarize(table)}
    assert set(stats) == SPARK_PHASES
    for phase, s in stats.items():
        ms = np.array([p.durationMs[phase] for p in run["progress"]])
        assert (s.batches, s.max_ms) == (len(run["progress"]), int(ms.max()))
        assert (s.p50_ms, s.p90_ms) == tuple(np.percentile(ms, [50, 90]))
        assert s.share == pytest.approx(ms.sum() / trigger_total)
    top = max((s for s in stats.values() if s.phase != TRIGGER), key=lambda s: s.share)
    text = summary_text(table)
    assert text.startswith(f"{top.phase} dominates: {top.share:.0%} of triggerExecution over ")
    assert "trigger interval 200 ms" in text and "\n" not in text


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("nosuch://bucket/phases.parquet", "nosuch"),
        ("{file}/phases.parquet", "phases.parquet"),
    ],
)
def test_a_bad_location_is_one_line(spark: Any, tmp_path: Path, where: str, says: str) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(StoreError) as e:
        PhaseCollector(spark, where.format(file=afile))
    assert str(e.value).startswith("spark phases ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_max_batches_below_one_is_refused(spark: Any) -> None:
    with pytest.raises(ValueError, match="^max_batches must be at least 1, not 0$"):
        PhaseCollector(spark, max_batches=0)


def test_an_unreadable_or_repeated_progress_is_counted_and_said(spark: Any, run: dict[str, Any]) -> None:
    """Spark's listener bus only logs what a listener raises: the collector counts it instead."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    good = json.loads(run["progress"][0].json)
    bad = {**good, "batchId": 99, "timestamp": "yesterday"}
    collector = PhaseCollector(spark, query="phases-test")
    for doc in (good, bad, good):
        collector.on_progress(StreamingQueryProgress.fromJson(doc))
    table = collector.table()
    meta = phases_metadata(table)
    assert (meta["batches_kept"], meta["repeated_progress"], meta["unreadable_progress"]) == (1, 1, 1)
    assert set(table.column("batch_id").to_pylist()) == {good["batchId"]}
    assert summary_text(table).endswith(
        "; 1 repeated progress events of kept batches left out"
        "; 1 progress events unreadable, the first: "
        "batch 99: progress timestamp 'yesterday' is not an ISO 8601 time"
    )
