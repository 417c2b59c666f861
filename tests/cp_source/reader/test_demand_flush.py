"""A batch being planned makes the workers publish what they hold (cp_source.spool.demand): a tuple
waits for the next micro-batch, not for a worker's flush. Real factory, real ZeroMQ, the reader's
driver side called as Spark's runner calls it."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import zmq
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cp_source.factory.supervisor import FactoryHandle
from cp_source.reader.options import ReaderOptions, source_schema
from cp_source.reader.stream_reader import CloudprofilerStreamReader
from tests.helpers.polling import wait_for
from tests.helpers.ready_sender import HandSender


def _pending_rows(spool: Path, worker: str) -> int:
    try:
        return int(orjson.loads((spool / worker / "stats.json").read_bytes()).get("pending_rows", 0))
    except FileNotFoundError:
        return 0


@pytest.mark.factory(workers=2, flush_ms=5000)
def test_latest_offset_publishes_what_the_workers_hold(factory: FactoryHandle, ctx: zmq.Context) -> None:
    """Each worker holds buckets it would publish only after 5 s (flush_ms); latestOffset offers them
    at once (within 2 s on a loaded machine, a few ms on a quiet one), every one of their ids."""
    spool = Path(factory.spool)
    options = {"spool": str(spool), "factory": "external"}
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    start = reader.initialOffset()
    sender = HandSender(ctx, factory.endpoint, sender_id=77)
    try:
        for seq in range(4):  # the front end spreads buckets over the workers
            sender.data(seq, int(time.time() * 1000), count=10)
        wait_for(
            lambda: _pending_rows(spool, "w0") + _pending_rows(spool, "w1") == 40,
            20,
            "the workers to hold 40 rows",
        )
        assert _pending_rows(spool, "w0") and _pending_rows(spool, "w1")  # both workers hold rows
        t0 = time.monotonic()
        end = start
        # as Spark asks again while nothing is new; each worker publishes one segment
        while min(end.get("w0", -1), end.get("w1", -1)) < 0 and time.monotonic() - t0 < 3:
            end = reader.latestOffset(start, ReadAllAvailable())
            time.sleep(0.01)
        took = time.monotonic() - t0
        parts = reader.partitions(start, end)
        executor = pickle.loads(pickle.dumps(reader))
        ids = [b.column("tuple_id").to_numpy() for p in parts for b in executor.read(p)]
        got = np.sort(np.concatenate(ids)) if ids else np.empty(0, np.int64)
        want = np.concatenate([np.arange(first, first + n) for first, n, _ in sender.ids])
        np.testing.assert_array_equal(got, want)
        assert took < 2.0, f"the rows were offered after {took:.3f} s"
    finally:
        sender.close()
        reader.stop()
