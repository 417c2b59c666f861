"""The probe responder is no reflector: it answers only listed sources, and only keyed probes when keyed.

Real UDP sockets on loopback and the real C extension. Linux routes all of
127/8 on ``lo``, so a sender bound to 127.0.0.2 is a second, unlisted host.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from cp_common import curve_keys
from cp_sync.nodes import control
from cp_sync.nodes.coordinator import Coordinator, list_agents, run_phase
from cp_sync.probe import native as probe
from cp_sync.probe import python_twin as probe_python
from native_tsc import _probe, probe_loops
from native_tsc.domain import make_virtual
from tests.helpers import SCRIPTS
from tests.helpers.polling import wait_for

PKT = struct.Struct("<IBBHIIQq")
TAG = struct.Struct("<Q")
MAGIC = 0x42525043
KEY = bytes(range(16))
OTHER_KEY = bytes(range(1, 17))
TWINS = [pytest.param(probe, id="c"), pytest.param(probe_python, id="python")]
STRANGER = "127.0.0.2"  # an unlisted source on this host


def _has_second_loopback() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((STRANGER, 0))
        except OSError:
            return False
    return True


pytestmark = pytest.mark.skipif(not _has_second_loopback(), reason="127.0.0.2 is not routed on lo here")


def _keyed(fields: tuple[int, ...], key: bytes) -> bytes:
    body = PKT.pack(*fields)
    return body + TAG.pack(_probe.siphash24(key, body))


# -- SipHash-2-4 -----------------------------------------------------------


def test_siphash_published_vectors() -> None:
    # The SipHash paper's Appendix A: key 00..0f, message 00..0e; and the reference code's empty message.
    for mac in (_probe.siphash24, probe_loops.siphash24, probe_python.siphash24):
        assert mac(KEY, bytes(range(15))) == 0xA129CA6149BE45E5
        assert mac(KEY, b"") == 0x726FDB47DD0E0E31
    with pytest.raises(ValueError, match="16 bytes"):
        _probe.siphash24(b"short", b"x")
    with pytest.raises(ValueError, match="16 bytes"):
        probe_python.siphash24(b"short", b"x")


@settings(max_examples=300, deadline=None)
@given(key=st.binary(min_size=16, max_size=16), data=st.binary(max_size=80))
def test_siphash_c_and_python_agree(key: bytes, data: bytes) -> None:
    assert _probe.siphash24(key, data) == probe_python.siphash24(key, data)


# -- the allow-list --------------------------------------------------------


@pytest.mark.parametrize("loops", TWINS)
def test_an_unlisted_source_gets_no_answer(loops: ModuleType) -> None:
    r = loops.Responder(allow=["127.0.0.1"]).start()
    try:
        host, port = r.address
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((STRANGER, 0))
            s.settimeout(0.5)
            s.sendto(PKT.pack(MAGIC, 1, 1, 0, 7, 0, 99, 0), (host, port))
            with pytest.raises(TimeoutError):
                s.recv(64)
        away = loops.initiate(host, port, 5, timeout_ms=100, gap_us=0, bind=STRANGER)
        home = loops.initiate(host, port, 20, timeout_ms=2000, gap_us=0, bind="127.0.0.1")
    finally:
        r.close()
    assert away.lost == 5 and len(away.seq) == 0
    assert home.seq.tolist() == list(range(20)) and home.lost == 0
    assert (r.served, r.refused, r.ignored) == (20, 6, 0)


@pytest.mark.parametrize("loops", TWINS)
def test_an_empty_list_answers_nobody_and_none_answers_anyone(loops: ModuleType) -> None:
    with loops.Responder(allow=[]) as r:
        res = loops.initiate(*r.address, 4, timeout_ms=100, gap_us=0)
    assert res.lost == 4 and (r.served, r.refused) == (0, 4)
    with loops.Responder() as r:
        a = loops.initiate(*r.address, 3, timeout_ms=2000, gap_us=0, bind=STRANGER)
        b = loops.initiate(*r.address, 3, timeout_ms=2000, gap_us=0)
    assert a.lost == b.lost == 0 and (r.served, r.refused) == (6, 0)


@pytest.mark.parametrize("loops", TWINS)
def test_set_allowed_changes_whom_it_answers(loops: ModuleType) -> None:
    with loops.Responder(allow=[]) as r:
        addr = r.address
        assert loops.initiate(*addr, 3, timeout_ms=100, gap_us=0).lost == 3
        r.set_allowed([STRANGER])
        got = loops.initiate(*addr, 10, timeout_ms=2000, gap_us=0, bind=STRANGER)
        assert got.seq.tolist() == list(range(10))
        assert loops.initiate(*addr, 2, timeout_ms=100, gap_us=0, bind="127.0.0.1").lost == 2
        r.set_allowed(None)
        assert loops.initiate(*addr, 4, timeout_ms=2000, gap_us=0, bind="127.0.0.1").lost == 0
    # the counters add up over every list the responder had
    assert (r.served, r.refused, r.ignored) == (14, 5, 0)


def test_probes_queued_while_the_list_changes_are_answered() -> None:
    """The C loop restarts on each change; the socket stays bound, so no probe is lost meanwhile."""
    with probe.Responder(allow=["127.0.0.1"]) as r:
        done = threading.Event()
        out = {}

        def probing() -> None:
            out["res"] = probe.initiate(*r.address, 300, timeout_ms=5000, gap_us=200)
            done.set()

        t = threading.Thread(target=probing)
        t.start()
        changes = 0
        while not done.is_set():
            r.set_allowed(["127.0.0.1", "127.0.0.3"] if changes % 2 == 0 else ["127.0.0.1"])
            changes += 1
        t.join()
    assert changes >= 5
    assert out["res"].seq.tolist() == list(range(300)) and out["res"].lost == 0
    assert (r.served, r.refused, r.ignored) == (300, 0, 0)
    assert r.error is None


@pytest.mark.parametrize("loops", TWINS)
def test_bad_lists_and_keys_are_refused_in_one_line(loops: ModuleType) -> None:
    with pytest.raises(ValueError, match="'host.example' is not an IPv4 address"):
        loops.Responder(allow=["127.0.0.1", "host.example"])
    with pytest.raises(ValueError, match="at most 512"):
        loops.Responder(allow=[f"10.0.{i // 256}.{i % 256}" for i in range(513)])
    with pytest.raises(ValueError, match="16 bytes"):
        loops.Responder(key=b"x" * 15)
    with pytest.raises(ValueError, match="16 bytes"):
        loops.initiate("127.0.0.1", 9999, 1, key=b"x" * 17)
    with loops.Responder(allow=[]) as r:
        with pytest.raises(ValueError, match="'::1' is not an IPv4 address"):
            r.set_allowed(["::1"])
        assert loops.initiate(*r.address, 2, timeout_ms=50, gap_us=0).lost == 2  # the old list holds


def test_the_c_loop_checks_its_arguments() -> None:
    r, w = os.pipe()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            with pytest.raises(ValueError, match="at most 512"):
                _probe.respond(s.fileno(), r, 10, 0, False, 0, 0, 0, b"\x7f\x00\x00")
            with pytest.raises(ValueError, match="at most 512"):
                _probe.respond(s.fileno(), r, 10, 0, False, 0, 0, 0, b"\x7f\x00\x00\x01" * 513)
            with pytest.raises(ValueError, match="16 bytes"):
                _probe.respond(s.fileno(), r, 10, 0, False, 0, 0, 0, None, b"k" * 8)
            # 512 addresses are accepted; idle for 10 ms, it returns reason 1 having counted nothing
            assert _probe.respond(s.fileno(), r, 10, 0, False, 0, 0, 0, b"\x0a\x00\x00\x01" * 512) == (
                0,
                0,
                0,
                1,
            )
    finally:
        os.close(r)
        os.close(w)


# -- keyed probes ----------------------------------------------------------


@pytest.mark.parametrize("resp", TWINS)
@pytest.mark.parametrize("ini", TWINS)
def test_a_keyed_responder_answers_only_the_right_key(ini: ModuleType, resp: ModuleType) -> None:
    with resp.Responder(key=KEY) as r:
        addr = r.address
        unkeyed = ini.initiate(*addr, 3, timeout_ms=100, gap_us=0)
        wrong = ini.initiate(*addr, 3, timeout_ms=100, gap_us=0, key=OTHER_KEY)
        right = ini.initiate(*addr, 30, timeout_ms=2000, gap_us=0, key=KEY)
    assert unkeyed.lost == 3 and wrong.lost == 3
    assert right.seq.tolist() == list(range(30)) and right.lost == 0 and right.ignored == 0
    assert np.all(right.c_i < right.c_j) and np.all(right.c_j < right.c_k)  # one process, one clock
    assert (r.served, r.refused, r.ignored) == (30, 6, 0)


@pytest.mark.parametrize("loops", TWINS)
def test_an_unkeyed_responder_does_not_answer_keyed_probes(loops: ModuleType) -> None:
    with loops.Responder() as r:
        res = loops.initiate(*r.address, 3, timeout_ms=100, gap_us=0, key=KEY)
    assert res.lost == 3 and (r.served, r.ignored, r.refused) == (0, 3, 0)


@pytest.mark.parametrize("loops", TWINS)
def test_a_keyed_responder_refuses_forged_and_replayed_requests(loops: ModuleType) -> None:
    with loops.Responder(key=KEY) as r, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2.0)
        good = _keyed((MAGIC, 2, 1, 0, 5, 0, 77, 0), KEY)
        s.sendto(good[:-1] + bytes([good[-1] ^ 1]), r.address)  # one bit of the tag flipped
        s.sendto(_keyed((MAGIC, 2, 1, 0, 5, 0, 78, 0), KEY)[:32] + good[32:], r.address)  # another tag
        s.sendto(PKT.pack(MAGIC, 1, 1, 0, 5, 0, 77, 0), r.address)  # unkeyed
        s.sendto(_keyed((MAGIC, 2, 2, 0, 5, 0, 77, 0), KEY), r.address)  # a tagged reply is no request
        s.sendto(good, r.address)
        data = s.recv(64)
    assert len(data) == 40
    magic, ver, typ, _, seq, _, pid, c_j = PKT.unpack_from(data)
    assert (magic, ver, typ, seq, pid) == (MAGIC, 2, 2, 5, 77)
    assert TAG.unpack_from(data, 32)[0] == _probe.siphash24(KEY, data[:32])
    assert (r.served, r.refused, r.ignored) == (1, 3, 1)


def _forging_responder(key: bytes) -> tuple[tuple[str, int], threading.Event, threading.Thread]:
    """Answers each keyed request with a bad tag, an unkeyed reply, another key's tag, then the real one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                data, src = sock.recvfrom(64)
            except TimeoutError:
                continue
            _, _, _, _, seq, _, pid, _ = PKT.unpack_from(data)
            reply = (MAGIC, 2, 2, 0, seq, 0, pid, 1000 + seq)
            right = _keyed(reply, key)
            sock.sendto(right[:32] + TAG.pack(TAG.unpack_from(right, 32)[0] ^ 1), src)
            sock.sendto(PKT.pack(MAGIC, 1, 2, 0, seq, 0, pid, 5), src)
            sock.sendto(_keyed(reply, OTHER_KEY), src)
            sock.sendto(right, src)
        sock.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return sock.getsockname(), stop, t


