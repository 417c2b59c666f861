"""The handler configuration server over real ZeroMQ on 127.0.0.1."""

from __future__ import annotations

import os

import orjson
import pytest
import zmq

from cloudprofiler.cli import main as cli_main
from cp_sink.channels import open_channel, read_channel
from cp_sink.channels.config_client import ENV_SERVER, MAX_MESSAGE, lookup, request
from cp_sink.channels.config_server import ConfigServer, HandlerTable


@pytest.fixture
def server():
    srv = ConfigServer(HandlerTable(default="null")).start()
    yield srv
    srv.stop()


def test_change_applies_to_next_channel_opened(server, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_SERVER, server.endpoint)
    first = open_channel("parser", "buffered", path=tmp_path / "a.cpch")
    assert first.handler == "null"  # unknown name: the declared default wins over the code's choice
    request(
        server.endpoint, {"op": "set", "channel": "parser", "handler": "xoy", "params": {"x": 2, "y": 1024}}
    )
    second = open_channel("parser", "buffered", path=tmp_path / "b.cpch")
    other = open_channel("emitter", "buffered", path=tmp_path / "c.cpch")
    for ch in (first, second, other):
        for i in range(3000):
            ch.log(i)
        ch.close()
    assert first.handler == "null"  # an open channel keeps its handler
    assert (second.handler, second.params["x"], second.params["y"]) == ("xoy", 2, 1024)
    assert other.handler == "null"
    assert read_channel(tmp_path / "b.cpch").records["tuple_id"].to_pylist() == [0, 1, 1024, 1025, 2048, 2049]
    assert read_channel(tmp_path / "a.cpch").records.num_rows == 0


def test_table_file_is_read_again_when_it_changes(tmp_path) -> None:
    table_file = tmp_path / "handlers.json"
    table_file.write_bytes(orjson.dumps({"default": {"handler": "pc", "periodMs": 50}, "channels": {}}))
    srv = ConfigServer(HandlerTable(path=table_file)).start()
    try:
        assert lookup(srv.endpoint, "x") == ("pc", {"periodMs": 50})
        table_file.write_bytes(orjson.dumps({"channels": {"x": {"handler": "downsample", "n": 9}}}))
        os.utime(table_file, ns=(1, 10**18))  # a distinct mtime even on a coarse clock
        assert lookup(srv.endpoint, "x") == ("downsample", {"n": 9, "block": 65536})
        assert lookup(srv.endpoint, "y") == ("pc", {"periodMs": 50})
    finally:
        srv.stop()


def test_bad_requests_are_refused_and_the_server_keeps_serving(server) -> None:
    with pytest.raises(ValueError, match="unknown channel handler"):
        request(server.endpoint, {"op": "set", "channel": "a", "handler": "bogus", "params": {}})
    with pytest.raises(ValueError, match="unknown op"):
        request(server.endpoint, {"op": "drop tables"})
    with pytest.raises(ValueError, match="channel name"):
        request(server.endpoint, {"op": "get", "channel": "x" * 500})
    # Not JSON at all.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 2000)
    s.connect(server.endpoint)
    s.send(b"\x80not json")
    assert orjson.loads(s.recv())["ok"] is False
    s.close(0)
    # Larger than the bound: ZeroMQ drops the peer, no answer comes.
    with pytest.raises(TimeoutError):
        request(server.endpoint, {"op": "get", "channel": "a", "pad": "x" * MAX_MESSAGE}, timeout=1.0)
    assert lookup(server.endpoint, "a") == ("null", {})


def test_cli_sets_and_gets(server, capsys) -> None:
    assert cli_main(["config-server", "--connect", server.endpoint, "--set", "parser=downsample:n=5"]) == 0
    assert cli_main(["config-server", "--connect", server.endpoint, "--get", "parser", "--get", "other"]) == 0
    out = capsys.readouterr().out
    assert "parser: downsample" in out and '"n":5' in out and "other: null {} (default)" in out
    assert cli_main(["config-server", "--connect", server.endpoint, "--set", "parser"]) == 2
    assert "expected CHANNEL=HANDLER" in capsys.readouterr().err


def test_unreachable_server_falls_back_to_the_code_handler(tmp_path, monkeypatch) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.REP)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    s.close(0)  # a port nobody answers on
    monkeypatch.setenv(ENV_SERVER, f"tcp://127.0.0.1:{port}")
    monkeypatch.setenv("CP_CONFIG_TIMEOUT", "0.3")
    with pytest.warns(UserWarning, match="unavailable"):
        ch = open_channel("lonely", "firstlast", path=tmp_path / "l.cpch")
    ch.close()
    assert ch.handler == "firstlast"


def test_serve_command_in_its_own_process(tmp_path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "cloudprofiler.cli", "config-server", "--bind", "tcp://127.0.0.1:*"]
    proc = subprocess.Popen([*cmd, "--default", "pc"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        endpoint = line.split(" on ")[1].split(";")[0]
        assert endpoint.startswith("tcp://127.0.0.1:")
        assert lookup(endpoint, "anything") == ("pc", {"periodMs": 1000})
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
