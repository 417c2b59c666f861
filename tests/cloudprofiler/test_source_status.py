"""cloudprofiler.source_status: a real query over a real embedded factory, its status read from the spool."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import zmq

import cloudprofiler
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.reader.source_watch import SourceStatus
from tests.helpers.embedded_source import embedded_source
from tests.helpers.polling import wait_for
from tests.helpers.typed_keys import assert_keys

# Known garbage, each dead-lettered by the factory under a known reason.
TRUNCATED = [b"junk", b"x"]  # a header frame shorter than a header
BAD_MAGIC = [b"\0" * 128, b"x"]  # a header-sized frame without the magic


def _send_garbage(endpoint: str, messages: list[list[bytes]]) -> None:
    ctx: zmq.SyncContext = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)  # every message leaves before close returns
    sock.connect(endpoint)
    try:
        for msg in messages:
            sock.send_multipart(msg)
    finally:
        sock.close()


def _last_data_batch(query: Any) -> dict[str, Any]:
    """The last progress of a micro-batch that read rows."""
    with_rows = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert with_rows, "no micro-batch read any row"
    return with_rows[-1]


def _caught_up(spool: Path, query: Any) -> bool:
    st = cloudprofiler.source_status(spool, query)
    return st["unread"]["rows"] == 0 and st["offsets"]["query_end"] == st["offsets"]["latest"]


def _load(endpoint: str, rate: int) -> dict[str, Any]:
    s = run_generator(endpoint, GeneratorSettings(rate=rate, duration=1.0, bucket=1000))
    assert s["eos_delivered"] and s["emitted"] + s["dropped"] == rate
    return s


@pytest.mark.long  # a query, two loads and their batches: 30-60 s on a busy 2-core machine
def test_status_counts_published_dead_letters_and_backlog_of_a_query(spark: Any, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    df = embedded_source(spark, spool)
    query = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "records"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        endpoint = cloudprofiler.wait_for_factory(str(spool), query, timeout=240).factory_endpoint
        st = cloudprofiler.source_status(spool, query)
        assert st["factory"]["state"] == "ready" and st["factory"]["why"] is None, st["factory"]
        assert st["factory"]["kind"] == "embedded" and st["factory"]["endpoint"] == endpoint
        assert sorted(st["factory"]["workers"]) == ["w0", "w1"]
        assert st["published"]["rows"] == 0 and st["dead_letters"] == {}

        first = _load(endpoint, 20_000)
        _send_garbage(endpoint, [TRUNCATED] * 3 + [BAD_MAGIC] * 2)
        wait_for(lambda: cloudprofiler.source_status(spool)["dead_letters_total"] == 5, 120, "5 dead letters")
        wait_for(lambda: _caught_up(spool, query), 240, "the query to read the first load")
        st = cloudprofiler.source_status(spool, query)
        assert st["published"]["rows"] == first["emitted"]
        assert st["dead_letters"] == {"bad_magic": 2, "truncated_header": 3}
        assert st["losses"]["dropped_by_generator"] == first["dropped"]
        assert st["losses"]["lost_in_transit"] == 0 and st["losses"]["rejected"] == 0
        assert st["losses"]["senders_finished"] == 1 and st["losses"]["senders_open"] == 0
        # The query has read everything; only its last batch is uncommitted (Spark commits it when it
        # plans the next batch with data): the backlog is exactly that batch.
        last = _last_data_batch(query)
        assert st["backlog"]["rows"] == last["numInputRows"] > 0
        assert st["unread"] == {"segments": 0, "rows": 0, "bytes": 0}
        committed_after_first = st["offsets"]["committed"]
        latest_after_first = st["offsets"]["latest"]

        second = _load(endpoint, 10_000)
        wait_for(lambda: _caught_up(spool, query), 240, "the query to read the second load")
        st = cloudprofiler.source_status(spool, query)
        assert st["published"]["rows"] == first["emitted"] + second["emitted"]
        assert st["losses"]["senders_finished"] == 2
        # Planning the second load's batches committed the whole first load.
        assert all(st["offsets"]["committed"][w] >= n for w, n in latest_after_first.items())
        assert st["offsets"]["committed"] != committed_after_first
        assert st["backlog"]["rows"] == _last_data_batch(query)["numInputRows"]
        assert st["backlog"]["bytes"] > 0 and st["backlog"]["segments"] > 0
    finally:
        query.stop()
    # the source's runner process stops the factory after stop() has returned
    stopped = lambda: cloudprofiler.source_status(spool, query)["factory"]["state"] == "stopped"  # noqa: E731
    wait_for(stopped, 60, "the factory to stop")
    st = cloudprofiler.source_status(spool, query)
    assert st["factory"]["endpoint"] is None and st["factory"]["why"]
    assert st["published"]["rows"] == first["emitted"] + second["emitted"]


def test_status_of_a_spool_written_by_a_factory_without_a_query(tmp_path: Path) -> None:
    """No query: the status of an external factory's spool, read while the factory runs and after."""
    from cp_source.factory.supervisor import start_factory

    f = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=1)
    try:
        s = _load(f.endpoint, 5_000)
        assert f.wait_drained(120, senders=[int(x["id"]) for x in s["senders"]])
        st = cloudprofiler.source_status(tmp_path / "spool")
        assert_keys(st, SourceStatus)  # the documented JSON form, section by section
        assert st["factory"]["state"] == "ready", st["factory"]
        assert st["published"]["rows"] == s["emitted"]
        # nothing committed: all of it is backlog, none of it taken by a batch
        assert st["backlog"] == st["unread"] and st["backlog"]["rows"] == s["emitted"]
        assert st["offsets"]["query_end"] is None and st["offsets"]["committed"] == {"w0": -1}
    finally:
        f.stop()
    deadline = time.monotonic() + 30
    while cloudprofiler.source_status(tmp_path / "spool")["factory"]["state"] != "stopped":
        assert time.monotonic() < deadline, "the stopped factory's worker still looks live"
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nowhere", "spool {p} does not exist: pass the `spool` option of the query's source"),
        (lambda p: p.joinpath("f").write_text("x") and p / "f", "spool {p} is not a directory"),
        (
            lambda p: p,
            "{p} is not a cloudprofiler spool (it has no spool.json and no worker directories)",
        ),
    ],
)
def test_a_path_that_is_not_a_spool_is_named_in_one_line(tmp_path: Path, make: Any, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ValueError) as e:
        cloudprofiler.source_status(path)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(message.format(p=path))
