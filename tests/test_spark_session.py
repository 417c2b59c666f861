"""The shared SparkSession and the streaming helpers work end to end."""

from __future__ import annotations

from conftest import run_available_now


def test_available_now_round_trip(spark, tmp_path) -> None:
    src = tmp_path / "in"
    spark.range(0, 1000).write.parquet(str(src / "part0"))
    df = spark.readStream.schema("id long").parquet(str(src / "part0"))
    out = tmp_path / "out"
    run_available_now(df, "parquet", str(tmp_path / "ck"), path=str(out))
    ids = sorted(r.id for r in spark.read.parquet(str(out)).collect())
    assert ids == list(range(1000))
