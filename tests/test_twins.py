"""The C modules and their pure-Python twins against the Protocols they share.

Each twin must provide every Protocol member with a compatible call (checked by
calling it), pass the runtime ``isinstance`` check, and satisfy mypy when
assigned to a variable of the Protocol type.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import native_tsc
from native_tsc import _tsc, tsc_python
from native_tsc.backend_api import ClockBackend

ROOT = Path(__file__).resolve().parent.parent
CLOCK_TWINS = [pytest.param(_tsc, id="c"), pytest.param(tsc_python, id="python")]


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


def test_a_module_missing_a_member_is_not_a_backend() -> None:
    partial = ModuleType("partial")
    partial.BACKEND = "x"  # type: ignore[attr-defined]
    partial.now = lambda: 0  # type: ignore[attr-defined]
    assert not isinstance(partial, ClockBackend)


def _mypy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str) -> tuple[int, str]:
    api: Any = pytest.importorskip("mypy.api")
    f = tmp_path / "check.py"
    f.write_text(textwrap.dedent(code))
    # The editable install is an import hook mypy cannot see: point it at the sources. Missing imports
    # are errors here, so a Protocol that failed to resolve cannot pass as Any.
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    out, err, status = api.run(
        [str(f), "--follow-imports=silent", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy")]
    )
    return status, out + err


def test_mypy_accepts_both_twins_as_the_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status, out = _mypy(
        tmp_path,
        monkeypatch,
        """
        from native_tsc import _tsc, tsc_python
        from native_tsc.backend_api import ClockBackend

        c_backend: ClockBackend = _tsc
        py_backend: ClockBackend = tsc_python
        """,
    )
    assert status == 0, out


def test_mypy_rejects_a_module_that_is_not_a_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check above can fail: a module without the clock functions is refused.
    status, out = _mypy(
        tmp_path,
        monkeypatch,
        """
        import os.path
        from native_tsc.backend_api import ClockBackend

        backend: ClockBackend = os.path
        """,
    )
    assert status == 1 and "ClockBackend" in out, out
