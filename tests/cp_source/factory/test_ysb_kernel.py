"""The C YSB row parser (cp_source.factory._ysb) is the numba kernel byte for byte, refuses a call whose
arrays do not fit, and lets a factory worker start without numba."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cp_source.factory._ysb import parse as c_parse
from cp_source.factory.supervisor import start_factory
from cp_source.factory.ysb_numba import _parse as numba_parse
from cp_source.wire.workloads import YSB_FIELDS

KERNELS: dict[str, Callable[..., int]] = {"c": c_parse, "numba": numba_parse}

# YSB's keys; two short ones; a key with a non-ASCII letter and an empty one (the in-order match
# takes them, the scan for an out-of-order key refuses the non-ASCII one: both kernels alike)
SCHEMAS = [list(YSB_FIELDS), ["a", "bb"], ["k\u00e9y", "", "x"]]
VALUES = st.one_of(
    st.text(alphabet="abc-0123 .", max_size=8),
    st.text(max_size=6),  # escapes, controls, non-ASCII, surrogates' stand-ins
    st.sampled_from(["", 'q"uote', "back\\slash", "tab\t", "\u00e9", "\x7f", "view"]),
)
WS = st.sampled_from(["", " ", "\t", "\r", "  \t"])  # inside a row
NOISY_WS = st.sampled_from(["", " ", "\t", "\r", "\n", "  \t"])  # a newline inside a row: refused
CLEAN_VALUES = st.text(alphabet="abc-0123 .!~", max_size=8)


@st.composite
def row(draw: st.DrawFn, keys: list[str], noise: bool) -> bytes:
    """One row: the schema's keys in any order with whitespace between any two tokens. A noisy one
    (one in four, in a noisy payload) may also miss a key, double one or have an extra one, escape a
    key, hold values with escapes, controls and non-ASCII, or a newline inside."""
    noisy = noise and draw(st.integers(0, 3)) == 0
    names = draw(st.permutations(keys))
    change = draw(st.sampled_from(["none", "drop", "dup", "extra"])) if noisy else "none"
    if change == "drop" and names:
        names = names[1:]
    elif change == "dup" and names:
        names = [*names, names[0]]
    elif change == "extra":
        names = [*names, draw(st.sampled_from(["zz", "a", "ad_i", "\u4e2d"]))]
    ws_, values = (NOISY_WS, VALUES) if noisy else (WS, CLEAN_VALUES)
    parts = []
    for k in names:
        ws = [draw(ws_) for _ in range(3)]
        key = draw(st.sampled_from([orjson.dumps(k).decode(), '"' + k + '\\u0041"'])) if noisy else f'"{k}"'
        v = draw(values)
        raw = orjson.dumps(v).decode() if draw(st.booleans()) else '"' + v + '"'
        parts.append(f"{ws[0]}{key}{ws[1]}:{ws[2]}{raw}")
    return ("{" + ",".join(parts) + draw(ws_) + "}" + draw(WS)).encode()


@st.composite
def case(draw: st.DrawFn) -> tuple[list[str], bytes, int]:
    """Keys, a payload (rows, maybe truncated, maybe raw bytes) and the rows the caller allows."""
    keys = draw(st.sampled_from(SCHEMAS))
    rows = draw(st.lists(row(keys, draw(st.booleans())), min_size=1, max_size=6))
    sep = draw(st.sampled_from([b"\n", b"\r\n", b"\n\n", b" \n", b""]))
    lead, end = draw(st.sampled_from([b"", b"\n", b"  "])), draw(st.sampled_from([b"", b"\n"]))
    payload = lead + sep.join(rows) + end
    if draw(st.integers(0, 4)) == 0:
        payload = payload[: draw(st.integers(0, len(payload)))]  # truncated anywhere
    if draw(st.integers(0, 9)) == 0:
        payload = draw(st.binary(max_size=40))
    max_rows = max(0, len(rows) + draw(st.integers(-1, 2)))  # sometimes one too few
    return keys, payload, max_rows


def _run(
    kernel: Callable[..., int], keys: list[str], payload: bytes, max_rows: int, r0: int, start: list[int]
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """A kernel's answer on fresh, identically filled buffers: (return, offsets, data, start)."""
    names = [k.encode() for k in keys]
    key_bytes = np.frombuffer(b"".join(names), np.uint8).copy()
    key_off = np.cumsum([0] + [len(n) for n in names]).astype(np.int64)
    buf = np.frombuffer(payload, np.uint8)
    offsets = np.full((len(keys), r0 + max_rows + 1), -7, np.int32)
    data = np.full((len(keys), max(start) + len(buf)), 0xEE, np.uint8)
    st_ = np.array(start, np.int64)
    got = kernel(buf, key_bytes, key_off, max_rows, offsets, data, st_, r0)
    return int(got), offsets, data, st_


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case(), st.integers(0, 3), st.lists(st.integers(0, 5), min_size=7, max_size=7))
def test_the_c_kernel_gives_what_the_numba_kernel_gives(
    c: tuple[list[str], bytes, int], r0: int, starts: list[int]
) -> None:
    keys, payload, max_rows = c
    start = starts[: len(keys)]
    want = _run(numba_parse, keys, payload, max_rows, r0, start)
    got = _run(c_parse, keys, payload, max_rows, r0, start)
    assert got[0] == want[0], payload
    for name, a, b in zip(("offsets", "data", "start"), got[1:], want[1:], strict=True):
        assert np.array_equal(a, b), f"{name} differ for {payload!r}"
    if want[0] < 0:
        assert list(got[3]) == start  # refused: start as it was


