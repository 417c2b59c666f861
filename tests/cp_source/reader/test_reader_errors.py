"""The reader's errors reach the user up front and in one line: a misspelled option at ``load()``,
a user schema that does not fit when the query starts (Spark does not ask the source then)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cp_source.reader.options import OPTION_NAMES, ReaderOptions, check_schema, source_schema
from tests.helpers.embedded_source import embedded_source

VALID = (
    "endpoint, spool, workers, workload, schema, maxRecordsPerTrigger, factory, fetch, serverBind, "
    "serverHost, maxSpoolBytes, segmentsPerPartition, rowsPerPartition, fetchTimeout, startingOffsets, "
    "durability, curveKeys, ordering, senders, senderIds, senderTimeout, progressLog, scheduling, columns, "
    "window, "
    "slide, watermarkDelay, klinkDir, maxDeferMs, klinkHistory, klinkMinSlackMs, factories, factoriesDir, "
    "factoryTimeout, statusDir, path"
)
TYPO = (
    "unknown option for the cloudprofiler source: 'endpont', did you mean 'endpoint'? "
    f"(names as Spark passes them, lower-cased; valid: {VALID})"
)


def _lines(e: BaseException) -> list[str]:
    return [line.strip() for line in str(e).splitlines()]


def test_options_parse_refuses_a_typo_naming_it_and_the_valid_ones() -> None:
    assert ", ".join(OPTION_NAMES) == VALID
    with pytest.raises(ValueError) as e:
        ReaderOptions.parse({"endpont": "tcp://127.0.0.1:1"})  # as Spark passes it
    assert str(e.value) == TYPO
    assert ReaderOptions.parse({"endpont": "x"}, strict=False).endpoint == "tcp://127.0.0.1:5555"


def test_a_misspelled_option_fails_at_load_in_one_line(spark) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = spark.readStream.format("cloudprofiler").option("endpont", "tcp://127.0.0.1:5999")
    with pytest.raises(Exception) as e:
        reader.load()
    # the first line of Spark's error ends with the reader's own, whole (no Python traceback before it)
    assert _lines(e.value)[0].endswith(f"Failed to create Python data source instance: ValueError: {TYPO}")
    # the same options, spelled right, load
    df = spark.readStream.format("cloudprofiler").option("Endpoint", "tcp://127.0.0.1:5999").load()
    assert "tuple_id" in df.columns


def _ysb() -> ReaderOptions:
    return ReaderOptions.parse({})


def test_check_schema_names_the_columns_that_do_not_match() -> None:
    from pyspark.sql.types import StructType

    opts = _ysb()
    full = source_schema(opts)
    check_schema(full, opts)  # the source's own schema fits
    provides = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in full.fields)
    with pytest.raises(ValueError) as e:
        check_schema(StructType.fromDDL("a INT"), opts)
    assert str(e.value) == (
        "the schema given with .schema() does not match the cloudprofiler source (workload ysb): "
        f"columns it does not provide: a; the source provides: {provides}; "
        "give some of these columns, or leave .schema() out (the source knows its schema)"
    )
    retyped = StructType([f if f.name != "tuple_id" else f.__class__("tuple_id", _string()) for f in full])
    with pytest.raises(ValueError, match=r": other types: tuple_id string \(it is bigint\); the source"):
        check_schema(retyped, opts)


def _string() -> Any:
    from pyspark.sql.types import StringType

    return StringType()


def test_a_schema_that_does_not_fit_fails_the_query_before_reading(spark, tmp_path: Path) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    df = (
        spark.readStream.format("cloudprofiler")
        .schema("a INT")
        .option("factory", "external")
        .option("spool", str(tmp_path / "spool"))
        .load()
    )
    q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        with pytest.raises(Exception) as e:
            q.awaitTermination(180)
    finally:
        q.stop()
    from pyspark.sql.types import StructType

    with pytest.raises(ValueError) as direct:
        check_schema(StructType.fromDDL("a INT"), _ysb())
    lines = _lines(e.value)
    assert f"ValueError: {direct.value}" in lines, str(e.value)
    assert "columns it does not provide: a; the source provides: user_id string, page_id string," in str(
        direct.value
    )
    assert not any("UnboundLocalError" in line for line in lines)
    assert not (tmp_path / "spool").exists()  # refused before the reader touched anything


# ---- one streaming DataFrame feeding two queries ------------------------------------------------


@pytest.mark.long
def test_a_second_query_on_the_same_dataframe_is_refused_in_one_line(spark, tmp_path: Path) -> None:
    """Both queries would start an embedded factory on the same endpoint and spool: the second is
    refused naming them and what to do; the first runs on, and its spool is free once it stops."""
    import cloudprofiler

    spool = tmp_path / "spool"
    df = embedded_source(spark, spool, workers="1")

    def start(name: str) -> Any:
        return df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / name)).start()

    first = start("ck1")
    try:
        cloudprofiler.wait_for_factory(str(spool), first, timeout=240)
        second = start("ck2")
        with pytest.raises(Exception) as e:
            second.awaitTermination(240)
        assert first.isActive and first.exception() is None
    finally:
        first.stop()
    want = (
        f"ValueError: spool {spool} (endpoint tcp://127.0.0.1:0) is already used by another query's "
        "embedded factory: give each query its own DataFrame with its own endpoint and spool options, "
        "or one query that writes to several sinks (foreachBatch)"
    )
    assert want in _lines(e.value), str(e.value)
    # the first query's stop released the spool: a third query on the same DataFrame starts
    third = start("ck3")
    try:
        cloudprofiler.wait_for_factory(str(spool), third, timeout=240)
        assert third.isActive and third.exception() is None
    finally:
        third.stop()


# ---- trigger(availableNow=True) ------------------------------------------------------------------

AVAILABLE_NOW = (
    "ValueError: trigger(availableNow=True) reads what the spool holds when the query starts, but the "
    "embedded factory starts with the query (it would end with 0 rows): run `cloudprofiler factory` and "
    "read its spool with factory=external, or use a processing-time trigger"
)


def test_available_now_with_the_embedded_factory_is_refused_in_one_line(spark, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    df = embedded_source(spark, spool)
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        with pytest.raises(Exception) as e:
            q.awaitTermination(180)
    finally:
        q.stop()
    assert AVAILABLE_NOW in _lines(e.value), str(e.value)
    assert not (spool / "_reader.json").exists()  # refused before a factory started


def test_a_missing_ndjson_file_fails_at_load_in_one_line(spark, tmp_path: Path) -> None:
    """A file: workload's file is checked at load(), as a parquet: one's is: a path (or URI) that
    names no file is one line, never a query waiting forever for a generator that failed."""
    import cloudprofiler

    cloudprofiler.register(spark)
    missing = tmp_path / "no-such.ndjson"
    reader = (
        spark.readStream.format("cloudprofiler")
        .option("workload", f"file:{missing}")
        .option("schema", "name STRING")
        .option("factory", "external")
        .option("spool", str(tmp_path / "spool"))
    )
    with pytest.raises(Exception) as e:
        reader.load()
    why = f"{missing}: no such NDJSON file (option workload=file:{missing})"
    assert _lines(e.value)[0].endswith(f"Failed to create Python data source instance: ValueError: {why}")
    with pytest.raises(ValueError) as direct:  # a URI too, through the same store resolution
        source_schema(ReaderOptions.parse({"workload": f"file:file://{missing}", "schema": "name STRING"}))
    assert str(direct.value) == f"{missing}: no such NDJSON file (option workload=file:file://{missing})"
    with pytest.raises(ValueError, match=f"^{tmp_path}: not a file"):
        source_schema(ReaderOptions.parse({"workload": f"file:{tmp_path}", "schema": "name STRING"}))
    missing.write_text('{"name": "a"}\n')
    df = reader.load()  # the file there: it loads
    assert df.columns[0] == "name"
