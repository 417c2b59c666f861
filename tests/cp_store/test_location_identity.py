"""A location's identity: everything that names the place (store, account, container or bucket,
host and port, path) and no credential. Per-process tables are keyed by it, never by the printable
URI, which on Azure leaves out the container: two queries writing two containers under one path
in one driver each keep every id exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest

from cp_sink import read_records, total_seen
from cp_sink.records import published_batches
from cp_store.location import resolve
from cp_store.place import STAND_IN
from cp_sync.auto.driver import path_key
from tests.helpers.polling import wait_for
from tests.helpers.streaming import rate_ids_into_sink, worker_env

ALPHA = "abfs://alpha@acct.dfs.core.windows.net/records"
BETA = "abfs://beta@acct.dfs.core.windows.net/records"
S3 = "s3://results/records?region=us-east-1"  # a region given: pyarrow asks no server for it
ROWS_PER_BATCH = 100
BATCHES = 3


def test_the_azure_container_is_part_of_the_identity() -> None:
    alpha, beta = resolve(ALPHA), resolve(BETA)
    assert alpha.identity != beta.identity
    assert alpha.join("_commits", "0.json").identity != beta.join("_commits", "0.json").identity
    assert resolve(ALPHA).identity == alpha.identity
    assert resolve("abfs://acct.dfs.core.windows.net/alpha/records").identity != beta.identity
    # one sync coordinator per place: beta's query never joins alpha's
    assert path_key(alpha.identity) != path_key(beta.identity)


@pytest.mark.parametrize(
    "one, other",
    [
        ("abfs://acct@127.0.0.1:10000/c/records", "abfs://acct@127.0.0.1:10001/c/records"),
        ("abfs://acct@127.0.0.1:10000/c/records", "abfs://acct@127.0.0.2:10000/c/records"),
        ("abfs://acct1@127.0.0.1:10000/c/records", "abfs://acct2@127.0.0.1:10000/c/records"),
        (
            "abfs://alpha@acct1.dfs.core.windows.net/records",
            "abfs://alpha@acct2.dfs.core.windows.net/records",
        ),
        (f"{S3}&endpoint_override=127.0.0.1:9000", f"{S3}&endpoint_override=127.0.0.1:9001"),
        (f"{S3}&endpoint_override=10.0.0.1:9000", f"{S3}&endpoint_override=10.0.0.2:9000"),
        (S3, "s3://other/records?region=us-east-1"),
        (S3, "gs://anonymous@results/records"),
        (S3, "s3://results/records2?region=us-east-1"),
    ],
)
def test_locations_on_other_hosts_ports_accounts_or_buckets_are_other_places(one: str, other: str) -> None:
    assert resolve(one).identity != resolve(other).identity
    assert resolve(one).identity == resolve(one).identity


def test_credentials_are_never_part_of_the_identity() -> None:
    keyed = resolve("s3://AKIDEXAMPLE:SeCrEtKeY0@results/records?region=us-east-1")
    other_key = resolve("s3://AKIDOTHER:AnOtHeRsEcReT@results/records?region=us-east-1")
    azure = resolve("abfs://acct:PaSsWoRd0@127.0.0.1:10000/c/records")
    for secret in ("AKIDEXAMPLE", "SeCrEtKeY0"):
        assert secret not in keyed.identity
    assert "PaSsWoRd0" not in azure.identity
    assert keyed.identity == other_key.identity == resolve(S3).identity  # the same place


# ---- two queries, two containers, one driver ----------------------------------------------------


@pytest.fixture
def containers(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session with a local directory standing in for Azure, in this process and its workers."""
    store = tmp_path / "store"
    for container in ("alpha", "beta"):
        (store / container).mkdir(parents=True)  # containers exist before a query writes to them
    monkeypatch.setenv(STAND_IN, str(store))
    with worker_env(spark, {STAND_IN: str(store)}):
        yield spark


def _start(spark: Any, path: str, ck: Path) -> Any:
    # a 500 ms trigger: slow enough to stop right after a target batch
    return rate_ids_into_sink(spark, path, str(ck), ROWS_PER_BATCH, trigger_ms=500)


def _run(spark: Any, path: str, ck: Path, batches: int) -> None:
    """Run the query of ``path`` until ``batches`` are published, then stop it."""
    q = _start(spark, path, ck)
    try:
        wait_for(lambda: len(published_batches(path)) >= batches or not q.isActive, 90, f"{batches} batches")
    finally:
        q.stop()
    assert q.exception() is None


def _assert_exact(path: str) -> int:
    """Every id of the published batches exactly once, every listed file still there; the batches."""
    published = published_batches(path)
    batches = max(published) + 1
    assert sorted(published) == list(range(batches))
    ids = read_records(path)["tuple_id"].to_numpy()
    assert ids.size == batches * ROWS_PER_BATCH == total_seen(path)
    assert np.array_equal(np.sort(ids), np.arange(batches * ROWS_PER_BATCH))
    root = resolve(path)
    for manifest in published.values():
        for f in manifest.files:
            assert root.join(f).info().type == pafs.FileType.File, f
    return batches


@pytest.mark.long  # three query runs: ~25 s
def test_queries_to_two_containers_under_one_path_in_one_driver_each_stay_exact(
    containers: Any, tmp_path: Path
) -> None:
    # Spark commits each batch in a pooled Python worker: the queries, one after the other, share it
    # and its per-process tables. Beta ends on the batch alpha ended on, so alpha's next commit finds
    # "its" last batch in them, with beta's file list, if the two are one location.
    _run(containers, ALPHA, tmp_path / "ck-alpha", BATCHES)
    alpha = _assert_exact(ALPHA)
    _run(containers, BETA, tmp_path / "ck-beta", alpha)
    _run(containers, ALPHA, tmp_path / "ck-alpha", alpha + 2)
    assert _assert_exact(ALPHA) >= alpha + 2
    assert _assert_exact(BETA) >= alpha
    store = tmp_path / "store"
    assert {p.parts[-4] for p in store.rglob("*.parquet")} == {"alpha", "beta"}  # nothing written elsewhere
