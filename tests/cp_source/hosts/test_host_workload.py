"""A factory host and a query of different workloads: refused at start, in one line naming both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cp_source.wire.workload_id import WorkloadMismatch, identify, parse_id
from tests.helpers.netns_hosts import FactoryHost

SCHEMA = "name STRING, n BIGINT"


@pytest.fixture(scope="module")
def ysb_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FactoryHost]:
    """One ysb factory host for the module: no test here reads or commits its segments."""
    host = FactoryHost(tmp_path_factory.mktemp("ysb") / "spool", workers=1)
    yield host
    host.stop()


def test_a_query_of_another_workload_fails_at_start_naming_the_host_and_both_workloads(
    spark: Any, tmp_path: Path, ysb_host: FactoryHost
) -> None:
    import cloudprofiler

    data = tmp_path / "mine.ndjson"
    data.write_text('{"name": "a", "n": 1}\n')
    cloudprofiler.register(spark)
    query = (
        spark.readStream.format("cloudprofiler")
        .option("factories", ysb_host.server)
        .option("statusDir", str(tmp_path / "status"))
        .option("workload", f"file:{data}")
        .option("schema", SCHEMA)
        .load()
        .writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "records"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as e:
        query.awaitTermination(60)
    lines = [ln for ln in str(e.value).splitlines() if "serves workload" in ln]
    assert lines, str(e.value)[-2000:]
    line = lines[0][lines[0].index("factory host") :]
    assert line.startswith(f"factory host {ysb_host.server} serves workload ysb (fields: user_id string, ")
    assert f"but this query reads workload file:{data} (fields: name string, n int64)" in line
    assert not (tmp_path / "records").exists() or not list((tmp_path / "records").rglob("*.parquet"))


def test_a_query_of_the_hosts_workload_is_taken(tmp_path: Path, ysb_host: FactoryHost) -> None:
    """The same workload passes; another is refused, in arrival and ready ordering (the links alone)."""
    from cp_source.hosts.factory_hosts import FactoryHosts
    from cp_source.hosts.links import HostLinks
    from cp_source.hosts.ready_hosts import ReadyHosts

    same = FactoryHosts((ysb_host.server,), 0.0, str(tmp_path / "s1"), workload=identify("ysb", None))
    try:
        assert "factories" in same.initial_offset()
    finally:
        same.stop()
    other = FactoryHosts((ysb_host.server,), 0.0, str(tmp_path / "s2"), workload=identify("file:x", SCHEMA))
    try:
        with pytest.raises(WorkloadMismatch, match="serves workload ysb") as e:
            other.initial_offset()
        assert "\n" not in str(e.value)
    finally:
        other.stop()
    # ordering=ready asks the hosts with its own op: refused the same way
    links = HostLinks((ysb_host.server,), 0.0, str(tmp_path / "s3"), workload=identify("file:x", SCHEMA))
    try:
        with pytest.raises(WorkloadMismatch, match="serves workload ysb"):
            ReadyHosts(links, None, (), 30.0).initial_offset()
    finally:
        links.stop()


@pytest.mark.parametrize(
    "said",
    [
        [],
        {"name": "ysb"},
        {"name": "", "fields": ""},
        {"name": "y" * 65, "fields": ""},
        {"name": "ysb", "fields": "x" * (16 << 10 + 1)},
        {"name": "ysb", "fields": "a\nb"},
    ],
)
def test_a_workload_out_of_shape_is_refused(said: Any) -> None:
    with pytest.raises(ValueError):
        parse_id(said)
