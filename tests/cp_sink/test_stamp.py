"""Stamp points in the middle of a query."""

from __future__ import annotations

import pyarrow as pa
import pytest

import native_tsc
from cp_sink.stamp import check_point_name, stamp, stamp_batches


def test_stamp_batches_adds_one_reading_per_batch() -> None:
    batches = [pa.record_batch([pa.array(range(k * 10, k * 10 + 10))], names=["tuple_id"]) for k in range(3)]
    before = native_tsc.now()
    out = list(stamp_batches(iter(batches), "mid"))
    after = native_tsc.now()
    assert [b.schema.names for b in out] == [["tuple_id", "cp_tsc_mid", "cp_node_mid"]] * 3
    readings = [b.column("cp_tsc_mid").unique().to_pylist() for b in out]
    assert all(len(r) == 1 for r in readings)
    flat = [r[0] for r in readings]
    assert before <= flat[0] <= flat[1] <= flat[2] <= after
    assert {v for b in out for v in b.column("cp_node_mid").to_pylist()} == {native_tsc.domain_id()}


def test_stamp_after_a_shuffle_in_spark(spark) -> None:
    df = spark.range(0, 5000).withColumnRenamed("id", "tuple_id")
    df = stamp(df, "before")
    df = stamp(df.repartition(3), "after_shuffle")
    rows = df.toArrow()
    assert sorted(rows["tuple_id"].to_pylist()) == list(range(5000))
    before, after = rows["cp_tsc_before"].to_pylist(), rows["cp_tsc_after_shuffle"].to_pylist()
    assert all(b <= a for b, a in zip(before, after, strict=True))  # the later stage stamps later
    assert set(rows["cp_node_after_shuffle"].to_pylist()) == {native_tsc.domain_id()}


def test_bad_point_names(spark) -> None:
    for bad in ("", "Sink", "9x", "a-b", "x" * 40):
        with pytest.raises(ValueError, match="stamp point name"):
            check_point_name(bad)
    df = stamp(spark.range(3), "p")
    with pytest.raises(ValueError, match="already exists"):
        stamp(df, "p")