@pytest.mark.parametrize("loops", TWINS)
def test_the_initiator_ignores_replies_without_a_valid_tag(loops: ModuleType) -> None:
    addr, stop, t = _forging_responder(KEY)
    try:
        res = loops.initiate(*addr, 20, timeout_ms=2000, gap_us=0, key=KEY)
    finally:
        stop.set()
        t.join(5)
    assert res.seq.tolist() == list(range(20)) and res.lost == 0
    assert res.c_j.tolist() == [1000 + s for s in range(20)]
    assert res.ignored == 3 * 20


# -- agents and the coordinator --------------------------------------------


def _agent(
    server: str, name: str, keys: str | None = None, extra: list[str] | None = None
) -> subprocess.Popen:
    argv = [sys.executable, "-m", "cloudprofiler.cli", "sync", "agent", "--server", server, *(extra or [])]
    env = dict(os.environ, CP_TSC_VIRTUAL=make_virtual(name, "2.5", 5_000_000_000).spec())
    if keys:
        argv += ["--curve-keys", keys]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(params=["plain", "keyed"])
def cluster(request: pytest.FixtureRequest, keys: Path) -> Iterator[tuple[str, str | None]]:
    """A coordinator process and two agent processes, with keys or without: (address, keys).

    The coordinator runs in its own process: a process accepts the clients of one keys directory, and
    other test modules' keyed servers may run in this one.
    """
    k = str(keys) if request.param == "keyed" else None
    argv = [sys.executable, "-m", "cloudprofiler.cli", "sync", "serve", "--bind", "127.0.0.1:0"]
    coord = subprocess.Popen(argv + (["--curve-keys", k] if k else []), stdout=subprocess.PIPE, text=True)
    procs = [coord]
    try:
        assert coord.stdout is not None
        line = coord.stdout.readline()
        assert line.startswith("sync coordinator listening on "), line
        address = line.split()[-1]
        procs += [_agent(address, f"guard-{request.param}-{i}", k) for i in range(2)]
        wait_for(lambda: len(list_agents(address, curve_keys=k)) == 2, 60, "2 agents")
        yield address, k
    finally:
        _end(procs)


