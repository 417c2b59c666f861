"""native_tsc: both backends pass the same API tests; the C one is checked against the OS clock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import native_tsc
from native_tsc import _tsc, tsc_python
from native_tsc.clock import Clock
from native_tsc.domain import make_virtual, parse_virtual

BACKENDS = [pytest.param(_tsc, id="native"), pytest.param(tsc_python, id="fallback")]
HAS_RDTSCP = "rdtscp" in Path("/proc/cpuinfo").read_text().split()


@pytest.fixture(params=BACKENDS)
def clock(request: pytest.FixtureRequest):
    c = Clock(request.param)
    yield c
    c.clear_virtual()
    native_tsc.clock.clear_virtual()


def test_native_backend_is_the_extension() -> None:
    assert native_tsc.BACKEND == _tsc.BACKEND
    if HAS_RDTSCP:
        assert native_tsc.BACKEND == "rdtscp"


def test_reads_never_decrease_on_one_cpu(clock: Clock) -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        reads = [clock.now() for _ in range(200_000)]
        pairs = [clock.now_cpu() for _ in range(1000)]
    finally:
        os.sched_setaffinity(0, old)
    assert all(b >= a for a, b in zip(reads, reads[1:], strict=False))
    assert reads[-1] > reads[0]
    assert {c for _, c in pairs} == {cpu}
    assert all(b[0] >= a[0] for a, b in zip(pairs, pairs[1:], strict=False))


def test_clock_pair_is_back_to_back(clock: Clock) -> None:
    hz = clock.frequency_hz()
    gaps = []
    for _ in range(200):
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        tsc, ns, gap = clock.clock_pair()
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        assert before <= ns <= after
        assert gap >= 0
        gaps.append(gap)
    # Most pairs are read within a few microseconds of each other.
    assert sorted(gaps)[len(gaps) // 2] / hz < 20e-6


def _calibrate(clock: Clock, seconds: float) -> float:
    t0, n0, _ = clock.clock_pair()
    time.sleep(seconds)
    t1, n1, _ = clock.clock_pair()
    return (t1 - t0) * 1e9 / (n1 - n0)


def test_frequency_agrees_with_200ms_calibration(clock: Clock) -> None:
    hz = clock.info()["frequency_hz"]
    measured = _calibrate(clock, 0.2)
    assert abs(hz - measured) / measured < 1e-3


def test_info_fields(clock: Clock) -> None:
    info = clock.info()
    assert info["backend"] == clock.name
    assert info["domain_id"] == clock.domain_id() == clock.domain_id()
    assert info["virtual"] is None
    for key in ("constant_tsc", "nonstop_tsc", "clocksource", "frequency_hz", "invariant_tsc_cpuid"):
        assert key in info
    if clock.backend is _tsc and HAS_RDTSCP:
        assert info["invariant_tsc_cpuid"] in (True, False)
        assert info["domain_id"] == native_tsc.host_domain_id()
    if clock.backend is tsc_python:
        # A nanosecond counter is not the TSC: it must not claim the TSC's domain.
        assert info["domain_id"] != native_tsc.host_domain_id()
        assert info["frequency_hz"] == 1e9


@pytest.mark.parametrize(
    ("skew_ppm", "offset"),
    [("120", 10**12), ("-350.25", -(10**9)), ("0.000001", 7), ("99999", 0)],
)
def test_transform_is_exact(clock: Clock, skew_ppm: str, offset: int) -> None:
    v = clock.set_virtual("nodeX", skew_ppm, offset)
    e12 = v.skew_e12
    for raw in (0, 1, 999_999, 10**12 - 1, 123_456_789_012_345, 2**55 + 17):
        want = offset + raw + (raw * e12) // 10**12  # Python floors, as the spec says
        assert clock.backend.transform(raw) == want == v.apply(raw)


def test_virtual_domain_in_process(clock: Clock) -> None:
    real_hz = clock.frequency_hz()
    v = clock.set_virtual("nodeB", 250, 5 * 10**14)
    a = clock.raw()
    t = clock.now()
    b = clock.raw()
    assert v.apply(a) <= t <= v.apply(b)
    assert clock.domain_id() == "nodeB"
    assert clock.info()["virtual"] == {"domain": "nodeB", "skew_ppm": "250", "offset": 5 * 10**14}
    assert clock.frequency_hz() == pytest.approx(real_hz * (1 + 250e-6), rel=1e-12)
    clock.clear_virtual()
    a = clock.raw()
    t = clock.now()
    b = clock.raw()
    assert a <= t <= b
    assert clock.virtual() is None


def test_public_transform_and_raw_follow_the_virtual_domain() -> None:
    try:
        v = native_tsc.set_virtual("nodeT", "-42.5", 7 * 10**12)
        for raw in (0, 1, 10**12 + 3, 2**55 + 17):
            assert native_tsc.transform(raw) == v.apply(raw)
        a = native_tsc.raw()
        t = native_tsc.now()
        b = native_tsc.raw()
        assert v.apply(a) <= t <= v.apply(b)
        assert native_tsc.clock.transform_params() == (True, v.skew_e12, v.offset)
    finally:
        native_tsc.clear_virtual()
    assert native_tsc.transform(12345) == 12345
    assert native_tsc.clock.transform_params() == (False, 0, 0)


_CHILD = """
import sys, native_tsc
from native_tsc import {mod} as backend
sys.stdin.readline()
t = native_tsc.now()
print(t, native_tsc.domain_id(), native_tsc.BACKEND, flush=True)
"""


@pytest.mark.parametrize("backend", ["_tsc", "tsc_python"])
def test_virtual_domain_across_processes(backend: str) -> None:
    spec = "nodeC:-87.5:3000000000000"
    env = dict(os.environ, CP_TSC_VIRTUAL=spec)
    if backend == "tsc_python":
        env["CP_TSC_BACKEND"] = "fallback"
    mod = _tsc if backend == "_tsc" else tsc_python
    v = parse_virtual(spec)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(mod=backend)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        before = mod.raw()
        child.stdin.write("go\n")
        child.stdin.flush()
        line = child.stdout.readline()
        after = mod.raw()
    finally:
        child.communicate(timeout=30)
    value, domain, name = line.split()
    assert domain == "nodeC"
    assert name == mod.BACKEND
    # The child's reading lies where the transform puts the parent's readings around it.
    assert v.apply(before) <= int(value) <= v.apply(after)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("nodeB:12", "expected <domain-id>:<skew-ppm>:<offset-cycles>"),
        ("nodeB:abc:0", "invalid skew"),
        ("nodeB:1.0000001:0", "at most 6 decimal places"),
        ("nodeB:5:1.5", "is not an integer"),
        ("bad id:5:0", "invalid TSC domain id"),
        (":5:0", "invalid TSC domain id"),
        ("nodeB:-1000000:0", "within +-100000 ppm"),
        ("nodeB:nan:0", "must be finite"),
    ],
)
def test_bad_virtual_spec_is_named(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match="CP_TSC_VIRTUAL") as e:
        parse_virtual(spec)
    assert problem in str(e.value)


def test_make_virtual_rejects_non_integer_offset() -> None:
    with pytest.raises(ValueError, match="offset"):
        make_virtual("n", 1, 1.5)  # type: ignore[arg-type]


def test_domain_id_is_stable_across_processes() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import native_tsc; print(native_tsc.domain_id())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert out == native_tsc.domain_id() == native_tsc.host_domain_id()
    assert out.isprintable() and len(out) <= 64


def test_tsc_command_reports_backend() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cloudprofiler.cli", "tsc", "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    facts = orjson.loads(out)
    assert facts["backend"] == native_tsc.BACKEND
    if HAS_RDTSCP:
        assert facts["backend"] == "rdtscp"
    assert facts["now_call_ns"] > 0 and facts["frequency_hz"] > 1e8


def test_bad_environment_is_one_clear_line() -> None:
    env = dict(os.environ, CP_TSC_VIRTUAL="nodeB:oops:0")
    r = subprocess.run(
        [sys.executable, "-m", "cloudprofiler.cli", "tsc"], capture_output=True, text=True, env=env
    )
    assert r.returncode != 0
    assert "invalid skew" in r.stderr
