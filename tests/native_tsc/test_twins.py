"""The C modules and their pure-Python twins against the Protocols they share.

Each twin must provide every Protocol member with a compatible call (checked by
calling it), pass the runtime ``isinstance`` check, and satisfy mypy when
assigned to a variable of the Protocol type.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import native_tsc
from cp_sync.probe import native as probe
from cp_sync.probe import python_twin as probe_python
from cp_sync.probe.api import ProbeLoops, ProbeResponder, ProbeResult
from native_tsc import _tsc, tsc_python
from native_tsc.backend_api import ClockBackend

ROOT = Path(__file__).resolve().parents[2]
CLOCK_TWINS = [pytest.param(_tsc, id="c"), pytest.param(tsc_python, id="python")]
PROBE_TWINS = [pytest.param(probe, id="c"), pytest.param(probe_python, id="python")]


def _protocol_members(proto: type) -> set[str]:
    own = set(proto.__dict__) | set(getattr(proto, "__annotations__", {}))
    return {m for m in own if not m.startswith("_")}


def test_clock_protocol_lists_the_whole_api() -> None:
    want = {"BACKEND", "now", "now_cpu", "raw", "clock_pair", "transform", "set_transform"}
    want |= {"clear_transform", "cpuid_invariant", "cpuid_hz"}
    assert _protocol_members(ClockBackend) == want


@pytest.mark.parametrize("backend", CLOCK_TWINS)
def test_clock_backend_meets_the_protocol(backend: ModuleType) -> None:
    assert isinstance(backend, ClockBackend)
    for name in _protocol_members(ClockBackend):
        assert hasattr(backend, name), name
    assert isinstance(backend.BACKEND, str) and backend.BACKEND
    # Every member called as the Protocol declares it, results of the declared types.
    assert isinstance(backend.now(), int) and isinstance(backend.raw(), int)
    tsc, cpu = backend.now_cpu()
    assert isinstance(tsc, int) and isinstance(cpu, int)
    assert all(isinstance(v, int) for v in backend.clock_pair())
    assert backend.cpuid_invariant() in (True, False, None)
    assert isinstance(backend.cpuid_hz(), int)
    try:
        backend.set_transform(0, 5)
        assert backend.transform(10) == 15
    finally:
        backend.clear_transform()
        native_tsc.clock.clear_virtual()
    assert backend.transform(10) == 10


def test_python_twin_signatures_match_the_protocol() -> None:
    for name in _protocol_members(ClockBackend) - {"BACKEND"}:
        want = inspect.signature(getattr(ClockBackend, name))
        params = list(want.parameters.values())[1:]  # without self
        got = inspect.signature(getattr(tsc_python, name))
        assert [(p.name, p.kind) for p in got.parameters.values()] == [(p.name, p.kind) for p in params], name


@pytest.mark.parametrize("loops", PROBE_TWINS)
def test_probe_loops_meet_the_protocol(loops: ModuleType) -> None:
    assert isinstance(loops, ProbeLoops)
    assert loops.LABEL in ("c", "python")
    for other in (probe, probe_python):
        # Each initiator against each responder, called as the Protocol declares them.
        with other.Responder(bind="127.0.0.1", port=0) as r:
            assert isinstance(r, ProbeResponder)
            host, port = r.address
            res = loops.initiate(host, port, 10, timeout_ms=500, gap_us=0, spin=False, bind="127.0.0.1")
        assert isinstance(res, ProbeResult)
        assert res.seq.tolist() == list(range(10)) and res.lost == 0
        assert all(a.dtype == np.int64 for a in (res.seq, res.c_i, res.c_j, res.c_k, res.ns_i))
        assert np.all(res.rtt > 0)
        assert r.served == 10


def test_probe_twin_signatures_match_the_protocol() -> None:
    def names(fn: Any, drop_self: bool) -> list[str]:
        ps = list(inspect.signature(fn).parameters.values())
        return [p.name for p in ps[1 if drop_self else 0 :]]

    want = names(ProbeLoops.initiate, True)
    assert names(probe.initiate, False) == names(probe_python.initiate, False) == want
    assert inspect.signature(probe.initiate) == inspect.signature(probe_python.initiate)

    def kinds(fn: Any, drop_self: bool) -> tuple[list[str], list[str]]:
        ps = list(inspect.signature(fn).parameters.values())[1 if drop_self else 0 :]
        kw = [p.name for p in ps if p.kind == p.KEYWORD_ONLY]
        return [p.name for p in ps if p.kind != p.KEYWORD_ONLY], kw

    want_pos, want_kw = kinds(ProbeLoops.Responder, True)
    assert want_kw == ["allow", "key"]
    for cls in (probe.Responder, probe_python.Responder):
        pos, kw = kinds(cls, False)
        # the Protocol's positional parameters first (a twin may add its own after), the same keyword-only
        assert pos[: len(want_pos)] == want_pos and kw == want_kw


def test_a_module_missing_a_member_is_not_a_backend() -> None:
    partial = ModuleType("partial")
    partial.BACKEND = "x"  # type: ignore[attr-defined]
    partial.now = lambda: 0  # type: ignore[attr-defined]
    assert not isinstance(partial, ClockBackend)


# Each line that should pass, and each that mypy must refuse (a module without the members, or another
# Protocol's), so the check can fail as well as pass.
_MYPY_CHECK = """
from cp_sync.probe import native as probe
from cp_sync.probe import python_twin as probe_python
import os.path
from cp_sync.probe.api import ProbeLoops
from native_tsc import _tsc, tsc_python
from native_tsc.backend_api import ClockBackend

c_backend: ClockBackend = _tsc  # ok
py_backend: ClockBackend = tsc_python  # ok
c_loops: ProbeLoops = probe  # ok
py_loops: ProbeLoops = probe_python  # ok
backend: ClockBackend = os.path  # refused
loops: ProbeLoops = os.path  # refused
not_a_clock: ClockBackend = probe  # refused
"""


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """mypy's errors on ``_MYPY_CHECK``, by line number."""
    api: Any = pytest.importorskip("mypy.api")
    tmp = tmp_path_factory.mktemp("mypy")
    f = tmp / "check.py"
    f.write_text(_MYPY_CHECK)
    # The editable install is an import hook mypy cannot see: point it at the sources. Missing imports
    # stay errors, so a Protocol that failed to resolve cannot pass as Any.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MYPYPATH", str(ROOT))
        out, err, status = api.run(
            [str(f), "--follow-imports=silent", "--no-incremental", "--cache-dir", str(tmp)]
        )
    # mypy names the file relative to the working directory: match on the name alone.
    found = [re.match(r"^.*check\.py:(\d+): error: (.*)$", line) for line in (out + err).splitlines()]
    errors = {int(m.group(1)): m.group(2) for m in found if m}
    assert status == (1 if errors else 0), out + err
    return errors


def _lines(marker: str) -> list[int]:
    return [n for n, text in enumerate(_MYPY_CHECK.splitlines(), 1) if text.endswith(marker)]


def test_mypy_accepts_both_twins_as_their_protocols(mypy_report: dict[int, str]) -> None:
    assert _lines("# ok") and not [mypy_report[n] for n in _lines("# ok") if n in mypy_report]
    assert set(mypy_report) <= set(_lines("# refused")), mypy_report


def test_mypy_refuses_modules_that_do_not_fit(mypy_report: dict[int, str]) -> None:
    for n in _lines("# refused"):
        assert "Incompatible types in assignment" in mypy_report.get(n, ""), (n, mypy_report)