def test_both_kernels_take_canonical_rows_and_refuse_one_row_too_many() -> None:
    """The property above is not vacuous: plain YSB rows are taken (every row, exact values)."""
    rows = [{k: f"{k}-{i}" for k in YSB_FIELDS} for i in range(5)]
    payload = b"\n".join(orjson.dumps(r) for r in rows) + b"\n"
    for kernel in KERNELS.values():
        n, offsets, data, start = _run(kernel, list(YSB_FIELDS), payload, 5, 1, [0] * len(YSB_FIELDS))
        assert n == 5
        for k, key in enumerate(YSB_FIELDS):
            got = [bytes(data[k, offsets[k, r] : offsets[k, r + 1]]).decode() for r in range(1, 6)]
            assert got == [r[key] for r in rows]
        assert _run(kernel, list(YSB_FIELDS), payload, 4, 0, [0] * len(YSB_FIELDS))[0] == -1


ROW = b'{"a":"1","bb":"2","c":"3"}'
HAND = [
    (ROW + b"\n", 1, 1),
    (b'{"c":"3","a":"1","bb":"2"}', 1, 1),  # shuffled keys
    (b' {\t"a" :\r"1" , "bb":"2","c":"3" }\r\n\n' + ROW, 2, 2),  # whitespace between any tokens
    (b'{"a":"1","bb":"2"}', 1, -1),  # a key missing
    (b'{"a":"1","bb":"2","c":"3","a":"4"}', 1, -1),  # a key twice
    (b'{"a":"1","bb":"2","c":"3","d":"4"}', 1, -1),  # a key not in the schema
    (b'{"a":"1\\n","bb":"2","c":"3"}', 1, -1),  # an escape
    ('{"a":"\u00e9","bb":"2","c":"3"}'.encode(), 1, -1),  # non-ASCII
    (b'{"a":"1","bb":\n"2","c":"3"}', 1, -1),  # a newline inside a row
    (ROW + ROW, 2, -1),  # two rows on one line
    (ROW[:-1], 1, -1),  # truncated
    (ROW + b"\n" + ROW, 1, -1),  # more rows than the caller has room for
]


@pytest.mark.parametrize(("payload", "max_rows", "rows"), HAND)
def test_both_kernels_on_hand_written_rows(payload: bytes, max_rows: int, rows: int) -> None:
    got = {name: _run(k, ["a", "bb", "c"], payload, max_rows, 0, [0, 0, 0])[0] for name, k in KERNELS.items()}
    assert got == {"c": rows, "numba": rows}


def _args(nk: int = 2, n: int = 8, rows: int = 2) -> dict[str, Any]:
    return {
        "buf": np.frombuffer(b'{"a":"x"}'[:n].ljust(n), np.uint8),
        "keys": np.frombuffer(b"ab"[:nk], np.uint8).copy(),
        "key_off": np.arange(nk + 1, dtype=np.int64),
        "max_rows": rows,
        "offsets": np.zeros((nk, rows + 1), np.int32),
        "data": np.zeros((nk, n), np.uint8),
        "start": np.zeros(nk, np.int64),
        "r0": 0,
    }


