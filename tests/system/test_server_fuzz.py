"""Hypothesis against each live server over real sockets on 127.0.0.1.

Each server runs in its own process (tests/helpers/server_host.py). Examples are random messages: frame
counts, frame sizes, random bytes, JSON of random shapes, requests with fields of the wrong types,
and raw TCP bytes that stop in the middle of a ZeroMQ handshake or frame. After each example the
server must still answer a well-formed request; after the run its resident memory must not have
grown past ``RSS_BOUND_MB`` (the servers' own bounds are a few MiB per peer; see docs/security.md).
"""

from __future__ import annotations

import itertools
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cp_sink.channels.config_client import lookup
from cp_source.hosts.segment_client import fetch_segment, server_stats
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import SenderIdInUse, open_link
from cp_sync.nodes.coordinator import list_agents
from tests.helpers import SCRIPTS
from tests.helpers.live_server import LiveServer

RSS_BOUND_MB = 40
EXAMPLES = 60
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

# -- what a hostile client sends ------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
FIELDS = ("op", "channel", "handler", "params", "domain", "hz", "host", "port", "phase", "rounds", "gap_us")
FIELDS += ("timeout_ms", "task", "worker", "number", "error", "lost")
OPS = ("get", "set", "remove", "default", "table", "register", "bye", "agents", "run", "result", "segment")
OPS += ("stats", "probe", "")


@st.composite
def json_requests(draw: st.DrawFn) -> bytes:
    """An object with a known op and known field names, each field of a random type."""
    obj: dict[str, Any] = {"op": draw(st.sampled_from(OPS) | json_values)}
    for k in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        obj[k] = draw(json_values)
    return orjson.dumps(obj)


frames_st = st.one_of(
    st.binary(max_size=2048),
    json_requests(),
    json_values.map(orjson.dumps),
    st.integers(0, 70_000).map(lambda n: b"{" * n),  # deep nesting, or past the size bounds
)


@st.composite
def messages(draw: st.DrawFn, lead: list[bytes]) -> list[bytes]:
    """Frames of one message; usually the envelope ``lead`` the server expects, then the body."""
    body = draw(st.lists(frames_st, min_size=1, max_size=6))
    if draw(st.integers(0, 9)) == 0:
        body = body * draw(st.integers(10, 400))  # many frames in one message
    return (lead if draw(st.booleans()) or not lead else []) + body


def _greeting() -> bytes:
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


def _ready(socktype: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socktype)) + socktype
    return b"\x04" + bytes([len(body)]) + body


@st.composite
def raw_streams(draw: st.DrawFn) -> bytes:
    """Raw TCP bytes: garbage, or a handshake cut short, or a frame cut short, then the connection closes."""
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.binary(max_size=512))
    hello = _greeting() + _ready(b"DEALER")
    if kind == 1:
        return hello[: draw(st.integers(0, len(hello)))]
    size = draw(st.integers(1, 100_000))
    frame = b"\x03" + struct.pack(">Q", size) + draw(st.binary(max_size=256))  # MORE|LONG, short body
    return hello + frame


# -- the servers ------------------------------------------------------------------------------------


