"""One path, one run: manifests name the run that wrote them, and another run is refused in one line.

A run is a query id (kept in the query's checkpoint, so a restart is the same run). A second live
writer, or the same query on a new checkpoint, is refused at its first commit, naming the run that
published there; its own files are deleted and the other run's files, published or in flight, are
never touched. On a local directory and on S3 (moto's server).
"""

from __future__ import annotations

import orjson
import pytest

from cp_sink.records import read_records
from cp_store import batch_log
from cp_store.batch_log import RunClash, commit, staging
from cp_store.location import Location
from cp_sync.translate.record_points import record_files

A = {"query_id": "0c579629-9313-4832-9531-6836f80f8af7", "checkpoint": "/ckpt/a"}
B = {"query_id": "d5b1f86b-dd6d-4c6c-ad13-fc385d77e73b", "checkpoint": "/ckpt/b"}


def _staged(root: Location, run: dict[str, str], batch_id: int, lo: int, hi: int) -> list[str]:
    """A task of ``run`` wrote ids [lo, hi) for ``batch_id``: where it waits to be published."""
    import pyarrow as pa

    rel = f"batch={batch_id}/records-p0-a{lo}-{run['query_id'][:6]}.parquet"
    table = pa.table({"tuple_id": pa.array(range(lo, hi), pa.int64())})
    batch_log.write_parquet(table, root.join(staging(run), rel))
    return [rel]


def _commit(root: Location, run: dict[str, str], batch_id: int, files: list[str]) -> bool:
    return commit(root, batch_id, files, [], run=run, staged=staging(run))


def _new_process() -> None:
    batch_log._SWEPT.clear()  # what a driver started afresh knows of the location: nothing


def test_a_second_writer_is_refused_naming_the_first_and_touches_none_of_its_files(root: Location) -> None:
    assert _commit(root, A, 0, _staged(root, A, 0, 0, 100))
    in_flight = _staged(root, A, 1, 100, 250)  # A's batch 1: written, its commit not yet made
    _new_process()
    b_files = _staged(root, B, 0, 1000, 1300)
    with pytest.raises(RunClash) as e:
        _commit(root, B, 0, b_files)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{root.uri}: batch 0 was published by query id {A['query_id']}")
    assert f"this query is query id {B['query_id']}, checkpoint /ckpt/b" in message
    assert not root.join(staging(B), b_files[0]).exists()  # the refused run's own files are gone
    assert root.join(staging(A), in_flight[0]).exists()  # A's batch in flight is untouched
    _new_process()
    with pytest.raises(RunClash):  # further on, past A's ids: the latest manifest is A's
        _commit(root, B, 7, _staged(root, B, 7, 2000, 2100))
    assert _commit(root, A, 1, in_flight)  # A goes on, whole
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(250))
    doc = orjson.loads(batch_log.manifest_location(root, 1).read_bytes())
    assert doc["run"] == A and doc["staged"] == staging(A) and doc["rows"] == [150]


def test_a_writer_that_started_since_is_caught_at_the_next_commit(root: Location) -> None:
    assert _commit(root, A, 0, _staged(root, A, 0, 0, 10))
    # B's manifest of batch 0 replaced A's (two first commits racing on a store without
    # conditional writes): A learns of B at its next commit, and stops there
    batch_log.manifest_location(root, 0).write_bytes(
        orjson.dumps({"v": 2, "batch_id": 0, "run": B, "files": [], "rows": [], "counts": []})
    )
    with pytest.raises(RunClash, match=rf"batch 0 was published by query id {B['query_id']}"):
        _commit(root, A, 1, _staged(root, A, 1, 10, 20))


def test_the_same_run_restarted_replays_and_finishes_what_a_crash_left(root: Location) -> None:
    first = _staged(root, A, 0, 0, 100)
    assert _commit(root, A, 0, first)
    # a crash between batch 1's manifest and its move: the file is published but still staged
    late = _staged(root, A, 1, 100, 200)
    batch_log.manifest_location(root, 1).write_bytes(
        orjson.dumps(
            {
                "v": 2,
                "batch_id": 1,
                "run": A,
                "staged": staging(A),
                "files": late,
                "rows": [100],
                "counts": [],
            }
        )
    )
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(200))  # read where it is
    assert not root.join(late[0]).exists()
    staged_late = root.join(staging(A), late[0]).path
    assert [f.path for f in record_files(root)] == [root.join(first[0]).path, staged_late]  # translate's
    _new_process()  # the same query restarted from its checkpoint: Spark replays batch 1
    assert not _commit(root, A, 1, _staged(root, A, 1, 100, 200))
    assert root.join(late[0]).exists() and not root.join(staging(A), late[0]).exists()
    assert batch_log.committed(root).keys() == {0, 1}
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(200))