ro = np.zeros((2, 8), np.uint8)
ro.flags.writeable = False
WRONG = [
    ({"buf": b"not an array".decode()}, TypeError, "parse: buf must be a uint8 array"),
    ({"buf": np.zeros(8, np.int16)}, TypeError, "parse: buf must be a C-contiguous 1-D uint8 array"),
    ({"keys": np.zeros((1, 2), np.uint8)}, TypeError, "parse: keys must be a C-contiguous 1-D"),
    ({"key_off": np.arange(3, dtype=np.int32)}, TypeError, "parse: key_off must be a C-contiguous 1-D int64"),
    ({"offsets": np.zeros((2, 3), np.int64)}, TypeError, "parse: offsets must be a C-contiguous 2-D int32"),
    ({"offsets": np.zeros((2, 6), np.int32)[:, ::2]}, TypeError, "parse: offsets must be a C-contiguous"),
    ({"data": ro}, TypeError, "parse: data must be a writable uint8 array"),
    ({"start": np.zeros(2, np.float64)}, TypeError, "parse: start must be a C-contiguous 1-D int64"),
    ({"offsets": np.zeros((2, 2), np.int32)}, ValueError, "has 2 columns, too few for r0 0 + max_rows 2"),
    ({"r0": 1}, ValueError, "offsets has 3 columns, too few for r0 1"),
    ({"r0": -1}, ValueError, "too few for r0 -1"),
    ({"max_rows": -1}, ValueError, "max_rows -1"),
    ({"data": np.zeros((2, 7), np.uint8)}, ValueError, "data has 7 columns, too few for start[0] 0 + 8"),
    ({"start": np.array([0, 1], np.int64)}, ValueError, "too few for start[1] 1 + 8 payload bytes"),
    ({"start": np.array([-1, 0], np.int64)}, ValueError, "start[0] -1"),
    ({"start": np.zeros(3, np.int64)}, ValueError, "need one row per key (2 keys; got 2, 2, 3)"),
    ({"data": np.zeros((1, 8), np.uint8)}, ValueError, "need one row per key (2 keys; got 2, 1, 2)"),
    ({"key_off": np.array([0, 1, 3], np.int64)}, ValueError, "key_off[2] is outside keys or decreasing"),
    ({"key_off": np.array([0, 2, 1], np.int64)}, ValueError, "key_off[2] is outside keys or decreasing"),
    ({"key_off": np.zeros(0, np.int64)}, ValueError, "key_off must hold 1 to 63 entries (got 0)"),
    ({"key_off": np.zeros(64, np.int64)}, ValueError, "key_off must hold 1 to 63 entries (got 64)"),
]


@pytest.mark.parametrize(("change", "error", "message"), WRONG)
def test_a_call_whose_arrays_do_not_fit_is_refused_before_writing(
    change: dict[str, Any], error: type[Exception], message: str
) -> None:
    args = {**_args(), **change}
    before = [np.array(a, copy=True) for a in (args["offsets"], args["data"], args["start"])]
    with pytest.raises(error, match=re.escape(message)):
        c_parse(*args.values())
    for a, b in zip(before, (args["offsets"], args["data"], args["start"]), strict=True):
        assert np.array_equal(a, b)  # nothing written


def test_a_call_that_fits_exactly_parses() -> None:
    args = _args(nk=1, n=9, rows=1)
    args["buf"] = np.frombuffer(b'{"a":"x"}', np.uint8)
    assert c_parse(*args.values()) == 1
    assert args["offsets"].tolist() == [[0, 1]] and args["start"].tolist() == [1]


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("parser", ["auto", "numba"])
def test_a_default_factory_worker_never_loads_numba(tmp_path: Path, parser: str) -> None:
    """Real workers started by the factory: by default numba's and llvmlite's native libraries are
    not in the process (numba was not imported); with parser="numba" they are (the check works)."""
    with start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=1, parser=parser) as f:
        f.wait_ready()
        deadline = time.monotonic() + 30
        pids = f.worker_pids()
        while time.monotonic() < deadline and not all(Path(f"/proc/{p}/maps").exists() for p in pids):
            time.sleep(0.05)
        loaded = {p: [m for m in ("/numba/", "llvmlite") if m in _maps(p)] for p in pids}
    assert len(pids) == 1
    if parser == "auto":
        assert loaded == {pids[0]: []}
    else:
        assert loaded == {pids[0]: ["/numba/", "llvmlite"]}
