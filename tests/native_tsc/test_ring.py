"""The channels' ring: the C ``_tsc.Ring`` and its twin ``ring_python.Ring``, held to the same truths.

Exact records out for records in (across the wrap), the full-ring policy (``on_full`` up
to 3 times, then a counted drop), refusals, ids outside int64, the bounds, several
writer threads, and the C delta encoder against its numpy twin.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import native_tsc
from cp_sink.channels.files import narrow_deltas_numpy
from native_tsc import _tsc, ring_python, tsc_python
from native_tsc.backend_api import ChannelRing

TWINS = [pytest.param(_tsc.Ring, id="c"), pytest.param(ring_python.Ring, id="python")]
Make = Callable[[int], ChannelRing]


def _pairs(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.int64).reshape(-1, 2)


@pytest.mark.parametrize("make", TWINS)
def test_records_out_are_the_records_in_across_the_wrap(make: Make) -> None:
    ring = make(5)
    ring.log(0)
    ring.log(1)
    got: list[np.ndarray] = []
    for start in range(2, 24, 3):  # 3 in, 3 out, 2 held: the ring wraps several times
        for t in range(start, start + 3):
            ring.log(t)
        got.append(_pairs(ring.take(3)))
    got.append(_pairs(ring.take()))
    pairs = np.concatenate(got)
    assert pairs[:, 1].tolist() == list(range(26))
    assert np.all(np.diff(pairs[:, 0]) >= 0)
    assert ring.counts() == (26, 0, 0, 0, 0)
    assert ring.take() == b"" and ring.capacity == 5


@pytest.mark.parametrize("make", TWINS)
def test_a_full_ring_without_on_full_drops_and_counts(make: Make) -> None:
    ring = make(4)
    for t in range(10):
        ring.log(t)
    assert ring.counts() == (4, 4, 6, 0, 0)
    assert _pairs(ring.take())[:, 1].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("make", TWINS)
def test_on_full_drains_so_nothing_is_dropped(make: Make) -> None:
    ring = make(8)
    out: list[bytes] = []
    ring.set_on_full(lambda: out.append(ring.take()))
    for t in range(100):
        ring.log(t)
    out.append(ring.take())
    assert _pairs(b"".join(out))[:, 1].tolist() == list(range(100))
    assert ring.counts() == (100, 0, 0, 0, 0)
    assert len(out) == 100 // 8 + 1  # called once per full ring


@pytest.mark.parametrize("make", TWINS)
def test_on_full_that_frees_nothing_is_tried_three_times_then_the_pair_counted(make: Make) -> None:
    ring = make(2)
    calls: list[int] = []
    ring.set_on_full(lambda: calls.append(1))
    for t in range(4):
        ring.log(t)
    assert len(calls) == 2 * 3 and ring.counts() == (2, 2, 2, 0, 0)


@pytest.mark.parametrize("make", TWINS)
def test_on_full_raising_makes_the_call_raise_and_store_nothing(make: Make) -> None:
    ring = make(1)
    ring.log(1)

    def boom() -> None:
        raise OSError("disk")

    ring.set_on_full(boom)
    with pytest.raises(OSError, match="disk"):
        ring.log(2)
    assert ring.counts() == (1, 1, 0, 0, 0)


@pytest.mark.parametrize("make", TWINS)
def test_a_refused_ring_raises_and_stores_nothing(make: Make) -> None:
    ring = make(4)

    def refusal() -> None:
        raise ValueError("refused")

    ring.refuse(refusal)
    with pytest.raises(ValueError, match="refused"):
        ring.log(1)
    ring.refuse(None)
    ring.log(2)
    # refused while on_full ran: the call that found the ring full raises, its pair is not stored
    ring2 = make(1)
    ring2.log(1)
    ring2.set_on_full(lambda: (ring2.take(), ring2.refuse(refusal)))
    with pytest.raises(ValueError, match="refused"):
        ring2.log(2)
    assert ring.counts() == (1, 1, 0, 0, 0) and ring2.counts() == (1, 0, 0, 0, 0)


@pytest.mark.parametrize("make", TWINS)
def test_ids_outside_int64_are_counted_not_stored(make: Make) -> None:
    ring = make(8)
    for t in (2**63, -(2**63) - 1, 1.5, "7", None):
        ring.log(t)  # type: ignore[arg-type]
    for t in (2**63 - 1, -(2**63), np.int64(5), True):
        ring.log(t)  # type: ignore[arg-type]
    assert ring.counts() == (4, 4, 0, 5, 0)
    assert _pairs(ring.take())[:, 1].tolist() == [2**63 - 1, -(2**63), 5, 1]


@pytest.mark.parametrize("make", TWINS)
def test_bounds_and_counting(make: Make) -> None:
    for bad in (0, -1, (1 << 26) + 1):
        with pytest.raises(ValueError, match=f"ring capacity {bad}: must be between 1 and 2\\*\\*26 records"):
            make(bad)
    ring = make(1)
    ring.count(3)
    ring.add(10)
    with pytest.raises(ValueError, match="at least 0"):
        ring.add(-1)
    assert ring.counts() == (0, 0, 0, 0, 11)


def test_the_c_ring_stamps_in_the_processes_virtual_domain() -> None:
    # _tsc.c and _ring.c share the transform: a ring's stamps move with set_transform.
    ring = _tsc.Ring(2)
    _tsc.set_transform(0, 1 << 60)
    try:
        before = _tsc.now()
        ring.log(1)
        after = _tsc.now()
    finally:
        _tsc.clear_transform()
        native_tsc.clock.clear_virtual()
    assert before <= int(_pairs(ring.take())[0, 0]) <= after


def test_new_ring_follows_the_clock_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(native_tsc.new_ring(1), _tsc.Ring)
    monkeypatch.setattr(native_tsc.clock, "backend", tsc_python)
    ring = native_tsc.new_ring(1)
    assert isinstance(ring, ring_python.Ring)
    t0 = tsc_python.now()
    ring.log(9)
    tsc, t = _pairs(ring.take())[0].tolist()
    assert t == 9 and t0 <= tsc <= tsc_python.now()  # the fallback clock's nanoseconds


@pytest.mark.parametrize("make", TWINS)
def test_writers_in_several_threads_lose_nothing(make: Make) -> None:
    ring = make(64)  # small: full many times, drained by whichever writer finds it full
    out: list[bytes] = []
    lock = threading.Lock()

    def drain() -> None:
        with lock:
            out.append(ring.take())

    ring.set_on_full(drain)
    per, threads = 4_000, 4
    start = threading.Barrier(threads)

    def write(k: int) -> None:
        start.wait()
        for t in range(k * per, (k + 1) * per):
            ring.log(t)
            if t % 8 == 0:
                time.sleep(0)  # gives up the GIL: the writers interleave every few records

    workers = [threading.Thread(target=write, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    drain()
    ids = _pairs(b"".join(out))[:, 1]
    stored, held, dropped, not_int64, _ = ring.counts()
    # A drop needs another writer to refill the whole ring 3 times while a drain returns: rare,
    # and counted. Every id is out exactly once or counted dropped.
    assert (held, not_int64) == (0, 0) and stored + dropped == per * threads
    assert ids.size == stored and np.unique(ids).size == stored
    assert np.all((ids >= 0) & (ids < per * threads))
    for k in range(threads):  # each writer's ids in its own order
        mine = ids[(ids >= k * per) & (ids < (k + 1) * per)]
        assert np.all(np.diff(mine) > 0)
    assert np.count_nonzero(np.diff(ids // per)) > threads  # they did interleave


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=40), st.integers(0, 3))
def test_c_delta_encoder_equals_the_numpy_one(values: list[int], scale: int) -> None:
    col = np.array(values, dtype=np.int64)
    small = np.cumsum(np.array(values, dtype=np.int64) % (1 << (8 * (1 << scale) - 2)))  # each width
    for c in (col, small):
        assert _tsc.narrow_deltas(c) == narrow_deltas_numpy(c)
    with pytest.raises(TypeError, match="expected int64 values"):
        _tsc.narrow_deltas(np.zeros(3, np.float64))
