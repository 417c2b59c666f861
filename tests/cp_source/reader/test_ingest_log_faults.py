"""The ingest log's disk fills up mid-run: the query fails naming progressLog, and a restart with room
delivers every tuple exactly once with every bucket logged once (nothing accepted is lost)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from tests.helpers.ingest_truth import assert_exactly_once, expected_ids
from tests.helpers.streaming import await_query
from tests.helpers.tmpfs import small_tmpfs

pytestmark = pytest.mark.long

BATCH = 2000  # largest maxRecordsPerTrigger of the run that fills the disk: a log file a batch
PAGE = 4096
# Room left on the small disk: one log file of a batch fits (they are 6-12 KB), a few cannot, and a
# file takes at least a page, so a run of more than FREE_PAGES + 1 files certainly fills it.
FREE_PAGES = 5


def _query(spark: Any, spool: Path, log: Path, out: Path, ckpt: Path, limit: int | None) -> Any:
    import cloudprofiler

    cloudprofiler.register(spark)
    r = spark.readStream.format("cloudprofiler").option("spool", str(spool)).option("factory", "external")
    if limit is not None:
        r = r.option("maxRecordsPerTrigger", str(limit))  # small batches: log files until the disk is full
    df = r.option("progressLog", str(log)).load().select("tuple_id", "cp_tsc_source", "cp_node_source")
    w = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
    )
    return w.trigger(availableNow=True).start()


def _fill(mnt: Path, free_pages: int) -> int:
    """Write a ballast file on ``mnt`` so that only ``free_pages`` pages stay free; the free bytes."""
    st = os.statvfs(mnt)
    ballast = st.f_bavail * st.f_frsize - free_pages * PAGE
    assert ballast > 0, f"the small disk has only {st.f_bavail * st.f_frsize} bytes free"
    with open(mnt / "ballast", "wb") as f:
        f.write(b"\0" * ballast)
    st = os.statvfs(mnt)
    assert st.f_bavail * st.f_frsize == free_pages * PAGE, "the ballast did not leave the free room asked"
    return free_pages * PAGE


def _failure(q: Any, log_dir: Path, free: int, timeout: float = 300.0) -> str:
    """The message of the query's failure; a clear test failure when it hangs or ends cleanly."""
    from pyspark.errors import StreamingQueryException

    try:
        finished = q.awaitTermination(timeout)  # raises the query's failure; False on timeout
    except StreamingQueryException as e:
        return str(e)
    if not finished:
        progress = q.lastProgress
        q.stop()
        pytest.fail(f"the query neither failed nor finished in {timeout:.0f}s; last progress: {progress}")
    if q.exception() is None:
        files = sorted(log_dir.glob("*.parquet")) if log_dir.is_dir() else []
        sizes = [f.stat().st_size for f in files]
        pytest.fail(
            f"the query finished without error: {len(files)} log files ({sum(sizes)} bytes, {sizes}) "
            f"fit in the {free} bytes left free on the small disk"
        )
    return str(q.exception())


def test_a_full_log_disk_fails_the_query_and_a_restart_loses_nothing(spark: Any, tmp_path: Path) -> None:
    from cp_sink import read_records
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.reader.ingest_log import read_ingest_log
    from cp_source.spool.segments import Spool

    spool, out, ckpt = tmp_path / "spool", tmp_path / "out", tmp_path / "ckpt"
    factory = start_factory("tcp://127.0.0.1:0", spool, workers=2)
    try:
        summary = run_generator(factory.endpoint, GeneratorSettings(rate=20_000, duration=2.0, bucket=5))
    finally:
        factory.stop()
    want, _ = expected_ids(summary, Spool(spool).stats())
    # A loaded machine drops some of the offered tuples (counted); the batch shrinks so that there are
    # still twice the batches (a log file each, a page at least) that overflow the free room.
    batch = min(BATCH, len(want) // (2 * (FREE_PAGES + 2)))
    assert batch >= 100, f"only {len(want)} tuples reached the spool: too few to fill the disk"
    with small_tmpfs(tmp_path / "small", "64k") as small:
        free = _fill(small, FREE_PAGES)
        q = _query(spark, spool, small / "plog", out, ckpt, batch)
        err = _failure(q, small / "plog" / "ingest", free)
        assert "option progressLog: cannot write the ingest log" in err and "No space left" in err, err
        partial = read_records(out)["tuple_id"].to_numpy()
        # it stopped before the end, having delivered only tuples it should, once each
        assert len(partial) < len(want)
        assert len(np.unique(partial)) == len(partial) and np.isin(partial, want).all()
        assert not list((small / "plog" / "ingest").glob(".*.tmp"))  # no partial file left behind
    q = _query(spark, spool, tmp_path / "plog", out, ckpt, None)
    await_query(q)
    got = read_records(out)["tuple_id"].to_numpy()
    assert_exactly_once(np.sort(got), want)
    # the batches published before the failure are logged on the small disk, gone with it; the rest
    # are logged once each, and every logged bucket is one the sink holds
    log = read_ingest_log(tmp_path / "plog")
    assert pc.sum(log["count"]).as_py() == len(want) - len(partial)
    assert len(set(log["first_tuple_id"].to_pylist())) == log.num_rows
    assert set(log["first_tuple_id"].to_pylist()) <= set(got.tolist())
