"""Real queries on one sink path: a second writer, and the same path under a new checkpoint.

Before, both lost tuples without a word: a second query's batches whose ids the first had
published were taken for replays and dropped. Now the second run stops at its first commit with
one line naming the run that published there, and the first run's records stay exact.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest

import cloudprofiler
from cp_sink.records import published_batches, read_records
from tests.helpers.polling import wait_for
from tests.helpers.streaming import rate_ids_into_sink

ROWS = 200  # ids per micro-batch: batch k holds [k * ROWS, (k + 1) * ROWS)


@pytest.fixture(autouse=True)
def _registered(spark: Any) -> None:
    cloudprofiler.register(spark)


def _failure(query: Any, timeout: float = 120) -> str:
    """The query's exception text once it has stopped (it must stop on its own)."""
    from pyspark.errors import StreamingQueryException

    with contextlib.suppress(StreamingQueryException):  # its failure is what is checked below
        query.awaitTermination(timeout)
    assert not query.isActive, "the second run was not refused"
    error = query.exception()
    assert error is not None
    return str(error)


def _assert_only(out: Path, query_id: str) -> None:
    """The path holds exactly the ids of the batches ``query_id`` published, each once."""
    batches = published_batches(out)
    assert batches and sorted(batches) == list(range(len(batches)))
    assert {m.run["query_id"] for m in batches.values() if m.run} == {query_id}
    ids = sorted(read_records(out)["tuple_id"].to_pylist())
    assert ids == list(range(ROWS * len(batches)))


@pytest.mark.long  # 6-15 s: three queries, two of them live at once
def test_a_second_writer_and_a_new_checkpoint_are_refused_and_the_first_stays_exact(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "records"
    first = rate_ids_into_sink(spark, str(out), str(tmp_path / "ckpt-a"), ROWS, 200)
    second = None
    try:
        wait_for(lambda: len(published_batches(out)) >= 1, 120, "the first query's first batch")
        # a second query on the same path while the first runs
        second = rate_ids_into_sink(spark, str(out), str(tmp_path / "ckpt-b"), ROWS, 200)
        message = _failure(second)
        assert f"{out}: batch " in message and f"published by query id {first.id}" in message
        assert f"this query is query id {second.id}, checkpoint {tmp_path / 'ckpt-b'}" in message
        n = len(published_batches(out))
        wait_for(lambda: len(published_batches(out)) >= n + 1, 120, "the first query going on")
        assert first.isActive
    finally:
        first.stop()
        if second is not None:
            second.stop()
    _assert_only(out, first.id)
    # the same path under a new checkpoint, once the first query has stopped
    before = {i: m.files for i, m in published_batches(out).items()}
    again = rate_ids_into_sink(spark, str(out), str(tmp_path / "ckpt-c"), ROWS, 200)
    try:
        message = _failure(again)
    finally:
        again.stop()
    assert f"published by query id {first.id}" in message and "a path of its own" in message
    assert {i: m.files for i, m in published_batches(out).items()} == before
    _assert_only(out, first.id)
    # the path reads the same in Spark: its file-sink log lists exactly the published files
    listed = sorted(f for m in published_batches(out).values() for f in m.files)
    logged = [orjson.loads(line)["path"] for line in _spark_log_lines(out)]
    assert sorted(p.split(str(out) + "/", 1)[1] for p in logged) == listed
    assert spark.read.parquet(str(out)).count() == ROWS * len(before)


def _spark_log_lines(out: Path) -> list[bytes]:
    log = out / "_spark_metadata"
    ids = sorted(int(p.name.split(".")[0]) for p in log.iterdir() if not p.name.startswith("."))
    latest = ids[-1]
    compact = [i for i in ids if (log / f"{i}.compact").exists()]
    start = compact[-1] if compact else 0
    lines: list[bytes] = []
    for i in range(start, latest + 1):
        name = f"{i}.compact" if (log / f"{i}.compact").exists() else str(i)
        lines += [ln for ln in (log / name).read_bytes().split(b"\n")[1:] if ln.strip()]
    return lines
