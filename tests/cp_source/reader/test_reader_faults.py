"""Faults that would duplicate or skip data across queries, checkpoints and executors.

* a new query on a spool that still holds the previous query's last batch
  (``startingOffsets``), and a restart with the same checkpoint;
* a checkpoint of another spool (or of an earlier version) is refused, and
  nothing is deleted;
* a segment file that is not the one the driver planned (forged, stale,
  planted from another spool) is detected: fetched over the network or refused.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from cloudprofiler.spark_local import source_end_offset
from cp_source.reader.options import ReaderOptions, source_schema
from cp_source.reader.stream_reader import CloudprofilerStreamReader
from cp_source.spool.segments import Spool, seg_name
from tests.helpers.filled_spool import fill_spool
from tests.helpers.ingest_truth import assert_exactly_once, output_ids
from tests.helpers.polling import wait_for
from tests.helpers.streaming import run_available_now


def _ids(*sets: set[int]) -> np.ndarray:
    return np.sort(np.fromiter(set().union(*sets), dtype=np.int64))


def _source(spark: Any, spool: Path, **options: str) -> Any:
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = spark.readStream.format("cloudprofiler").option("spool", str(spool))
    for k, v in {"factory": "external", "fetch": "local", **options}.items():
        reader = reader.option(k, v)
    return reader.load().select("tuple_id")


def _run(spark: Any, spool: Path, ckpt: Path, out: Path, **options: str) -> None:
    run_available_now(_source(spark, spool, **options), "parquet", str(ckpt), str(out))


RUNTIME_FILES = {"commit.lock", "_reader.json", "_segment_server.json"}  # locks and live status


def _files(root: Path) -> dict[str, int]:
    """Every data file under ``root`` with its size: segments, manifests, ledger, offsets."""
    return {
        str(p.relative_to(root)): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and p.name not in RUNTIME_FILES
    }


def _segments(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob("w*/seg-*.arrow"))


# ---- startingOffsets: a new checkpoint on a spool holding the previous query's last batch ------------


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_earliest_rereads_the_last_batch_and_the_same_checkpoint_stays_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    a = fill_spool(spool, {"w0": [100, 50], "w1": [80]})
    _run(spark, spool, tmp_path / "ck1", tmp_path / "out1")
    assert_exactly_once(output_ids(spark, tmp_path / "out1"), _ids(a))
    # Spark commits a batch only when it plans the next: query 1's last batch is still in the spool
    assert Spool(spool).committed() == {"w0": -1, "w1": -1}
    b = fill_spool(spool, {"w0": [40], "w1": [60]}, first_id=10_000)

    # a new checkpoint with the default (earliest) reads everything still in the spool
    _run(spark, spool, tmp_path / "ck2", tmp_path / "out2")
    assert_exactly_once(output_ids(spark, tmp_path / "out2"), _ids(a, b))

    # query 1 restarted on its own checkpoint goes on from its offsets, not from initialOffset
    _run(spark, spool, tmp_path / "ck1", tmp_path / "out1", startingOffsets="latest")
    assert_exactly_once(output_ids(spark, tmp_path / "out1"), _ids(a, b))
    sp = Spool(spool)
    assert sp.committed() == {"w0": 1, "w1": 0}  # query 1's first batch, committed when it planned B
    assert _segments(spool) == [f"w0/{seg_name(2)}", f"w1/{seg_name(1)}"]
    assert sp.skipped() == []  # a restart skips nothing, whatever startingOffsets says
    stats = sp.stats()
    assert stats.rows == len(a) + len(b) and stats.duplicate_buckets == {}


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_latest_reads_only_what_is_published_after_the_query_starts(spark: Any, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    a = fill_spool(spool, {"w0": [100, 50], "w1": [80]})
    _run(spark, spool, tmp_path / "ck1", tmp_path / "out1")  # its last batch (A) stays in the spool
    b = fill_spool(spool, {"w0": [40], "w1": [60]}, first_id=10_000)  # never read by anyone

    ckpt, out = tmp_path / "ck3", tmp_path / "out3"
    query = (
        _source(spark, spool, startingOffsets="latest")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        # the skip is recorded when the query fixes its start; only then publish C
        wait_for(lambda: Spool(spool).skipped() != [] or not query.isActive, 120, "the query to start")
        c = fill_spool(spool, {"w0": [30], "w1": [20, 10]}, first_id=20_000)
        latest = Spool(spool).latest()
        wait_for(
            lambda: source_end_offset(query) == latest or not query.isActive, 120, f"the query at {latest}"
        )
        assert query.exception() is None
    finally:
        query.stop()
    assert_exactly_once(output_ids(spark, out), _ids(c))
    (skip,) = Spool(spool).skipped()
    # A and B skipped, counted with their ids; only B was never in any query's batch
    assert skip["reason"] == "startingOffsets=latest"
    assert skip["rows"] == len(a) + len(b) and skip["rows_never_planned"] == len(b)
    assert skip["ranges"] == [[0, len(a)], [10_000, len(b)]]
    assert skip["after"] == {"w0": -1, "w1": -1} and skip["upto"] == {"w0": 2, "w1": 1}

    # the same checkpoint restarted: its offsets, not "latest" again; D is read, nothing twice
    d = fill_spool(spool, {"w0": [25], "w1": [35]}, first_id=30_000)
    _run(spark, spool, ckpt, out, startingOffsets="latest")
    assert_exactly_once(output_ids(spark, out), _ids(c, d))
    assert len(Spool(spool).skipped()) == 1
    assert Spool(spool).stats().rows == len(a) + len(b) + len(c) + len(d)


# ---- a checkpoint that does not belong to the spool ---------------------------------------------------


def _strip_spool_id(ckpt: Path) -> None:
    """Rewrite the checkpoint's last offsets as an earlier version wrote them: no spool id."""
    log = ckpt / "offsets"
    last = max(int(p.name) for p in log.iterdir() if p.name.isdigit())
    lines = (log / str(last)).read_text().splitlines()
    lines[-1] = '{"w0": 12, "w1": -1}'  # the offset of the fault: 13 segments of w0 taken as read
    (log / str(last)).write_text("\n".join(lines))
    (log / f".{last}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("checkpoint", ["other_spool", "earlier_version"])
@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_a_checkpoint_of_another_spool_is_refused_and_nothing_is_deleted(
    spark: Any, tmp_path: Path, checkpoint: str
) -> None:
    other = tmp_path / "other"
    fill_spool(other, {"w0": [10] * 14, "w1": [10]})
    ckpt = tmp_path / "ck"
    _run(spark, other, ckpt, tmp_path / "out_other")
    if checkpoint == "earlier_version":
        _strip_spool_id(ckpt)

    spool = tmp_path / "spool"  # a fresh spool with the same layout: only its id tells them apart
    ids = fill_spool(spool, {"w0": [10] * 14, "w1": [10]}, first_id=50_000)
    before = _files(spool)
    own, foreign = Spool(spool).spool_id(), Spool(other).spool_id()
    # one line naming both spools (or saying the checkpoint names none)
    message = f"SpoolMismatchError: [^\n]*offsets are of spool {foreign}, but spool {spool} is {own}"
    if checkpoint == "earlier_version":
        message = f"SpoolMismatchError: [^\n]*names no spool[^\n]*spool {spool} is {own}"
    with pytest.raises(Exception, match=message):
        _run(spark, spool, ckpt, tmp_path / "out")
    assert _files(spool) == before  # nothing deleted, committed or planned
    sp = Spool(spool)
    assert sp.committed() == {"w0": -1, "w1": -1} and sp.planned() == {"w0": -1, "w1": -1}
    assert sp.stats().rows == len(ids)
    # the spool's own checkpoint still reads all of it, once
    _run(spark, spool, tmp_path / "ck_own", tmp_path / "out_own")
    assert_exactly_once(output_ids(spark, tmp_path / "out_own"), _ids(ids))


# ---- a segment file that is not the planned one -------------------------------------------------------


def _forge(executor_view: Path, kind: str, tmp_path: Path) -> None:
    """Replace w0's segment 1 in the executor's view of the spool with another file."""
    target = executor_view / "w0" / seg_name(1)
    if kind == "other_spool":  # a real segment, same worker, number, rows and first id: another spool's
        planted = tmp_path / "planted"
        fill_spool(planted, {"w0": [100, 60]})
        shutil.copyfile(planted / "w0" / seg_name(1), target)
    elif kind == "other_segment":  # this spool's segment 0 at segment 1's path
        shutil.copyfile(executor_view / "w0" / seg_name(0), target)
    elif kind == "other_content":  # segment 1's metadata, 10 of its rows
        real = pa.ipc.open_file(pa.py_buffer(target.read_bytes())).read_all()  # not mapped: rewritten below
        with pa.OSFile(str(target), "wb") as f, pa.ipc.new_file(f, real.schema) as w:
            w.write_table(real.slice(0, 10))
    else:
        target.write_bytes(b"not an arrow file" * 10)


def _plan(spool: Path, fetch: str) -> tuple[CloudprofilerStreamReader, list[Any]]:
    """The driver side of a reader on ``spool``: its partitions of everything published."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    options = {"spool": str(spool), "factory": "external", "fetch": fetch}
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    start = reader.initialOffset()
    return reader, reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))


def _read(reader: CloudprofilerStreamReader, parts: list[Any]) -> np.ndarray:
    """What executors would read: a pickled copy of the reader, each partition in turn."""
    executor = pickle.loads(pickle.dumps(reader))
    ids = [b.column("tuple_id").to_numpy() for p in parts for b in executor.read(p)]
    return np.sort(np.concatenate(ids))


def _served(spool: Path) -> int:
    try:
        return int(orjson.loads((spool / "_segment_server.json").read_bytes())["segments_served"])
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("kind", ["other_spool", "other_segment", "other_content", "not_arrow"])
def test_a_forged_local_segment_is_fetched_over_the_network_or_refused(tmp_path: Path, kind: str) -> None:
    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [100, 60], "w1": [40]})
    # the executor's local file system: a stale copy of the spool, with w0's segment 1 replaced
    view = tmp_path / "executor"
    shutil.copytree(spool, view)
    _forge(view, kind, tmp_path)
    for fetch in ("auto", "local"):
        reader, parts = _plan(spool, fetch)
        try:
            for p in parts:
                p.segments = [(n, path.replace(str(spool), str(view)), r, f) for n, path, r, f in p.segments]
            if fetch == "auto":  # detected, then read from the driver's spool over the network
                assert_exactly_once(_read(reader, parts), _ids(ids))
            else:  # no network to fall back on: refused, naming the segment
                with pytest.raises(RuntimeError, match=r"segment w0/1 at .* is not the planned one: "):
                    _read(reader, parts)
        finally:
            reader.stop()  # the segment server writes its final counters
        if fetch == "auto":
            assert _served(spool) == 1  # only the forged segment came over the network
    sp = Spool(spool)
    assert sp.stats().rows == len(ids) and sp.committed() == {"w0": -1, "w1": -1}


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_a_planted_segment_in_the_spool_fails_the_query_and_nothing_is_committed(
    spark: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [100, 60], "w1": [40]})
    real = (spool / "w0" / seg_name(1)).read_bytes()
    _forge(spool, "other_spool", tmp_path)  # the driver's own file is wrong: the fetch is checked too
    before = _segments(spool)
    ckpt, out = tmp_path / "ck", tmp_path / "out"
    own = Spool(spool).spool_id()
    with pytest.raises(Exception, match=rf"segment w0/1 from the segment server [^\n]*, not {own}"):
        _run(spark, spool, ckpt, out, fetch="auto")
    assert _segments(spool) == before  # nothing deleted
    sp = Spool(spool)
    assert sp.committed() == {"w0": -1, "w1": -1} and sp.stats().rows == len(ids)
    assert not list(out.glob("_spark_metadata/[0-9]*"))  # no batch reached the sink
    # the real segment back in place, the same checkpoint replays the batch: everything, once
    (spool / "w0" / seg_name(1)).write_bytes(real)
    _run(spark, spool, ckpt, out, fetch="auto")
    assert_exactly_once(output_ids(spark, out), _ids(ids))