def test_agents_answer_only_the_runs_agents(cluster: tuple[str, str | None], tmp_path: Path) -> None:
    address, k = cluster
    agents = list_agents(address, curve_keys=k)
    targets = [(a["host"], a["port"]) for a in agents]
    key = None if k is None else _registered_key(address, k)
    # Before any run an agent answers nobody, not even a loopback prober with the right key.
    for host, port in targets:
        assert probe.initiate(host, port, 3, timeout_ms=100, gap_us=0, key=key).lost == 3
    res = run_phase(address, "g0", 50, tmp_path / "sync", expect=2, curve_keys=k)
    assert res["failures"] == [] and len(res["pairs"]) == 2
    assert all(p["probes"] == 50 and p["lost"] == 0 for p in res["pairs"])
    for host, port in targets:
        # the run listed the agents' address (127.0.0.1): an unlisted source still gets nothing
        assert probe.initiate(host, port, 3, timeout_ms=100, gap_us=0, bind=STRANGER, key=key).lost == 3
        listed = probe.initiate(host, port, 5, timeout_ms=2000, gap_us=0, key=key)
        assert listed.lost == 0 and len(listed.seq) == 5
        if key is not None:  # keyed agents: an unkeyed or wrongly keyed probe from a listed source too
            assert probe.initiate(host, port, 2, timeout_ms=100, gap_us=0).lost == 2
            assert probe.initiate(host, port, 2, timeout_ms=100, gap_us=0, key=OTHER_KEY).lost == 2


