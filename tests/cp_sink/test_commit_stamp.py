"""The "committed" stamp point: the sink's commit stamps each batch as it publishes it.

One reading per batch, on the committing process, kept in the batch's manifest (no column in any
file, no work per tuple): ``read_records`` gives it on every record of the batch, and translation
reads it like any point, so sink -> committed is the commit's share of a record's latency.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

import native_tsc
from cp_sink.records import read_records
from cp_sink.stream_writer import CloudprofilerStreamWriter
from cp_store import batch_log
from cp_store.location import resolve
from cp_sync.translate.records import translate_records


def _writer(out: Path) -> CloudprofilerStreamWriter:
    from pyspark.sql.types import LongType, StructField, StructType

    return CloudprofilerStreamWriter(
        StructType([StructField("tuple_id", LongType())]), {"path": str(out)}, False
    )


def _ids(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(np.arange(lo, hi, dtype=np.int64))], names=["tuple_id"])


def test_each_batch_is_stamped_once_at_its_commit_and_translates_like_any_point(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = _writer(out)
    before = native_tsc.now()
    w.commit([w.write(iter([_ids(0, 100)])), w.write(iter([_ids(100, 150)]))], 0)
    between = native_tsc.now()
    w.commit([w.write(iter([_ids(150, 200)]))], 1)
    after = native_tsc.now()
    doc = orjson.loads(batch_log.manifest_location(resolve(out), 0).read_bytes())
    assert doc["committed"]["node"] == native_tsc.domain_id()
    t = read_records(out)
    stamps: dict[int, set[int]] = {0: set(), 1: set()}
    for b, c in zip(t["batch_id"].to_pylist(), t["cp_tsc_committed"].to_pylist(), strict=True):
        stamps[b].add(c)
    assert stamps[0] == {doc["committed"]["tsc"]} and len(stamps[1]) == 1  # one reading per batch
    (c0,), (c1,) = stamps[0], stamps[1]
    assert before < c0 < between < c1 < after
    assert set(t["cp_node_committed"].to_pylist()) == {native_tsc.domain_id()}
    sink = np.array(t["cp_tsc_sink"].to_pylist())
    committed = np.array(t["cp_tsc_committed"].to_pylist())
    assert (committed > sink).all()  # a batch is published after its records reached the sink

    latency, _ = translate_records(out, None, "sink", "committed")
    got = latency.sort_by("tuple_id")
    assert got["tuple_id"].to_pylist() == list(range(200))
    assert set(got["status"].to_pylist()) == {"ok"}
    order = np.argsort(t["tuple_id"].to_numpy())
    assert got["to_tsc"].to_pylist() == committed[order].tolist()
    assert got["duration_cycles"].to_pylist() == (committed - sink)[order].astype(float).tolist()


def test_records_of_an_unstamped_batch_are_refused_for_committed_not_dropped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    records = pa.table(
        {
            "tuple_id": pa.array([1, 2], pa.int64()),
            "cp_tsc_sink": pa.array([10, 20], pa.int64()),
            "cp_node_sink": pa.array(["n", "n"]),
        }
    )
    batch_log.publish(out, 0, {"records-0.parquet": records})  # a whole-batch writer: no commit stamp
    with pytest.raises(ValueError, match=r"1 record file\(s\) under .* have no committed stamp"):
        translate_records(out, None, "sink", "committed")
