"""The profiler's own CPU on a query's path: per-partition thread CPU in the executors' ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cp_sink.stamp import stamp
from native_tsc.self_cost import TreeCpu, cost_doc, query_cost, share_line

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