def _registered_key(server: str, keys: str) -> bytes:
    """The probe key a keyed coordinator gives an agent that registers: what every key holder can get."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    control.configure(s)
    curve_keys.client_secure(s, keys)
    s.connect(server)
    try:
        hello = {"op": "register", "domain": "guard-spy", "hz": 1e9, "host": "127.0.0.1", "port": 40000}
        s.send_multipart(control.pack(hello))
        assert s.poll(10_000)
        h, _ = control.unpack(s.recv_multipart())
        assert h["op"] == "registered"
        s.send_multipart(control.pack({"op": "bye", "domain": "guard-spy"}))
        time.sleep(0.2)  # let the bye leave before the socket closes
        return bytes.fromhex(h["probe_key"])
    finally:
        s.close(0)


def test_an_agent_that_never_confirms_its_peers_fails_its_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A registered agent that ignores ``peers``: the run ends with its pairs failed and named, no hang."""
    from cp_sync.nodes import coordinator as coord_mod

    monkeypatch.setattr(coord_mod, "PEERS_ACK_S", 1.0)
    coord = Coordinator("127.0.0.1:0").start()
    real = _agent(coord.address, "guard-real")
    ctx = zmq.Context.instance()
    mute = ctx.socket(zmq.DEALER)
    control.configure(mute)
    mute.connect(coord.address)
    try:
        mute.send_multipart(
            control.pack(
                {"op": "register", "domain": "guard-mute", "hz": 1e9, "host": "127.0.0.1", "port": 40001}
            )
        )
        wait_for(lambda: len(list_agents(coord.address)) == 2, 60, "2 agents")
        res = run_phase(coord.address, "m0", 10, tmp_path / "sync", expect=2, wait_s=3)
        assert res["pairs"] == []
        assert sorted(res["failures"]) == sorted(
            f"{a} -> {b}: agent guard-mute did not confirm whom to answer within 1 s"
            for a, b in (("guard-mute", "guard-real"), ("guard-real", "guard-mute"))
        )
        # it did get the list, naming the two agents' address
        assert mute.poll(1000)
        msgs = []
        while mute.poll(100):
            msgs.append(control.unpack(mute.recv_multipart())[0])
        peers = [m for m in msgs if m["op"] == "peers"]
        assert len(peers) == 1 and peers[0]["hosts"] == ["127.0.0.1"] and "probe_key" not in peers[0]
    finally:
        mute.close(0)
        _end([real])
        coord.stop()


