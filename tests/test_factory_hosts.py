"""Factory hosts: `cloudprofiler factory --serve` and one query over many factories (factories=...).

Real factory processes on loopback with their own spools, real generators, a real Spark query.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq

from cloudprofiler.cli_process import cli_argv, stop_processes
from cp_source.segment_server import (
    MAX_CONTROL_BYTES,
    ControlRequest,
    FetchError,
    ask_servers,
    fetch_segment,
    parse_request,
)
from cp_source.spool import Spool
from tests.conftest import wait_for


class FactoryHost:
    """A `cloudprofiler factory --serve` process on its own spool, ports picked by the factory."""

    def __init__(self, spool: Path, workers: int = 2) -> None:
        self.spool = spool
        self.proc = subprocess.Popen(
            cli_argv(
                "factory",
                "--endpoint",
                "tcp://127.0.0.1:0",
                "--spool",
                str(spool),
                "--workers",
                str(workers),
                "--flush-ms",
                "50",
                "--serve",
                "tcp://127.0.0.1:0",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert "factory listening on" in first, first
        self.endpoint = first.split("factory listening on ")[1].split(",")[0]
        second = self.proc.stdout.readline()
        assert "serving segments and commits on" in second, second
        self.server = second.split(" on ")[1].strip()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        stop_processes([self.proc], timeout=20)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[list[FactoryHost]]:
    started: list[FactoryHost] = []
    yield started
    for h in started:
        h.stop()


def _ask(endpoint: str, req: dict[str, Any]) -> dict[str, Any] | str:
    ctx = zmq.Context()
    try:
        return ask_servers({endpoint: req}, 20.0, ctx)[endpoint]
    finally:
        ctx.term()


# ---- the control ops: requests are bounded and validated --------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        b'{"op": "latest", "after": []}',
        b'{"op": "latest", "after": {"x0": 1}}',
        b'{"op": "latest", "after": {"w0": -2}}',
        b'{"op": "latest", "after": {"w0": true}}',
        b'{"op": "commit", "offsets": {"w0": 1}}',
        b'{"op": "commit", "spool": "../..", "offsets": {"w0": 1}}',
        b'{"op": "commit", "spool": "abcdef01", "offsets": {"w0": 4611686018427387904}}',
        b'{"op": "plan", "spool": "abcdef01"}',
        orjson.dumps({"op": "commit", "spool": "abcdef01", "offsets": {f"w{i}": 1 for i in range(65)}}),
        b'{"op": "latest", "pad": "' + b"x" * MAX_CONTROL_BYTES + b'"}',
        b'{"op": "segment", "worker": "w0", "number": 1, "pad": "' + b"x" * 600 + b'"}',
    ],
)
def test_bad_control_requests_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_request(raw)


def test_control_requests_parse() -> None:
    assert parse_request(b'{"op": "latest"}') == ControlRequest("latest", None, {})
    req = parse_request(b'{"op": "commit", "spool": "abcdef01", "offsets": {"w0": 3, "w1": -1}}')
    assert req == ControlRequest("commit", "abcdef01", {"w0": 3, "w1": -1})
    assert parse_request(b'{"op": "segment", "worker": "w1", "number": 2}') == ("segment", "w1", 2)
    full = {"op": "commit", "spool": "f" * 32, "offsets": {f"w{i}": (1 << 62) - 1 for i in range(64)}}
    assert len(orjson.dumps(full)) <= MAX_CONTROL_BYTES, "a commit of 64 workers fits one request"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("5556", "tcp://127.0.0.1:5556"),
        (":0", "tcp://127.0.0.1:0"),
        ("tcp://0.0.0.0:5556", "tcp://0.0.0.0:5556"),
    ],
)
def test_serve_values(text: str, want: str) -> None:
    from cp_source.factory_cli import parse_serve

    assert parse_serve(text) == want


@pytest.mark.parametrize("text", ["tcp://:5556", "udp://h:1", "tcp://h", "tcp://h:99999", "tcp://*:1", "x"])
def test_bad_serve_values_fail_with_one_line(text: str) -> None:
    from cp_source.factory_cli import parse_serve

    with pytest.raises(argparse.ArgumentTypeError, match="--serve"):
        parse_serve(text)


# ---- a factory host: latest, fetch, commit, stats --------------------------------------------
def test_a_factory_host_serves_latest_segments_and_commits(tmp_path: Path, hosts: list[FactoryHost]) -> None:
    from cp_source.generator import run_generator

    host = FactoryHost(tmp_path / "spool")
    hosts.append(host)
    summary = run_generator(host.endpoint, rate=20_000, duration=1.0, senders=1, bucket=500)
    wait_for(lambda: Spool(host.spool).drained({s["id"] for s in summary["senders"]}), 60, "the factory")
    sp = Spool(host.spool)
    sid = sp.spool_id()
    latest = _ask(host.server, {"op": "latest"})
    assert isinstance(latest, dict), latest
    assert latest["spool"] == sid
    assert {w: d["latest"] for w, d in latest["workers"].items()} == sp.latest()
    listed = {w: d["segments"] for w, d in latest["workers"].items()}
    for w, n in sp.latest().items():
        want = [[s.number, s.rows, s.tuple_id_min] for s in sp.segments(w, -1, n)]
        assert listed[w] == want
    assert sum(r for segs in listed.values() for _, r, _ in segs) == summary["emitted"]
    # after a position, only the segments after it
    w0 = latest["workers"]["w0"]
    if w0["latest"] >= 1:
        again = _ask(host.server, {"op": "latest", "after": {"w0": 0}})
        assert isinstance(again, dict)
        assert again["workers"]["w0"]["segments"] == w0["segments"][1:]
    # a fetched segment is the spool's file
    number, rows, _ = listed["w0"][0]
    seg_path = Path(sp.segments("w0", number - 1, number)[0].path)
    body = fetch_segment(host.server, "w0", number)
    assert body == seg_path.read_bytes()
    # commit: refused for another spool or beyond latest, idempotent, deletes what it covers
    other = _ask(host.server, {"op": "commit", "spool": "0" * 32, "offsets": {"w0": number}})
    assert isinstance(other, str) and "nothing changed" in other and sid in other
    beyond = _ask(host.server, {"op": "commit", "spool": sid, "offsets": {"w0": w0["latest"] + 1}})
    assert isinstance(beyond, str) and "beyond the latest" in beyond
    assert sp.committed()["w0"] == -1
    for _ in range(2):
        done = _ask(host.server, {"op": "commit", "spool": sid, "offsets": {"w0": number}})
        assert isinstance(done, dict) and done["committed"]["w0"] == number
    assert not seg_path.exists(), "the commit deleted the segment it covers"
    assert Spool(host.spool).committed()["w0"] == number
    stats = _ask(host.server, {"op": "stats"})
    assert isinstance(stats, dict)
    assert stats["segments_served"] == 1 and stats["rows_served"] == rows and stats["spool"] == sid
    assert stats["commits"] == 4 and stats["control_errors"] == 2
    # a segment already committed is no longer served
    with pytest.raises(FetchError, match=f"segment w0/{number}"):
        fetch_segment(host.server, "w0", number)
