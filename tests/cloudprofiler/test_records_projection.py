"""``cloudprofiler.records(df)``: the query projected to the columns the sink reads, before writeStream."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

import cloudprofiler
from cp_sink import read_records
from cp_sink.records import sink_input_columns
from cp_sink.stamp import stamp
from tests.helpers.streaming import run_available_now

ROWS = 300
WIDE = StructType(
    [
        StructField("user_id", StringType()),
        StructField("cp_tsc_gen", LongType()),
        StructField("tuple_id", LongType()),
        StructField("tags", ArrayType(StringType())),
        StructField("region", StringType()),
        StructField("cp_node_gen", StringType()),
        StructField("cp_tsc_sink", LongType()),  # the sink's own stamp: never read from the query
        StructField("cp_node_sink", StringType()),
    ]
)


def test_sink_input_columns_in_order_without_the_sinks_own_stamp() -> None:
    assert sink_input_columns(WIDE) == ["tuple_id", "cp_tsc_gen", "cp_node_gen"]
    assert sink_input_columns(WIDE, keep=" REGION") == ["tuple_id", "region", "cp_tsc_gen", "cp_node_gen"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"id_column": "id"}, "needs a tuple id column 'id'"),
        ({"keep": "tags"}, "column 'tags' is nested"),
        ({"keep": "nope"}, "the query has no column 'nope'"),
        ({"keep": "cp_tsc_gen"}, "a column the records already hold"),
    ],
)
def test_a_bad_projection_fails_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        sink_input_columns(WIDE, **kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.long  # a real Spark job: the fast tier keeps its 10 minutes
def test_records_projects_a_real_query_and_the_sink_keeps_every_tuple(spark, tmp_path: Path) -> None:
    src = tmp_path / "in"
    wide = spark.range(ROWS, numPartitions=2).select(
        F.col("id").alias("tuple_id"),
        F.concat(F.lit("user-"), F.col("id").cast("string")).alias("user_id"),
        (F.col("id") % 3).cast("string").alias("region"),
        (F.col("id") * 10).alias("cp_tsc_gen"),
        F.lit("d1").alias("cp_node_gen"),
    )
    wide.write.parquet(str(src))
    cloudprofiler.register(spark)
    stream = spark.readStream.schema(wide.schema).parquet(str(src))
    projected = cloudprofiler.records(stamp(stream, "mid"), keep="region")
    stamps = ["cp_tsc_gen", "cp_node_gen", "cp_tsc_mid", "cp_node_mid"]
    assert projected.columns == ["tuple_id", "region", *stamps]

    out = tmp_path / "out"
    run_available_now(
        projected, "cloudprofiler", str(tmp_path / "ck"), path=str(out), options={"keepColumns": "region"}
    )
    rec = read_records(out)
    assert sorted(rec["tuple_id"].to_pylist()) == list(range(ROWS))
    assert sorted(rec.column_names) == sorted(
        [*projected.columns, "cp_tsc_sink", "cp_node_sink", "cp_tsc_committed", "cp_node_committed"]
        + ["partition", "batch_id"]
    )
    by_id = dict(zip(rec["tuple_id"].to_pylist(), rec["region"].to_pylist(), strict=True))
    assert by_id == {i: str(i % 3) for i in range(ROWS)}
