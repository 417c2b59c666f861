"""The "cloudprofiler" stream reader: options, the segment server, offsets, admission control, reads."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pytest
import zmq

from cp_source.segment_server import (
    MAX_REQUEST_BYTES,
    FetchError,
    SegmentRef,
    SegmentServer,
    fetch_segment,
    server_stats,
    validate_request,
)
from cp_source.stream_reader import ReaderOptions, source_schema

# ---- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"workers": "two"}, "workers"),
        ({"workers": "0"}, "workers"),
        ({"fetch": "nfs"}, "fetch"),
        ({"factory": "remote"}, "factory"),
        ({"maxRecordsPerTrigger": "-5"}, "maxRecordsPerTrigger"),
        ({"endpoint": "http://x"}, "endpoint"),
        ({"workload": "kafka"}, "workload"),
        ({"workload": "file:/tmp/x.ndjson"}, "schema"),
        ({"schema": "a INT"}, "schema"),
        ({"fetchTimeout": "soon"}, "fetchTimeout"),
        ({"maxRecordPerTrigger": "10"}, "maxrecordpertrigger"),
    ],
)
def test_bad_option_is_named(options: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ReaderOptions.parse(options)


def test_options_are_case_insensitive_and_defaulted() -> None:
    o = ReaderOptions.parse({"MAXRECORDSPERTRIGGER": "1000", "Workers": "3", "fetch": "NETWORK"})
    assert (o.max_records, o.workers, o.fetch, o.factory) == (1000, 3, "network", "embedded")
    assert o.server_bind == "127.0.0.1"
    assert o.spool  # a per-endpoint default under the temp dir


def test_schema_has_segment_columns_and_source_stamps() -> None:
    names = source_schema(ReaderOptions.parse({})).fieldNames()
    for col in ("ad_id", "event_type", "event_time", "tuple_id", "sender_id", "cp_tsc_gen", "cp_node_gen",
                "cp_tsc_factory", "cp_node_factory"):
        assert col in names
    assert names[-2:] == ["cp_tsc_source", "cp_node_source"]
    ddl = ReaderOptions.parse({"workload": "file:/data/x.ndjson", "schema": "name STRING, price DOUBLE"})
    file_names = source_schema(ddl).fieldNames()
    assert file_names[:2] == ["name", "price"] and file_names[-2:] == ["cp_tsc_source", "cp_node_source"]


# ---- segment server ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"op": "rm"}',
        b'{"op": "segment", "worker": "../../etc", "number": 1}',
        b'{"op": "segment", "worker": "w0/../w1", "number": 1}',
        b'{"op": "segment", "worker": "w0", "number": -1}',
        b'{"op": "segment", "worker": "w0", "number": "1"}',
        b'{"op": "segment", "worker": "w0", "number": true}',
        b'{"op": "segment", "worker": "w0", "number": 1e300}',
        b'{"op": "segment", "worker": "w0", "number": 1, "pad": "' + b"x" * MAX_REQUEST_BYTES + b'"}',
    ],
)
def test_bad_requests_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValueError):
        validate_request(raw)


def _write_ipc(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


@pytest.fixture
def served(tmp_path: Path):
    """A segment server over two Arrow IPC files in tmp_path, and a file outside it."""
    root = tmp_path / "spool"
    root.mkdir()
    tables = {("w0", 0): pa.table({"tuple_id": list(range(5))}), ("w1", 3): pa.table({"tuple_id": [7, 8]})}
    refs: dict[tuple[str, int], SegmentRef] = {}
    for (w, n), t in tables.items():
        p = root / f"{w}-{n}.arrow"
        _write_ipc(p, t)
        refs[(w, n)] = SegmentRef(str(p), t.num_rows, p.stat().st_size)
    outside = tmp_path / "secret.arrow"
    _write_ipc(outside, pa.table({"x": [1]}))
    refs[("w9", 0)] = SegmentRef(str(outside), 1, outside.stat().st_size)
    server = SegmentServer(lambda w, n: refs.get((w, n)), root, stats_path=root / "_stats.json")
    yield server, tables, root
    server.stop()


def test_segment_server_serves_exact_bytes_and_counts(served) -> None:
    server, tables, root = served
    assert server.endpoint.startswith("tcp://127.0.0.1:")
    for (w, n), t in tables.items():
        body = fetch_segment(server.endpoint, w, n, timeout=10)
        assert pa.ipc.open_file(pa.py_buffer(body)).read_all().equals(t)
    with pytest.raises(FetchError, match="not in the spool"):
        fetch_segment(server.endpoint, "w0", 1, timeout=10)
    with pytest.raises(FetchError, match="outside the spool"):
        fetch_segment(server.endpoint, "w9", 0, timeout=10)
    stats = server_stats(server.endpoint)
    assert stats["segments_served"] == 2 and stats["rows_served"] == 7
    assert stats["missing"] == 1 and stats["rejected"] == 1
    assert orjson.loads((root / "_stats.json").read_bytes())["segments_served"] == 2


def test_segment_server_survives_garbage_frames(served) -> None:
    server, tables, _ = served
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(server.endpoint)
        dealer.send_multipart([b"no delimiter", b"x"])  # not REQ framing: dropped
        dealer.send_multipart([b"", b"\xff" * 100])  # REQ framing, not JSON: answered with an error
        assert dealer.poll(10_000)
        head = orjson.loads(dealer.recv_multipart()[-1])
        assert head["ok"] is False
        dealer.close(0)
    finally:
        ctx.term()
    body = fetch_segment(server.endpoint, "w1", 3, timeout=10)
    assert pa.ipc.open_file(pa.py_buffer(body)).read_all().equals(tables[("w1", 3)])


def test_fetch_times_out_when_nobody_answers() -> None:
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(FetchError, match="no answer"):
            fetch_segment(f"tcp://127.0.0.1:{port}", "w0", 0, timeout=0.5)
    finally:
        silent.close(0)
        ctx.term()
