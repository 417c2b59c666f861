"""Handler kernels: each rule gives exactly what it says on known id sequences."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cp_sink.handlers import parse_handler, period_counts, selected_positions


def test_downsample_keeps_multiples_of_n() -> None:
    ids = np.arange(0, 10_000, dtype=np.int64)
    pos = selected_positions(parse_handler("downsample", {"n": "7"}), ids)
    assert ids[pos].tolist() == list(range(0, 10_000, 7))


def test_xoy_paper_parameters() -> None:
    ids = np.arange(0, 5 * 1024 + 10, dtype=np.int64)
    spec = parse_handler("xoy", {"x": 2, "y": 1024})
    kept = ids[selected_positions(spec, ids)].tolist()
    expected = [t for k in range(6) for t in (k * 1024, k * 1024 + 1) if t < ids.size]
    assert kept == expected


def test_xoy_defaults_are_the_papers() -> None:
    assert parse_handler("xoy").params == {"x": 2, "y": 1024}


def test_firstlast_and_null_and_id() -> None:
    ids = np.array([5, 9, 2, 7], dtype=np.int64)
    assert selected_positions(parse_handler("firstlast"), ids).tolist() == [0, 3]
    assert selected_positions(parse_handler("firstlast"), ids[:1]).tolist() == [0]
    assert selected_positions(parse_handler("firstlast"), ids[:0]).tolist() == []
    assert selected_positions(parse_handler("null"), ids).tolist() == []
    assert selected_positions(parse_handler("id"), ids) is None


def test_period_counts_sum_to_total() -> None:
    tscs = np.array([0, 1, 9, 10, 10, 25, 3, 31], dtype=np.int64)
    assert period_counts(tscs, 10.0) == {0: 4, 1: 2, 2: 1, 3: 1}
    assert sum(period_counts(tscs, 10.0).values()) == tscs.size


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=300),
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=1, max_value=50),
)
def test_mod_rules_match_definition(ids: list[int], x: int, y: int) -> None:
    arr = np.array(ids, dtype=np.int64)
    if x <= y:
        got = arr[selected_positions(parse_handler("xoy", {"x": x, "y": y}), arr)].tolist()
        assert got == [t for t in ids if t % y < x]
    got = arr[selected_positions(parse_handler("downsample", {"n": y}), arr)].tolist()
    assert got == [t for t in ids if t % y == 0]


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("bogus", {}, "unknown handler"),
        ("downsample", {}, "needs parameter n"),
        ("downsample", {"n": "0"}, "between 1"),
        ("downsample", {"n": "abc"}, "expected an integer"),
        ("xoy", {"x": 5, "y": 2}, "must not exceed"),
    ],
)
def test_bad_handler_settings(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_handler(name, params)


def test_period_counts_with_weights() -> None:
    tscs = np.array([5, 12, 18, 3], dtype=np.int64)
    assert period_counts(tscs, 10.0, np.array([100, 7, 1, 2])) == {0: 102, 1: 8}


# The sink's writer runs in the executors' Python; the lean environment of docs/deployment.md has
# numpy, pyarrow, pyzmq and orjson, not numba.
NO_NUMBA = """
import sys
sys.modules["numba"] = None  # any import of numba now raises ImportError
import subprocess
import sys

import numpy as np
from cp_sink.handlers import parse_handler, selected_positions
ids = np.array([-1025, -3, 0, 1, 2, 1024, 1026], dtype=np.int64)
print(selected_positions(parse_handler("xoy", {}), ids).tolist())
"""


def test_the_sinks_handlers_need_no_numba() -> None:
    r = subprocess.run([sys.executable, "-c", NO_NUMBA], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[2, 3, 5]"  # -1025 mod 1024 = 1023, -3 mod 1024 = 1021


def test_one_registry_names_every_handler_for_the_sink_and_the_channels() -> None:
    from cp_sink.channels import CHANNEL_HANDLERS, parse_channel_handler
    from cp_sink.channels.registry import FAMILIES
    from cp_sink.handlers import HANDLERS, REGISTRY, SELECTING

    assert list(REGISTRY) == ["identity", "downsample", "xoy", "firstlast", "pc", "null", "buffered"]
    assert HANDLERS == ("identity", "downsample", "xoy", "firstlast", "pc", "null")
    assert SELECTING == ("identity", "downsample", "xoy", "firstlast")
    assert set(CHANNEL_HANDLERS) == set(FAMILIES) == set(REGISTRY)
    # the registry's block flag decides which channels take a block size, its params which are checked
    blocked = {n for n in CHANNEL_HANDLERS if "block" in parse_channel_handler(n, {"n": 2})[1]}
    assert blocked == {"buffered", "downsample", "xoy"}
    assert parse_channel_handler("PC") == ("pc", {"periodMs": 1000})
    with pytest.raises(ValueError) as e:
        parse_handler("buffered")  # a channel's handler only: the sink names its own
    assert str(e.value) == (
        "unknown handler 'buffered' (expected one of identity, downsample, xoy, firstlast, pc, null)"
    )
