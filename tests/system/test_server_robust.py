"""Each server survives the messages that used to crash or bloat it, over real sockets on 127.0.0.1."""

from __future__ import annotations

import os

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


# -- the sync coordinator -----------------------------------------------------------------------


def _dealer(endpoint: str) -> zmq.Socket[bytes]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _register_msg(domain: object, host: str = "127.0.0.1", port: int = 40000) -> list[bytes]:
    return [orjson.dumps({"op": "register", "domain": domain, "hz": 1e9, "host": host, "port": port})]


def _next_reply(s: zmq.Socket[bytes]) -> dict:
    assert s.poll(10_000), "no reply from the coordinator"
    return orjson.loads(s.recv_multipart()[0])


def test_coordinator_survives_unhashable_fields_and_many_frames() -> None:
    from cp_sync.nodes.coordinator import Coordinator

    with Coordinator("127.0.0.1:0") as coord:
        s = _dealer(coord.address)
        try:
            for m in (
                b'{"op":"bye","domain":[1]}',
                b'{"op":"bye","domain":{"a":1}}',
                b'{"op":"register","domain":[1],"hz":1e9,"host":"127.0.0.1","port":40000}',
                b'{"op":"register","domain":"t","hz":true,"host":"127.0.0.1","port":40000}',
                b'{"op":"result","task":[1],"error":{"x":[1]}}',
                b'{"op":"run","phase":["p"],"rounds":true,"gap_us":0,"timeout_ms":5}',
            ):
                s.send(m)
            s.send_multipart([b'{"op":"agents"}'] + [b"x" * 100] * 1000)  # frames past the cap: dropped
            assert _next_reply(s) == {
                "op": "error",
                "error": "a sync run needs at least 2 registered agents, 0 registered",
            }
            s.send_multipart(_register_msg("d1"))
            assert [a["domain"] for a in _wait_agents(coord.address, 1)] == ["d1"]
        finally:
            s.close(0)
        assert coord.failures == 0 and coord.refused == 4  # two registers, the run, the long message
        assert coord._thread is not None and coord._thread.is_alive()


def test_coordinator_refuses_a_takeover_of_a_live_domain() -> None:
    from cp_sync.nodes.coordinator import Coordinator

    with Coordinator("127.0.0.1:0") as coord:
        owner, thief = _dealer(coord.address), _dealer(coord.address)
        try:
            owner.send_multipart(_register_msg("node-a", port=40001))
            assert [a["port"] for a in _wait_agents(coord.address, 1)] == [40001]
            thief.send_multipart(_register_msg("node-a", port=40002))
            assert _next_reply(thief) == {
                "op": "error",
                "error": "domain 'node-a' is registered by another live agent",
            }
            owner.send_multipart(_register_msg("node-a", port=40003))  # the owner's heartbeat is fine
            owner.send_multipart([b'{"op":"bye","domain":"node-a"}'])
            thief.send_multipart([b'{"op":"bye","domain":"node-a"}'])  # not the thief's to remove
            assert _wait_agents(coord.address, 0, exact=True) == []
            thief.send_multipart(_register_msg("node-a", port=40002))  # gone: free to take
            assert [a["port"] for a in _wait_agents(coord.address, 1)] == [40002]
        finally:
            owner.close(0)
            thief.close(0)


def _wait_agents(address: str, n: int, exact: bool = False) -> list[dict]:
    """The coordinator's agents once there are ``n`` (at least, or exactly); messages sent on
    other sockets are not ordered with this one's, so the test waits for them."""
    import time

    from cp_sync.nodes.coordinator import list_agents

    deadline = time.monotonic() + 10
    while True:
        agents = list_agents(address)
        if (len(agents) == n if exact else len(agents) >= n) or time.monotonic() > deadline:
            return agents
        time.sleep(0.05)


def test_coordinator_bounds_its_agents_and_checks_probe_targets() -> None:
    from cp_sync.nodes.coordinator import MAX_AGENTS, Coordinator

    with Coordinator("127.0.0.1:0") as coord:
        s = _dealer(coord.address)
        try:
            for host, port in (("0.0.0.0", 40000), ("255.255.255.255", 40000), ("224.0.0.1", 40000)):
                s.send_multipart(_register_msg("bad", host, port))
            s.send_multipart(_register_msg("bad", "127.0.0.1", 53))  # a system service's port
            for i in range(MAX_AGENTS):
                s.send_multipart(_register_msg(f"d{i:03d}"))
            s.send_multipart(_register_msg("one-too-many"))
            # each accepted registration is acknowledged, in order; then the refusal
            acks = [_next_reply(s) for _ in range(MAX_AGENTS)]
            assert acks == [{"op": "registered", "domain": f"d{i:03d}"} for i in range(MAX_AGENTS)]
            assert _next_reply(s) == {
                "op": "error",
                "error": f"the coordinator has {MAX_AGENTS} live agents, its limit",
            }
            agents = _wait_agents(coord.address, MAX_AGENTS)
            assert sorted(a["domain"] for a in agents) == [f"d{i:03d}" for i in range(MAX_AGENTS)]
        finally:
            s.close(0)


# -- the segment server -------------------------------------------------------------------------

SEGMENT_BYTES = 3_200_000


def _flood_segment_requests(endpoint: str, n: int) -> zmq.Socket[bytes]:
    """A client that asks for the same segment ``n`` times and never reads a reply."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 1)  # the client's own queue stays tiny: what piles up is the server's
    s.connect(endpoint)
    req = orjson.dumps({"op": "segment", "worker": "w0", "number": 0})
    for _ in range(n):
        s.send_multipart([b"", req])
    return s


def test_segment_server_bounds_replies_to_a_peer_that_never_reads(tmp_path) -> None:
    import time

    from cp_source.hosts.segment_client import fetch_segment, server_stats
    from tests.helpers.live_server import LiveServer

    (tmp_path / "w0").mkdir()
    body = os.urandom(SEGMENT_BYTES)
    (tmp_path / "w0" / "seg-000000000000.arrow").write_bytes(body)
    with LiveServer("segment", str(tmp_path)) as srv:
        assert fetch_segment(srv.endpoint, "w0", 0) == body  # warm: the first read's buffers are counted
        before = srv.rss_mb()
        s = _flood_segment_requests(srv.endpoint, 600)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                stats = server_stats(srv.endpoint)
                if stats["segments_served"] + stats["replies_dropped"] >= 601:
                    break
                time.sleep(0.2)
            grown = srv.rss_mb() - before
            # 600 replies of 3.2 MB would be 1.9 GB; two per peer are kept, the rest dropped and counted
            assert grown < 40, f"the server grew by {grown:.0f} MiB"
            assert stats["segments_served"] + stats["replies_dropped"] == 601  # one each, no other fate
            assert stats["replies_dropped"] >= 590 and stats["failures"] == 0
            assert fetch_segment(srv.endpoint, "w0", 0) == body
        finally:
            s.close(0)