class Sender:
    """Sends each example from a child process (tests/helpers/fuzz_sender.py).

    libzmq can abort a client process whose peer cut it off in the middle of a message (an
    assertion in its I/O thread); in the test process that would end the whole session. A dead
    sender is counted and restarted: it is the client, not the server under test.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.proc: subprocess.Popen[bytes] | None = None
        self.crashes = 0

    def run(self, actions: list[tuple[bytes, list[bytes]]]) -> None:
        if self.proc is None or self.proc.poll() is not None:
            script = SCRIPTS / "fuzz_sender.py"
            self.proc = subprocess.Popen(
                [sys.executable, str(script), self.endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        out = [struct.pack("<I", len(actions))]
        for kind, frames in actions:
            out += [kind, struct.pack("<I", len(frames))]
            out += [struct.pack("<I", len(f)) + f for f in frames]
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(b"".join(out))
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = b""
        if line != b"done\n":
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.crashes += 1

    def close(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _fuzz(
    server: LiveServer,
    sender: Sender,
    lead: list[bytes],
    healthy: Callable[[], None],
    data: st.DataObject,
    rounds: int,
) -> None:
    actions: list[tuple[bytes, list[bytes]]] = []
    for _ in range(rounds):
        if data.draw(st.integers(0, 4)) == 0:
            actions.append((b"r", [data.draw(raw_streams())]))
        else:
            actions.append((b"z", data.draw(messages(lead))))
    sender.run(actions)
    assert server.alive()
    healthy()


@pytest.fixture(scope="module")
def segment_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("segments")
    (root / "w0").mkdir()
    (root / "w0" / "seg-000000000000.arrow").write_bytes(b"segment bytes" * 1000)
    return root


@pytest.fixture(scope="module")
def servers(segment_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveServer]]:
    spool = tmp_path_factory.mktemp("fuzz") / "spool"
    live = {
        "config": LiveServer("config"),
        "coordinator": LiveServer("coordinator"),
        "segment": LiveServer("segment", str(segment_root)),
        "factory": LiveServer("factory", str(spool)),
    }
    try:
        yield live
    finally:
        for s in live.values():
            s.__exit__()


def _warm_rss(server: LiveServer, healthy: Callable[[], None]) -> float:
    for _ in range(20):
        healthy()
    return server.rss_mb()


def _check_rss(server: LiveServer, before: float) -> None:
    grown = server.rss_mb() - before
    assert grown < RSS_BOUND_MB, f"grew by {grown:.0f} MiB under fuzzing (bound {RSS_BOUND_MB} MiB)"


def _fuzz_server(srv: LiveServer, lead: list[bytes], healthy: Callable[[], None]) -> None:
    """Hypothesis against ``srv`` from one sender process; then its RSS within the bound."""
    before = _warm_rss(srv, healthy)
    sender = Sender(srv.endpoint)

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        _fuzz(srv, sender, lead, healthy, data, 5)

    try:
        run()
    finally:
        sender.close()
    _check_rss(srv, before)


def test_config_server_survives_fuzz(servers: dict[str, LiveServer]) -> None:
    srv = servers["config"]

    def healthy() -> None:
        assert lookup(srv.endpoint, "probe-channel", timeout=10) == ("null", {})

    _fuzz_server(srv, [b""], healthy)


def test_coordinator_survives_fuzz(servers: dict[str, LiveServer]) -> None:
    srv = servers["coordinator"]

    def healthy() -> None:
        agents = list_agents(srv.endpoint, timeout_s=10)
        assert isinstance(agents, list)

    _fuzz_server(srv, [], healthy)


def test_segment_server_survives_fuzz(servers: dict[str, LiveServer], segment_root: Path) -> None:
    srv = servers["segment"]
    body = (segment_root / "w0" / "seg-000000000000.arrow").read_bytes()

    def healthy() -> None:
        assert fetch_segment(srv.endpoint, "w0", 0, timeout=10) == body

    _fuzz_server(srv, [b""], healthy)
    assert server_stats(srv.endpoint)["failures"] == 0


@st.composite
def bucket_messages(draw: st.DrawFn) -> list[bytes]:
    """A header of the factory's format with random fields (sometimes valid), then random frames."""
    pk = bk.HeaderPacker(draw(st.integers(0, bk.MAX_SENDER)), draw(st.text("abc@0123", max_size=64)))
    kind = draw(
        st.sampled_from([bk.KIND_DATA, bk.KIND_EOS, bk.KIND_HELLO, bk.KIND_HEARTBEAT, bk.KIND_ACK, 99])
    )
    seq = draw(st.integers(0, 2**63 - 1))
    first = draw(st.integers(0, 2**63 - 1))
    count = draw(st.integers(0, 2**32 - 1))
    rest = draw(st.lists(frames_st, max_size=4))
    plen = len(rest[0]) if rest and draw(st.booleans()) else draw(st.integers(0, 2**32 - 1))
    head = bytes(pk.pack(kind % 256, seq, first, count, plen, 1, 2))
    if draw(st.booleans()):
        head = head[: draw(st.integers(0, len(head)))]
    return [head, *rest]


def test_factory_front_end_survives_fuzz(servers: dict[str, LiveServer]) -> None:
    srv = servers["factory"]
    ctx = zmq.Context()

    fresh_ids = itertools.count(0x5A5A00)

    def healthy() -> None:
        """A hello under a new sender id is answered: acknowledged, or refused when the fuzz sent
        tuples under that id (a sender id is said hello to once per spool)."""
        try:
            sock, _ = open_link(ctx, srv.endpoint, bk.HeaderPacker(next(fresh_ids), "fuzz-check"), 16, 10.0)
        except SenderIdInUse:
            return
        sock.close(0)

    before = _warm_rss(srv, healthy)

    sender = Sender(srv.endpoint)

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        actions: list[tuple[bytes, list[bytes]]] = []
        for _ in range(5):
            if data.draw(st.integers(0, 4)) == 0:
                actions.append((b"r", [data.draw(raw_streams())]))
            else:
                actions.append((b"z", data.draw(st.one_of(bucket_messages(), messages([])))))
        sender.run(actions)
        assert srv.alive()
        healthy()

    try:
        run()
        _check_rss(srv, before)
    finally:
        sender.close()
        ctx.term()


def test_probe_responder_survives_random_datagrams() -> None:
    from cp_sync.probe.native import Responder, initiate

    resp = Responder("127.0.0.1", 0)
    resp.start()
    try:
        host, port = resp.address

        @FUZZ
        @given(st.lists(st.binary(max_size=1500), min_size=1, max_size=20))
        def run(datagrams: list[bytes]) -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for d in datagrams:
                    s.sendto(d, (host, port))
            assert initiate(host, port, 3, timeout_ms=2000).seq.shape[0] == 3

        run()
        assert resp.error is None
    finally:
        resp.close()
