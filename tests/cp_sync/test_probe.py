"""C-timed probes: exact transforms, answered and lost probes, forged and stale datagrams, the GIL."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import native_tsc
from cp_sync.probe import python_twin as probe_python
from cp_sync.probe.native import Responder, initiate
from native_tsc import _probe, _tsc, probe_loops
from native_tsc.domain import make_virtual

PKT = struct.Struct("<IBBHIIQq")
MAGIC = 0x42525043


@settings(max_examples=300, deadline=None)
@given(
    raw=st.integers(0, 2**62),
    skew=st.decimals(min_value=-99999, max_value=99999, places=6, allow_nan=False),
    offset=st.integers(-(2**62), 2**62),
)
def test_responder_transform_is_native_tsc_transform(raw: int, skew, offset: int) -> None:
    v = make_virtual("tx", skew, offset)
    expected = v.apply(raw)
    if not -(2**63) <= expected < 2**63:
        return
    assert _probe.transform(raw, True, v.skew_e12, v.offset) == expected
    _tsc.set_transform(v.skew_e12, v.offset)
    try:
        assert _tsc.transform(raw) == expected
    finally:
        native_tsc.clock.clear_virtual()
    assert _probe.transform(raw, False, 5, 7) == raw
    # The public wrapper gives the same, with explicit parameters or this process's own.
    assert probe_loops.c_transform(raw, (True, v.skew_e12, v.offset)) == expected
    assert probe_loops.c_transform(raw) == raw


def test_probe_loops_constants_are_the_extensions() -> None:
    assert (probe_loops.PACKET_SIZE, probe_loops.ROW_FIELDS, probe_loops.MAX_PROBES) == (
        _probe.PACKET_SIZE,
        _probe.ROW_FIELDS,
        _probe.MAX_PROBES,
    )
    assert PKT.size == probe_loops.PACKET_SIZE
    assert probe_loops.unavailable_reason() is None


def test_c_transform_follows_the_virtual_domain() -> None:
    v = native_tsc.set_virtual("ctx-virt", "-12.5", 3 * 10**14)
    try:
        assert probe_loops.transform_params() == (True, v.skew_e12, v.offset)
        for raw in (0, 10**12, 2**50 + 3):
            assert probe_loops.c_transform(raw) == native_tsc.transform(raw) == v.apply(raw)
    finally:
        native_tsc.clear_virtual()


def test_every_probe_answered_in_order() -> None:
    with Responder() as r:
        host, port = r.address
        res = initiate(host, port, 500, gap_us=0)
    assert sorted(res.seq.tolist()) == list(range(500))
    assert res.lost == 0 and res.ignored == 0
    # One process, no virtual domain: the three stamps are one counter, in send order.
    assert np.all(res.c_i < res.c_j) and np.all(res.c_j < res.c_k)
    assert np.all(np.diff(res.c_i) > 0)
    assert r.served == 500


def test_virtual_domain_applied_on_both_sides() -> None:
    v = native_tsc.set_virtual("probe-virt", "250", 10**15)
    try:
        with Responder() as r:
            res = initiate(*r.address, 200, gap_us=0)
        # Both sides share this process's transform, so the bracket holds in the virtual domain too.
        assert np.all(res.c_i < res.c_j) and np.all(res.c_j < res.c_k)
        assert res.c_i.min() > 10**15
        raw_now = native_tsc.clock.raw()
        assert abs(native_tsc.now() - v.apply(raw_now)) < 10**7
    finally:
        native_tsc.clear_virtual()


def _fake_responder(behaviour: str) -> tuple[socket.socket, threading.Thread, threading.Event]:
    """A responder that answers each request with forged and stale datagrams before (maybe) the real one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                data, src = sock.recvfrom(64)
            except TimeoutError:
                continue
            magic, ver, typ, _, seq, _, pid, _ = PKT.unpack(data)
            if behaviour == "silent":
                continue
            sock.sendto(PKT.pack(MAGIC, 1, 2, 0, seq, 0, pid ^ 1, 111), src)  # wrong probe id
            sock.sendto(PKT.pack(MAGIC, 1, 2, 0, seq + 7, 0, pid, 222), src)  # stale sequence
            sock.sendto(b"\x00" * 31, src)  # bad size
            sock.sendto(PKT.pack(MAGIC ^ 1, 1, 2, 0, seq, 0, pid, 333), src)  # bad magic
            other.sendto(PKT.pack(MAGIC, 1, 2, 0, seq, 0, pid, 444), src)  # right fields, wrong sender
            sock.sendto(PKT.pack(MAGIC, 1, 2, 0, seq, 0, pid, 1000 + seq), src)

    t = threading.Thread(target=loop, daemon=True)
    t.start()

    def close() -> None:
        stop.set()
        t.join(2)
        sock.close()
        other.close()

    stop.close = close  # type: ignore[attr-defined]
    return sock, t, stop


