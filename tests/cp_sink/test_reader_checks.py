"""The readers of a sink path (cp_sink.records) check what they are given, on a local directory and
on S3 (moto's server): each listed file's rows against its manifest, a file listed by two batches,
records without tuple ids, a file whose columns do not join the others', a path that is not there,
and batch ids that skip some. Every error is one line naming the file or the path.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from cp_sink.records import (
    GAPS_KEY,
    BatchGapWarning,
    RecordsError,
    batch_gaps,
    read_counts,
    read_records,
    read_windows,
)
from cp_store import batch_log
from cp_store.location import Location, StoreError, check_writable


def _ids(lo: int, hi: int) -> pa.Table:
    return pa.table({"tuple_id": pa.array(range(lo, hi), pa.int64())})


def _manifest(root: Location, batch_id: int, doc: dict) -> str:
    """Write a manifest by hand (what another writer, or a hand, may leave); its URI."""
    loc = batch_log.manifest_location(root, batch_id)
    loc.write_bytes(orjson.dumps({"batch_id": batch_id, **doc}))
    return loc.uri


def _error(exc: type[Exception], fn, *args) -> str:
    with pytest.raises(exc) as e:
        fn(*args)
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_listed_file_replaced_by_one_with_more_rows_is_refused_naming_it(root: Location) -> None:
    assert batch_log.publish(root, 0, {"records-a.parquet": _ids(0, 300)}, [{"seen": 300, "written": 300}])
    assert read_records(root).num_rows == 300
    batch_log.write_parquet(_ids(0, 900), root.join("batch=0/records-a.parquet"))  # three times the rows
    assert _error(RecordsError, read_records, root) == (
        f"{root.uri}/batch=0/records-a.parquet: 900 rows, but {root.uri}/_commits/0.json lists it "
        "with 300 (replaced or rewritten after it was published)"
    )


def test_a_version_1_manifest_is_checked_against_its_counts_written(root: Location) -> None:
    batch_log.write_parquet(_ids(0, 300), root.join("batch=0/records-a.parquet"))
    files = ["batch=0/records-a.parquet"]
    _manifest(root, 0, {"v": 1, "files": files, "counts": [{"seen": 300, "written": 300}]})
    assert sorted(read_records(root)["tuple_id"].to_pylist()) == list(range(300))  # still read
    batch_log.write_parquet(_ids(0, 900), root.join(files[0]))
    assert _error(RecordsError, read_records, root) == (
        f"{root.uri}/_commits/0.json: the records files it lists hold 900 rows, its counts say 300 written"
    )
    # counts without "written" (a hand-made manifest): nothing to check against
    _manifest(root, 0, {"v": 1, "files": files, "counts": [{"seen": 300}]})
    assert read_records(root).num_rows == 900


def test_a_file_listed_by_two_batches_is_refused_naming_both_manifests(root: Location) -> None:
    assert batch_log.publish(root, 0, {"records-a.parquet": _ids(0, 300)})
    second = _manifest(root, 1, {"v": 2, "files": ["batch=0/records-a.parquet"], "rows": [300], "counts": []})
    want = f"{root.uri}/batch=0/records-a.parquet: listed by both {root.uri}/_commits/0.json and {second}"
    assert _error(RecordsError, read_records, root) == want
    assert _error(RecordsError, read_counts, root) == want  # the counts would hold a batch twice too


def test_records_without_tuple_ids_are_refused_naming_the_file(root: Location) -> None:
    assert batch_log.publish(root, 0, {"records-a.parquet": _ids(0, 10)})
    assert batch_log.publish(root, 1, {"records-b.parquet": pa.table({"x": pa.array(range(10))})})
    assert _error(RecordsError, read_records, root) == (
        f"{root.uri}/batch=1/records-b.parquet: a records file without a tuple_id column "
        f"(listed by {root.uri}/_commits/1.json)"
    )
    nulls = pa.table({"tuple_id": pa.array([1, None, None], pa.int64())})
    batch_log.write_parquet(nulls, root.join("batch=1/records-b.parquet"))
    _manifest(root, 1, {"v": 2, "files": ["batch=1/records-b.parquet"], "rows": [3], "counts": []})
    assert _error(RecordsError, read_records, root) == (
        f"{root.uri}/batch=1/records-b.parquet: 2 records with a null tuple_id "
        f"(listed by {root.uri}/_commits/1.json)"
    )


def test_a_file_whose_columns_do_not_join_the_others_is_named(root: Location) -> None:
    assert batch_log.publish(root, 0, {"records-a.parquet": _ids(0, 10)})
    other = pa.table({"tuple_id": pa.array(range(10, 20)), "cp_tsc_sink": pa.array(["x"] * 10)})
    assert batch_log.publish(root, 1, {"records-b.parquet": other})
    mixed = pa.table({"tuple_id": pa.array(range(20, 30)), "cp_tsc_sink": pa.array(range(10))})
    assert batch_log.publish(root, 2, {"records-c.parquet": mixed})
    text = _error(RecordsError, read_records, root)
    assert text.startswith(
        f"{root.uri}/batch=2/records-c.parquet: its columns do not match the files read before it "
        f"(the first: {root.uri}/batch=0/records-a.parquet): "
    ), text
    assert "cp_tsc_sink" in text


def test_a_listed_file_that_is_not_parquet_is_named(root: Location) -> None:
    assert batch_log.publish(root, 0, {"records-a.parquet": _ids(0, 10)})
    root.join("batch=0/records-a.parquet").write_bytes(b"not parquet at all, not even close")
    text = _error(RecordsError, read_records, root)
    assert text.startswith(f"{root.uri}/batch=0/records-a.parquet: "), text
    assert text.endswith(f"(listed by {root.uri}/_commits/0.json)")


def test_a_path_that_is_not_there_is_an_error_naming_it(root: Location, tmp_path: Path) -> None:
    for reader in (read_records, read_counts, read_windows):
        assert _error(StoreError, reader, root) == f"sink path {root.uri} does not exist"
    if not root.is_local:
        assert _error(StoreError, read_records, "s3://nobucket/records") == (
            "sink path s3://nobucket/records: bucket 'nobucket' is missing or hidden from these credentials"
        )
    # a query that has started (check_writable, as the sink does) but not committed: no rows yet
    check_writable(root)
    assert read_records(root).num_rows == 0 and read_counts(root).num_rows == 0
    batch_log.write_parquet(_ids(0, 5), root.join("batch=0/records-p0-a0-x.parquet"))  # a task's file
    assert read_records(root).num_rows == 0
    # a directory that holds other things and nothing a sink published: not a sink path
    other = root.join("elsewhere")
    batch_log.write_parquet(_ids(0, 5), other.join("part-0.parquet"))
    assert _error(StoreError, read_records, other) == (
        f"sink path {other.uri}: no _commits/ (nothing a sink published), but it holds "
        "'part-0.parquet': is it the sink's path?"
    )


def test_batch_ids_that_skip_some_are_reported_by_every_reader(root: Location) -> None:
    # a store emptied under a running query: batches 0-7 gone, 8 and 9 published after
    for b in (8, 9, 12):
        assert batch_log.publish(root, b, {"records-a.parquet": _ids(10 * b, 10 * b + 10)}, [{"seen": 10}])
    note = (
        f"{root.uri}: committed batch ids skip 0-7,10-11 (10 batches without a manifest: removed, or the "
        "store emptied under the query); their rows are in no result"
    )
    assert batch_gaps(root) == [(0, 7), (10, 11)]
    for reader, rows in ((read_records, 30), (read_counts, 3), (read_windows, 0)):
        with pytest.warns(BatchGapWarning) as caught:
            t = reader(root)
        assert [str(w.message) for w in caught] == [note]
        assert t.num_rows == rows and t.schema.metadata[GAPS_KEY] == b"0-7,10-11"
    # ids contiguous from 0: no warning, no metadata
    for b in (*range(8), 10, 11):
        assert batch_log.publish(root, b, {"records-a.parquet": _ids(10 * b, 10 * b + 10)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = read_records(root)
    assert sorted(t["tuple_id"].to_pylist()) == list(range(130))
    assert GAPS_KEY not in (t.schema.metadata or {}) and batch_gaps(root) == []