def test_agents_on_their_own_addresses_refuse_the_rest_of_loopback(tmp_path: Path) -> None:
    """Agents bound to 127.0.0.2 and .3 probe from those: a run succeeds, 127.0.0.1 gets no answer."""
    coord = Coordinator("127.0.0.1:0").start()
    procs = [
        _agent(coord.address, f"guard-own-{i}", extra=["--probe-bind", f"127.0.0.{i + 2}"]) for i in range(2)
    ]
    try:
        wait_for(lambda: len(list_agents(coord.address)) == 2, 60, "2 agents")
        res = run_phase(coord.address, "o0", 30, tmp_path / "sync", expect=2)
        assert res["failures"] == [] and [p["probes"] for p in res["pairs"]] == [30, 30]
        for a in list_agents(coord.address):
            assert probe.initiate(a["host"], a["port"], 3, timeout_ms=100, gap_us=0).lost == 3
            mine = probe.initiate(a["host"], a["port"], 3, timeout_ms=2000, gap_us=0, bind="127.0.0.3")
            assert mine.lost == 0
    finally:
        _end(procs)
        coord.stop()


def test_a_pair_without_one_answered_probe_fails_naming_why(tmp_path: Path) -> None:
    """A peer whose responder never answers: its pair is a failure that says why, not a pair of 0 probes."""
    coord = Coordinator("127.0.0.1:0").start()
    real = _agent(coord.address, "guard-real")
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the fake agent's responder: never answers
    silent.bind(("127.0.0.1", 0))
    fake = zmq.Context.instance().socket(zmq.DEALER)
    control.configure(fake)
    fake.connect(coord.address)
    stop = threading.Event()

    def serve() -> None:
        hello = {"op": "register", "domain": "guard-fake", "hz": 1e9, "host": "127.0.0.1"}
        fake.send_multipart(control.pack({**hello, "port": silent.getsockname()[1]}))
        while not stop.is_set():
            if fake.poll(100):
                h, _ = control.unpack(fake.recv_multipart())
                if h["op"] == "peers":
                    fake.send_multipart(control.pack({"op": "peers_ok", "run": h["run"]}))
                elif h["op"] == "probe":
                    fake.send_multipart(control.pack({"op": "result", "task": h["task"], "error": "no loop"}))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        wait_for(lambda: len(list_agents(coord.address)) == 2, 60, "2 agents")
        res = run_phase(coord.address, "f0", 5, tmp_path / "sync", expect=2, timeout_ms=50)
        assert res["pairs"] == []
        assert sorted(res["failures"]) == [
            "guard-fake -> guard-real: no loop",
            "guard-real -> guard-fake: none of 5 probes was answered: the responder refuses the initiator's "
            "source (behind a relay? give its agent --probe-allow RELAY_IP), a wrong probe key, or no route",
        ]
    finally:
        stop.set()
        t.join(5)
        fake.close(0)
        silent.close()
        _end([real])
        coord.stop()


