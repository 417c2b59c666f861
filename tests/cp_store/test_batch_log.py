"""The commit protocol without rename (cp_store.batch_log) on a local directory and on S3 (moto's server).

Files first under unique names, one manifest last: a reader sees a batch whole or not at all, a
replayed batch id publishes nothing, files no manifest lists are never read and are swept, and a
manifest that is not one the protocol wrote is refused in one line naming it and its field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from cp_sink.records import published_batches, read_counts, read_records
from cp_store import batch_log, manifests
from cp_store.batch_log import ManifestError, commit, publish, sweep_history
from cp_store.location import Location, StoreError, resolve


def _ids(lo: int, hi: int) -> pa.Table:
    return pa.table({"tuple_id": pa.array(range(lo, hi), pa.int64())})


def _write(root: Location, rel: str, lo: int, hi: int) -> str:
    batch_log.write_parquet(_ids(lo, hi), root.join(rel))
    return rel


def _names(root: Location, batch_id: int) -> set[str]:
    """What is under ``batch=<id>/`` now, relative to the location."""
    return {f"batch={batch_id}/{i.base_name}" for i in batch_log.batch_dir(root, batch_id).children()}


def test_a_batch_is_published_once_and_a_replay_publishes_nothing(root: Location) -> None:
    first = [
        _write(root, "batch=0/records-p0-a0-aa.parquet", 0, 5),
        _write(root, "batch=0/records-p1-a1-bb.parquet", 5, 9),
    ]
    assert read_records(root).num_rows == 0  # written, not committed: invisible
    assert commit(root, 0, first, [{"batch_id": 0, "partition": 0, "seen": 5}, {"partition": 1, "seen": 4}])
    manifest = batch_log.manifest_location(root, 0).read_bytes()
    # the replay (a restart before Spark logged the batch) brings other data under other names
    replay = [_write(root, "batch=0/records-p0-a7-cc.parquet", 100, 150)]
    assert not commit(root, 0, replay, [{"partition": 0, "seen": 50}])
    assert batch_log.manifest_location(root, 0).read_bytes() == manifest
    assert _names(root, 0) == set(first)  # the replay's file is gone, the first publication whole
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(9))
    assert read_counts(root).select(["batch_id", "partition", "seen"]).to_pylist() == [
        {"batch_id": 0, "partition": 0, "seen": 5},
        {"batch_id": 0, "partition": 1, "seen": 4},
    ]
    doc = orjson.loads(manifest)
    assert (doc["v"], doc["batch_id"], doc["files"], doc["rows"]) == (2, 0, first, [5, 4])
    # publish: one process's whole batch; an id already committed writes nothing
    assert publish(root, 1, {"records-0.parquet": _ids(9, 12)}, [{"seen": 3}])
    assert not publish(root, 1, {"records-1.parquet": _ids(50, 60)})
    assert _names(root, 1) == {"batch=1/records-0.parquet"}
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(12))
    assert sorted(published_batches(root)) == [0, 1]


def test_unlisted_files_are_never_read_and_are_swept_listed_ones_never(
    root: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed: dict[int, list[str]] = {}

    def ok(b: int) -> list[str]:  # the attempt of batch b whose message reaches the commit
        listed[b] = [_write(root, f"batch={b}/records-p0-a{b}-ok.parquet", 10 * b, 10 * b + 10)]
        return listed[b]

    assert commit(root, 0, ok(0), []) and commit(root, 1, ok(1), [])
    # what attempts that never reached a commit leave: a late speculative copy in batch 0, a
    # crashed attempt of batch 2 (no manifest yet), a failed attempt of batch 3
    late0 = _write(root, "batch=0/records-p0-a5-late.parquet", 0, 10)
    crashed2 = _write(root, "batch=2/records-p0-a6-crash.parquet", 20, 30)
    failed3 = _write(root, "batch=3/records-p1-a8-fail.parquet", 30, 40)
    stale = root.join("_commits", "2.json.tmp-0a1b2c")  # a local manifest write cut short
    if root.is_local:
        stale.write_bytes(b'{"v": 1, "batch_')
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(20))
    batch_log.abort(root, 3, [failed3])
    assert _names(root, 3) == set()
    # a commit sweeps its own batch and the one before; older directories are left to ...
    assert commit(root, 2, ok(2), [])
    assert _names(root, 2) == set(listed[2]) and late0 in _names(root, 0)
    # ... the first commit a process makes on the location: every earlier batch directory
    monkeypatch.setattr(batch_log, "_SWEPT", set())
    assert commit(root, 3, ok(3), [])
    assert [_names(root, b) for b in range(4)] == [set(listed[b]) for b in range(4)]
    assert not stale.exists()
    assert sweep_history(root, 10) == []  # nothing left; nothing listed ever deleted
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(40))
    assert {late0, crashed2, failed3}.isdisjoint(set().union(*(_names(root, b) for b in range(4))))


def test_a_listed_file_that_is_missing_is_one_line_naming_it(root: Location) -> None:
    rel = _write(root, "batch=3/records-p0-a0-aa.parquet", 0, 3)
    assert commit(root, 3, [rel], [])
    root.join(rel).delete()
    with pytest.raises(StoreError) as e:
        read_records(root)
    assert str(e.value) == f"{root.uri}/{rel}: listed by {root.uri}/_commits/3.json but missing"


BAD_MANIFESTS: list[tuple[Any, str]] = [
    (b"{not json", "not JSON"),
    ([1, 2], "expected a JSON object, got [1, 2]"),
    ({"v": 3, "batch_id": 4, "files": [], "counts": []}, "field v: expected one of (1, 2), got 3"),
    (
        {"v": 1, "batch_id": 4, "files": ["batch=4/a.parquet", "batch=4/a.parquet"], "counts": []},
        "field files[1]: 'batch=4/a.parquet' is listed twice",
    ),
    (
        {"v": 2, "batch_id": 4, "files": ["batch=4/a.parquet"], "rows": [], "counts": []},
        "field rows: expected a list of 1 row counts, got []",
    ),
    (
        {"v": 2, "batch_id": 4, "files": ["batch=4/a.parquet"], "rows": [-1], "counts": []},
        "field rows[0]: expected a row count, got -1",
    ),
    (
        {"v": 2, "batch_id": 4, "files": [], "rows": [], "run": "me", "counts": []},
        "field run: expected an object of strings, got 'me'",
    ),
    ({"v": 1, "batch_id": 5, "files": [], "counts": []}, "field batch_id: expected 4, got 5"),
    ({"v": 1, "batch_id": True, "files": [], "counts": []}, "field batch_id: expected 4, got True"),
    ({"v": 1, "batch_id": 4, "files": "batch=4/a.parquet", "counts": []}, "field files: expected a list"),
    (
        {"v": 1, "batch_id": 4, "files": ["../../etc/passwd"], "counts": []},
        "field files[0]: '../../etc/passwd' is not batch=<id>/<name>",
    ),
    (
        {"v": 1, "batch_id": 4, "files": ["batch=4/ok.parquet", "_commits/4.json"], "counts": []},
        "field files[1]: '_commits/4.json' is not",
    ),
    (
        {"v": 1, "batch_id": 4, "files": ["batch=4/.."], "counts": []},
        "field files[0]: 'batch=4/..' has a bad file name",
    ),
    ({"v": 1, "batch_id": 4, "files": [7], "counts": []}, "field files[0]: expected a path, got 7"),
    ({"v": 1, "batch_id": 4, "files": [], "counts": {"seen": 1}}, "field counts: expected a list of rows"),
    (
        {"v": 1, "batch_id": 4, "files": [], "counts": ["row"]},
        "field counts[0]: expected an object, got 'row'",
    ),
]


@pytest.mark.parametrize(("doc", "problem"), BAD_MANIFESTS)
def test_a_bad_manifest_is_refused_in_one_line_naming_it_and_the_field(
    tmp_path: Path, doc: Any, problem: str
) -> None:
    root = resolve(tmp_path / "out")
    batch_log.manifest_location(root, 4).write_bytes(doc if isinstance(doc, bytes) else orjson.dumps(doc))
    with pytest.raises(ManifestError) as e:
        read_records(root)
    assert str(e.value).startswith(f"{root.uri}/_commits/4.json: {problem}"), str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_counts_value_or_an_oversized_manifest_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = resolve(tmp_path / "out")
    where = f"{root.uri}/_commits/0.json"
    assert commit(root, 0, [], [{"partition": 0, "seen": "many"}])  # the writer's counts are not re-checked
    with pytest.raises(
        ManifestError, match=rf"^{where}: field counts\[0\].seen: expected int64, got 'many'$"
    ):
        read_counts(root)
    assert read_records(root).num_rows == 0  # the files are fine: records do not need the counts
    batch_log.manifest_location(root, 0).write_bytes(
        orjson.dumps({"v": 1, "batch_id": 0, "files": [], "counts": [{"sen": 1}]})
    )
    with pytest.raises(ManifestError, match=rf"^{where}: field counts\[0\].sen: not a counts column$"):
        read_counts(root)
    monkeypatch.setattr(manifests, "MAX_MANIFEST_BYTES", 64)
    batch_log.manifest_location(root, 0).write_bytes(b" " * 65)
    with pytest.raises(ManifestError, match=rf"^{where}: manifest of 65 bytes is over the cap of 64$"):
        read_records(root)
    with pytest.raises(ManifestError, match=r"^batch 1: manifest of \d+ bytes is over the cap of 64$"):
        commit(root, 1, ["batch=1/" + "x" * 80 + ".parquet"], [], rows=[0])
    assert not batch_log.is_committed(root, 1)


def test_one_parquet_writer_replaces_a_file_whole_or_not_at_all(tmp_path: Path) -> None:
    """The sink's files and the tools' tables go through one writer: a write that fails midway keeps
    the file that was there and leaves no temporary file."""
    from cp_store import tables

    assert batch_log.write_parquet is tables.write_parquet
    loc = resolve(tmp_path / "out" / "records-a.parquet")
    batch_log.write_parquet(_ids(0, 3), loc)
    with pytest.raises(pa.ArrowException, match="Unsupported compression: bogus"):
        batch_log.write_parquet(_ids(0, 5), loc, compression="bogus")
    assert tables.read_table(loc)["tuple_id"].to_pylist() == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["records-a.parquet"]
    tables.write_parquet(_ids(7, 9), loc, durable=True)  # fsynced before its rename
    assert tables.read_table(loc)["tuple_id"].to_pylist() == [7, 8]