def test_forged_and_stale_replies_are_ignored() -> None:
    sock, _, stop = _fake_responder("forge")
    try:
        res = initiate(*sock.getsockname(), 50, gap_us=0, timeout_ms=1000)
        spun = initiate(*sock.getsockname(), 20, gap_us=0, timeout_ms=1000, spin=True)
    finally:
        stop.close()  # type: ignore[attr-defined]
    for r, n in ((res, 50), (spun, 20)):
        assert sorted(r.seq.tolist()) == list(range(n))
        assert r.c_j.tolist() == [1000 + s for s in r.seq.tolist()]
        assert r.ignored == 5 * n
        assert r.lost == 0


def test_unanswered_probes_time_out_as_lost() -> None:
    sock, _, stop = _fake_responder("silent")
    try:
        res = initiate(*sock.getsockname(), 5, gap_us=0, timeout_ms=20)
        spun = initiate(*sock.getsockname(), 3, gap_us=0, timeout_ms=20, spin=True)
    finally:
        stop.close()  # type: ignore[attr-defined]
    assert res.lost == 5 and len(res.seq) == 0
    assert spun.lost == 3 and len(spun.seq) == 0


def test_responder_ignores_malformed_requests() -> None:
    with Responder() as r, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.0)
        s.sendto(b"short", r.address)
        s.sendto(PKT.pack(MAGIC, 1, 2, 0, 0, 0, 1, 0), r.address)  # a reply, not a request
        s.sendto(PKT.pack(MAGIC, 9, 1, 0, 0, 0, 1, 0), r.address)  # unknown version
        s.sendto(PKT.pack(MAGIC, 1, 1, 0, 42, 0, 99, 0), r.address)
        data = s.recv(64)
    magic, _, typ, _, seq, _, pid, _ = PKT.unpack(data)
    assert (magic, typ, seq, pid) == (MAGIC, 2, 42, 99)
    assert (r.served, r.ignored) == (1, 3)


def test_probe_loop_releases_the_gil() -> None:
    with Responder() as r:
        done = threading.Event()
        result = {}

        def worker() -> None:
            result["res"] = initiate(*r.address, 400, gap_us=500)
            done.set()

        t = threading.Thread(target=worker)
        t.start()
        spins = 0
        while not done.is_set():
            spins += 1
        t.join()
    # The main thread kept running Python while the probe loop ran (about 0.2 s of gaps).
    assert spins > 10_000
    assert len(result["res"].seq) == 400


def test_fallback_backend_refuses_c_probes() -> None:
    code = (
        "from cp_sync.probe.native import Responder, ProbeUnavailable\n"
        "try:\n    Responder()\nexcept ProbeUnavailable as e:\n    print('refused:', e)\n"
    )
    env = dict(os.environ, CP_TSC_BACKEND="fallback")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "refused:" in r.stdout and "cp_sync.probe.python_twin" in r.stdout
    cmd = [sys.executable, "-m", "cloudprofiler.cli", "sync", "agent", "--server", "127.0.0.1:9"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "need the native TSC backend" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_python_probe_loop_same_wire_format() -> None:
    with probe_python.Responder() as r:
        d = probe_python.initiate(*r.address, 100, gap_us=0)
    assert d.seq.tolist() == list(range(100)) and d.lost == 0 and d.ignored == 0
    assert np.all(d.c_i < d.c_j) and np.all(d.c_j < d.c_k)
    assert np.all(np.diff(d.ns_i) > 0)
    # The C initiator speaks to the Python responder and the Python initiator to the C one: one format.
    with probe_python.Responder() as r:
        res = initiate(*r.address, 20, gap_us=0)
    assert sorted(res.seq.tolist()) == list(range(20))
    with Responder() as r:
        back = probe_python.initiate(*r.address, 20, gap_us=0, spin=True)
    assert back.seq.tolist() == list(range(20)) and np.all(back.c_i < back.c_j)


def test_python_probe_loop_ignores_forgeries_and_counts_losses() -> None:
    sock, _, stop = _fake_responder("forge")
    try:
        res = probe_python.initiate(*sock.getsockname(), 20, gap_us=0, timeout_ms=1000)
    finally:
        stop.close()  # type: ignore[attr-defined]
    assert res.seq.tolist() == list(range(20))
    assert res.c_j.tolist() == [1000 + s for s in range(20)]
    assert res.ignored == 5 * 20 and res.lost == 0
    sock, _, stop = _fake_responder("silent")
    try:
        res = probe_python.initiate(*sock.getsockname(), 3, gap_us=0, timeout_ms=20)
    finally:
        stop.close()  # type: ignore[attr-defined]
    assert res.lost == 3 and len(res.seq) == 0


@pytest.mark.parametrize("loops", [initiate, probe_python.initiate], ids=["c", "python"])
def test_bad_arguments(loops) -> None:
    with pytest.raises(ValueError):
        loops("localhost", 9, 1)
    with pytest.raises(ValueError):
        loops("127.0.0.1", 9, 0)
    with pytest.raises(ValueError):
        loops("127.0.0.1", 9, 1, timeout_ms=0)