def _free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("allow_relay", [False, True], ids=["relay-refused", "relay-allowed"])
def test_a_relay_that_forwards_from_its_own_address_needs_probe_allow(
    allow_relay: bool, tmp_path: Path
) -> None:
    """B is reached through a relay on 127.0.0.4 that forwards from 127.0.0.1, an address no agent has."""
    coord = Coordinator("127.0.0.1:0").start()
    relay_port = _free_udp_port("127.0.0.4")
    b_port = _free_udp_port("127.0.0.5")
    relay_argv = [
        sys.executable,
        str(SCRIPTS / "delay_relay.py"),
        "--delay-us",
        "0",
    ]
    relay_argv += ["--listen", f"127.0.0.4:{relay_port}", "--target", f"127.0.0.5:{b_port}"]
    relay = subprocess.Popen(relay_argv, stdout=subprocess.DEVNULL)
    b_args = [
        "--probe-bind",
        "127.0.0.5",
        "--probe-port",
        str(b_port),
        "--advertise",
        f"127.0.0.4:{relay_port}",
    ]
    procs = [
        relay,
        _agent(coord.address, "guard-relay-a", extra=["--probe-bind", "127.0.0.2"]),
        _agent(
            coord.address,
            "guard-relay-b",
            extra=b_args + (["--probe-allow", "127.0.0.1"] if allow_relay else []),
        ),
    ]
    try:
        wait_for(lambda: len(list_agents(coord.address)) == 2, 60, "2 agents")
        res = run_phase(coord.address, "r0", 20, tmp_path / "sync", expect=2, timeout_ms=100)
        done = {(p["initiator"], p["responder"]): p["probes"] for p in res["pairs"]}
        if allow_relay:
            assert res["failures"] == [] and done == {
                ("guard-relay-a", "guard-relay-b"): 20,
                ("guard-relay-b", "guard-relay-a"): 20,
            }
        else:  # B's probes to A go straight; A's reach B from the relay's address, which B refuses
            assert done == {("guard-relay-b", "guard-relay-a"): 20}
            assert len(res["failures"]) == 1
            assert res["failures"][0].startswith(
                "guard-relay-a -> guard-relay-b: none of 20 probes was answered"
            )
            assert "--probe-allow" in res["failures"][0]
    finally:
        _end(procs)
        coord.stop()


def test_an_agent_registers_where_its_probes_leave_from() -> None:
    from cp_sync.nodes.agent import Agent

    cases = [
        ({"probe_bind": "127.0.0.2"}, "127.0.0.2"),  # bound: its probes leave from there
        ({"probe_bind": "0.0.0.0", "advertise": "10.1.2.3"}, "10.1.2.3"),  # this node's address
        ({"probe_bind": "0.0.0.0", "advertise": "10.1.2.3:7000"}, "127.0.0.1"),  # a relay's: the route's
    ]
    for kw, src in cases:
        a = Agent("127.0.0.1:5599", **kw)
        try:
            assert a.src == src, kw
            assert a.responder.allowed == ()  # nobody is answered before a run lists its agents
        finally:
            a.responder.close()
    with pytest.raises(ValueError, match="not an IPv4 address: 'nohost'"):
        Agent("127.0.0.1:5599", allow_from=["nohost"])
