"""Each server survives the messages that used to crash or bloat it, over real sockets on 127.0.0.1."""

from __future__ import annotations

import orjson
import pytest
import zmq

from cp_sink.channels.config_client import lookup, request
from cp_sink.channels.config_server import ConfigServer, HandlerTable


def _req_socket(endpoint: str) -> zmq.Socket[bytes]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.connect(endpoint)
    return s


@pytest.fixture
def config_server():
    srv = ConfigServer(HandlerTable(default="null")).start()
    yield srv
    srv.stop()


def test_config_server_refuses_a_parameter_of_the_wrong_type(config_server) -> None:
    bad = {"op": "set", "channel": "c", "handler": "buffered", "params": {"block": [1]}}
    with pytest.raises(ValueError, match="parameter 'block' must be an integer or a short string"):
        request(config_server.endpoint, bad)
    for params in ({"block": 1.5}, {"block": True}, {"block": 1 << 63 - 1}, {"x" * 100: 1}, [1], "s"):
        with pytest.raises(ValueError, match="config server refused"):
            request(config_server.endpoint, {**bad, "params": params})
    with pytest.raises(ValueError, match="config server refused: a setting needs a handler name"):
        request(config_server.endpoint, {"op": "default", "handler": ["null"], "params": {}})
    s = _req_socket(config_server.endpoint)  # an integer orjson itself cannot hold
    try:
        s.send(b'{"op":"set","channel":"c","handler":"buffered","params":{"block":' + b"9" * 40 + b"}}")
        assert orjson.loads(s.recv())["ok"] is False
    finally:
        s.close(0)
    assert lookup(config_server.endpoint, "c") == ("null", {})
    request(config_server.endpoint, {**bad, "params": {"block": "64"}})
    assert lookup(config_server.endpoint, "c") == ("buffered", {"block": 64})


def test_config_server_answers_a_two_frame_request_with_an_error(config_server) -> None:
    s = _req_socket(config_server.endpoint)
    try:
        s.send_multipart([orjson.dumps({"op": "table"}), b"second"])
        reply = orjson.loads(s.recv())
        assert reply == {"ok": False, "error": "a request is one frame, got 2"}
    finally:
        s.close(0)
    assert lookup(config_server.endpoint, "anything") == ("null", {})
    assert config_server.refused == 1 and config_server.failures == 0
