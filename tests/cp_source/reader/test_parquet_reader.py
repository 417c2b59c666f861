"""A Parquet file replayed through the whole path: generator, ZeroMQ, the reader's embedded factory
(option workload=parquet:PATH), Spark, a Parquet sink; every row's values exact, by tuple id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cloudprofiler import wait_for_factory
from cloudprofiler.spark_local import source_end_offset
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.reader.options import ReaderOptions
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import spool_drained
from tests.helpers.parquet_sample import write_sample
from tests.helpers.polling import wait_for

N, SENDER = 300, 31


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_a_parquet_file_streams_through_the_reader_with_exact_values(spark, tmp_path: Path) -> None:
    carried = write_sample(tmp_path / "sample.parquet", n=N)
    workload = f"parquet:{tmp_path}/sample.parquet"
    spool, out = tmp_path / "spool", tmp_path / "out"
    df = embedded_source(spark, spool, workers=1, workload=workload)
    assert df.schema.fieldNames()[: len(carried.column_names)] == carried.column_names
    query = (
        df.select(*carried.column_names, "tuple_id")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        state = wait_for_factory(str(spool), query)
        summary = run_generator(
            state.factory_endpoint,
            GeneratorSettings(
                rate=1200, duration=N / 1200, bucket=100, workload=workload, sender_base=SENDER
            ),
        )
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to reach {latest}")
        # the file sink's listing can trail the query's progress: read until it holds every row
        wait_for(lambda: spark.read.parquet(str(out)).count() >= N, 60, f"the sink to hold {N} rows")
        assert query.exception() is None
    finally:
        query.stop()
    got = spark.read.parquet(str(out)).toArrow().sort_by("tuple_id")
    np.testing.assert_array_equal(got.column("tuple_id").to_numpy(), bk.tuple_id(SENDER, 0) + np.arange(N))
    got = got.drop_columns(["tuple_id"])
    got = got.set_column(5, "ts", got.column("ts").cast(pa.timestamp("us", tz="UTC")))
    assert got.equals(carried), got.schema  # every row, every column: the file's row n is tuple n


def test_reader_options_spell_the_parquet_workload_once() -> None:
    opts = ReaderOptions.parse({"workload": "parquet:s3://bucket/sample.parquet"})
    assert (opts.workload, opts.schema_ddl) == ("parquet:s3://bucket/sample.parquet", None)
    for given, why in (
        ({"workload": "parquet:"}, "expected ysb, file:PATH or parquet:PATH"),
        ({"workload": "parquet"}, "expected ysb, file:PATH or parquet:PATH"),
        ({"workload": "parquet:/x.parquet", "schema": "a INT"}, "a Parquet file carries its own"),
    ):
        with pytest.raises(ValueError, match=why):
            ReaderOptions.parse(given)
