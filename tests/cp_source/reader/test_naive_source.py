"""The naive baseline source: every generated tuple reaches the sink once, bad messages are skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zmq

from cp_sink.records import read_records
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.reader.naive_source import NaiveZmqDataSource
from tests.helpers.polling import wait_for


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_naive_source_delivers_every_tuple_once(spark: Any, tmp_path: Path) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    spark.dataSource.register(NaiveZmqDataSource)
    state = tmp_path / "naive.json"
    df = spark.readStream.format("cp_naive_zmq").option("stateFile", str(state)).load()
    sink = tmp_path / "records"
    query = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(sink))
        .option("handler", "id")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        wait_for(lambda: state.exists() or not query.isActive, 60, "the naive reader to bind")
        endpoint = json.loads(state.read_text())["endpoint"]
        # garbage first: one frame, then a bad header; neither may stop the reader
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.DEALER)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(endpoint)
        push.send(b"not a bucket")
        push.send_multipart([b"x" * 128, b"{}\n"])
        push.close()
        # the reader answers only when Spark asks it for offsets: allow for the query still starting
        summary = run_generator(
            endpoint, GeneratorSettings(rate=4000, duration=1.0, bucket=250, ready_timeout=120)
        )
        assert summary["dropped"] == 0 and summary["emitted"] == 4000
        s = summary["senders"][0]
        want = set(range(s["first_tuple_id"], s["next_tuple_id"]))

        def got() -> int:
            return read_records(sink).num_rows

        wait_for(lambda: got() >= 4000 or not query.isActive, 90, "4000 records")
        assert query.isActive, query.exception()
        rec = read_records(sink)
        ids = rec["tuple_id"].to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == want
        assert {"cp_tsc_gen", "cp_tsc_source", "cp_tsc_sink"} <= set(rec.column_names)
    finally:
        query.stop()


def test_naive_source_rejects_unknown_option(spark: Any) -> None:
    import pytest

    from cp_source.reader.naive_source import NaiveZmqReader

    with pytest.raises(ValueError, match="unknown option"):
        NaiveZmqReader({"endpont": "tcp://127.0.0.1:1"})
    with pytest.raises(ValueError, match="maxRowsPerRead"):
        NaiveZmqReader({"maxRowsPerRead": "0"})


def test_naive_source_options_are_read_by_the_toolkit() -> None:
    import pytest

    from cp_source.reader.naive_source import NaiveZmqReader

    with pytest.raises(ValueError) as e:
        NaiveZmqReader({"partitions": "lots"})
    assert str(e.value) == "option partitions='lots': expected an integer"
    with pytest.raises(ValueError, match=r"^unknown option for the cp_naive_zmq source: 'endpont', did you"):
        NaiveZmqReader({"endpont": "tcp://127.0.0.1:1"})
    r = NaiveZmqReader({"MaxRowsPerRead": "5", "PARTITIONS": "3"})
    assert (r.max_rows, r.n_partitions) == (5, 3)
