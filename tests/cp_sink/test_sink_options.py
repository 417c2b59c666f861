"""The sink's options fail at the query's first call to the sink, before any data, in one line that
quotes the option as documented and names the nearest valid one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cp_common.options import canonical, suggestion, unknown_options_error
from cp_sink.handlers import parse_handler
from cp_sink.stream_writer import SINK_OPTIONS, CloudprofilerStreamWriter, check_sink_options

VALID = ", ".join(SINK_OPTIONS)


def _schema():  # type: ignore[no-untyped-def]
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("tuple_id", LongType())])


def test_a_near_miss_gets_did_you_mean_in_the_documented_spelling() -> None:
    assert suggestion("period_ms", SINK_OPTIONS) == "periodMs" and suggestion("zzz", SINK_OPTIONS) is None
    assert canonical("tupleidcolumn", SINK_OPTIONS) == "tupleIdColumn" and canonical("q", SINK_OPTIONS) == "q"
    with pytest.raises(ValueError) as e:
        check_sink_options({"path": "/p", "periodms": "5", "keepcolums": "k", "zzz": "1"})
    assert str(e.value) == (
        "unknown options for the cloudprofiler sink: 'keepcolums', did you mean 'keepColumns'?; 'zzz' "
        f"(names as Spark passes them, lower-cased; valid: {VALID})"
    )
    # a caller's own spelling is quoted as given, without the note on Spark's lower case
    msg = unknown_options_error(["Handlr"], SINK_OPTIONS, "the cloudprofiler sink")
    assert (
        msg
        == f"unknown option for the cloudprofiler sink: 'Handlr', did you mean 'handler'? (valid: {VALID})"
    )
    check_sink_options({"PATH": "/p", "checkpointLocation": "c", "queryname": "q"})  # Spark's own pass


def test_bad_values_are_quoted_as_the_user_wrote_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        parse_handler("DownSampel")
    assert str(e.value) == (
        "unknown handler 'DownSampel', did you mean 'downsample'? "
        "(expected one of identity, downsample, xoy, firstlast, pc, null)"
    )
    with pytest.raises(ValueError) as e:
        CloudprofilerStreamWriter(_schema(), {"path": str(tmp_path), "durability": "Strct"}, False)
    assert str(e.value) == "option durability='Strct': expected one of process, strict"
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def test_an_unknown_handler_fails_the_query_before_any_data_in_one_line(spark, tmp_path: Path) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    src = tmp_path / "in"
    spark.range(0, 10).withColumnRenamed("id", "tuple_id").write.parquet(str(src))
    q = (
        spark.readStream.schema("tuple_id long")
        .parquet(str(src))
        .writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "out"))
        .option("Handler", "dowsample")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as e:  # awaitTermination raises the query's failure
        q.awaitTermination(180)
    first = str(e.value).splitlines()[0]
    assert first.endswith(
        "Failed to initialize Python data source writer: ValueError: unknown handler 'dowsample', "
        "did you mean 'downsample'? (expected one of identity, downsample, xoy, firstlast, pc, null)"
    )
    assert not (tmp_path / "out").exists()  # nothing was written: the sink refused before any data
    assert q.lastProgress is None  # no batch ran
