"""The profiler's own CPU on a query's path: per-partition thread CPU in the executors' ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cp_common.self_cost import TreeCpu, cost_doc, query_cost, share_line
from cp_sink.stamp import stamp

ROWS = 3000


@pytest.mark.long  # one micro-batch, but 19-37 s with its query's start on a loaded 2-core machine
def test_profiler_cpu_of_a_short_query_is_within_the_run_cpu(spark: Any, tmp_path: Path) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(2):  # two files, two partitions: each task charges its own
        ids = np.arange(i * ROWS // 2, (i + 1) * ROWS // 2, dtype=np.int64)
        pq.write_table(pa.table({"tuple_id": ids}), src / f"part{i}.parquet")
    run = TreeCpu().start()
    events = spark.readStream.schema("tuple_id LONG").parquet(str(src))
    query = (
        stamp(events, "mid")
        .writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "records"))
        .option("handler", "id")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    run_cpu = run.stop()
    cost = query_cost(query.id, remove=True)
    # every tuple went through the sink's write once; the stamp stage and the sink were charged
    assert cost.tuples == ROWS
    assert cost.ns["stamps"] > 0 and cost.ns["sink_write"] > 0 and cost.ns["source_read"] == 0
    assert cost.profiler_ns <= run_cpu * 1e9
    doc = cost_doc(cost, run_cpu)
    assert 0 < doc["profiler_share"] < 1 and doc["ns_per_tuple"] == cost.profiler_ns / ROWS
    assert share_line(doc).startswith("the profiler used ")
    assert query_cost(query.id).processes == 0  # the ledger was removed once read


def _busy_partition(query_id: str, part: int, n: int) -> None:
    """A worker's partition: thread CPU spent, charged, then alive long enough to be sampled."""
    import time

    from cp_common.self_cost import charge

    t0 = time.thread_time_ns()
    sum(range(n))
    charge(query_id, part, time.thread_time_ns() - t0, tuples=n)
    charge(query_id, part, 0)  # a second partition of the same process: its totals, not added twice
    time.sleep(0.4)


def test_the_ledger_sums_each_process_once_within_the_tree_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing

    from cp_common.self_cost import LEDGER_ENV, SINK_WRITE, STAMPS

    monkeypatch.setenv(LEDGER_ENV, str(tmp_path))
    tree = TreeCpu(period=0.05).start()
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may run Spark's threads
    procs = [
        ctx.Process(target=_busy_partition, args=("q", part, 3_000_000)) for part in (SINK_WRITE, STAMPS)
    ]
    procs.append(ctx.Process(target=_busy_partition, args=("other", SINK_WRITE, 1000)))
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    run_cpu = tree.stop()
    cost = query_cost("q", remove=True)
    assert cost.processes == 2 and cost.tuples == 6_000_000  # the other query's process is not in it
    assert cost.ns["sink_write"] > 0 and cost.ns["stamps"] > 0 and cost.ns["source_read"] == 0
    assert 0 < cost.profiler_ns <= run_cpu * 1e9
    assert query_cost("other").processes == 1 and not (tmp_path / "q").exists()
