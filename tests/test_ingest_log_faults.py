"""The ingest log's disk fills up mid-run: the query fails naming progressLog, and a restart with room
delivers every tuple exactly once with every bucket logged once (nothing accepted is lost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
from conftest import await_query, small_tmpfs
from ingest_truth import assert_exactly_once, expected_ids

pytestmark = pytest.mark.long


def _query(spark: Any, spool: Path, log: Path, out: Path, ckpt: Path, limit: int | None) -> Any:
    import cloudprofiler

    cloudprofiler.register(spark)
    r = spark.readStream.format("cloudprofiler").option("spool", str(spool)).option("factory", "external")
    if limit is not None:
        r = r.option("maxRecordsPerTrigger", str(limit))  # small batches: log files until the disk is full
    df = r.option("progressLog", str(log)).load().select("tuple_id", "cp_tsc_source", "cp_node_source")
    w = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
    )
    return w.trigger(availableNow=True).start()


def test_a_full_log_disk_fails_the_query_and_a_restart_loses_nothing(spark: Any, tmp_path: Path) -> None:
    from cp_sink import read_records
    from cp_source.factory import start_factory
    from cp_source.generator import run_generator
    from cp_source.ingest_log import read_ingest_log
    from cp_source.spool import Spool

    spool, out, ckpt = tmp_path / "spool", tmp_path / "out", tmp_path / "ckpt"
    factory = start_factory("tcp://127.0.0.1:0", spool, workers=2)
    try:
        summary = run_generator(factory.endpoint, rate=20_000, duration=2.0, bucket=5)
    finally:
        factory.stop()
    want, _ = expected_ids(summary, Spool(spool).stats())
    with small_tmpfs(tmp_path / "small", "64k") as small:
        q = _query(spark, spool, small / "plog", out, ckpt, 2000)
        with pytest.raises(Exception, match="progressLog") as failed:
            q.awaitTermination(180)
        err = str(failed.value)
        assert "option progressLog: cannot write the ingest log" in err and "No space left" in err, err
        partial = read_records(out)["tuple_id"].to_numpy()
        assert len(partial) < len(want)  # it stopped before the end
        assert not list((small / "plog" / "ingest").glob(".*.tmp"))  # no partial file left behind
    q = _query(spark, spool, tmp_path / "plog", out, ckpt, None)
    await_query(q)
    got = read_records(out)["tuple_id"].to_numpy()
    assert_exactly_once(np.sort(got), want)
    # the batches published before the failure are logged on the small disk, gone with it; the rest
    # are logged once each, and every logged bucket is one the sink holds
    log = read_ingest_log(tmp_path / "plog")
    assert pc.sum(log["count"]).as_py() == len(want) - len(partial)
    assert len(set(log["first_tuple_id"].to_pylist())) == log.num_rows
    assert set(log["first_tuple_id"].to_pylist()) <= set(got.tolist())
