"""Same-node durations in the first and last span: a cover that scales with the duration, still sound.

With three phases or more, a rate change inside the first (last) span is covered by adding to a
duration there what the change can move it by. That used to be spread * T whatever the duration;
it is now spread * T * d / (yb - x0) (first span) or d / (x1 - ya) (last span). The adversary
here puts the change right at the end of the duration (the worst place for that bound), with the
sharpest skew change the span's average allows, and every ``ok`` record must still hold its truth.
"""

from __future__ import annotations

import numpy as np
import pytest

from cp_sync.compare.synthetic import Drift, Paths, synth_phases
from cp_sync.translate.translator import Translator
from native_tsc.domain import make_virtual

HZ = 2_600_000_000
T0 = 10**15
WINDOW = 2 * HZ  # two seconds between the first and last of four phases


def _run(change_at: int | None, delta_ppm: float, seed: int):
    rng = np.random.default_rng(seed)
    ref = make_virtual("ref", "12.5", 3_000_000)
    b0 = make_virtual("b", "-40", -(10**13))
    b: object = b0
    if change_at is not None:
        b = Drift(b0, make_virtual("b", f"{-40 + delta_ppm:.3f}", -(10**13)), change_at)
    starts = [T0 + WINDOW * k // 3 for k in range(4)]
    table = synth_phases(
        [ref, b], starts, 20, rng, Paths((9_000, 30_000), (9_000, 30_000), gap=(1_000, 5_000))
    )
    return ref, b, starts, table


def _same_node(b, starts: list[int], rs: np.ndarray, re_: np.ndarray, ref, table, method: str):
    """(duration, bound, status) of same-node records on domain b by ``method``, and the truth."""
    ys = np.array([b.apply(int(t)) for t in rs], np.int64)
    ye = np.array([b.apply(int(t)) for t in re_], np.int64)
    truth = np.array([ref.apply(int(e)) - ref.apply(int(s)) for s, e in zip(rs, re_, strict=True)])
    names = np.array(["b"] * len(rs))
    (t,) = Translator(table, "ref").translate(ys, names, ye, names, methods=(method,))
    return t.duration, t.bound, t.status, truth


@pytest.mark.parametrize("method", ["minrtt", "hull"])
def test_short_durations_in_the_first_and_last_span_get_a_bound_that_scales_with_them(method: str) -> None:
    ref, b, starts, table = _run(None, 0.0, 1)
    rng = np.random.default_rng(2)
    span = WINDOW // 3
    # Durations of 10 us in the middle of the first and last spans (well clear of the phases).
    first = starts[0] + span // 2 + rng.integers(0, span // 4, 200)
    last = starts[2] + span // 2 + rng.integers(0, span // 4, 200)
    rs = np.concatenate([first, last])
    re_ = rs + 26_000
    duration, bound, status, truth = _same_node(b, starts, rs, re_, ref, table, method)
    assert np.all(status == 0)
    assert np.all(np.abs(duration - truth) <= bound)
    # A 10 us duration mid-span now carries a bound far below that of a half-span duration there
    # (it was spread * T for both, whatever the duration).
    full = _same_node(b, starts, rs, rs + span // 2 - 1, ref, table, method)[1]
    assert np.all(bound < 0.01 * full)


@pytest.mark.parametrize("method", ["minrtt", "hull"])
def test_a_change_at_the_worst_place_stays_inside_ok_bounds(method: str) -> None:
    span = WINDOW // 3
    rng = np.random.default_rng(7)
    wrong = 0
    checked = 0
    for k, (where, delta_ppm) in enumerate(
        (w, d) for w in ("first", "last") for d in (-50.0, 50.0, -15.0, 15.0) for _ in range(3)
    ):
        lo = T0 if where == "first" else T0 + 2 * span
        c = lo + int(rng.integers(span // 50, span - span // 50))
        ref, b, starts, table = _run(c, delta_ppm, 100 + k)
        d = rng.integers(1, max(2, (c - lo) // 2), 60)
        if where == "first":  # the duration ends at the change: all of it at the rate before
            re_ = np.full(60, c)
            rs = re_ - d
        else:  # starts at the change: all of it at the rate after
            rs = np.full(60, c)
            re_ = rs + d
        duration, bound, status, truth = _same_node(b, starts, rs, re_, ref, table, method)
        ok = status == 0
        checked += int(ok.sum())
        wrong += int(np.sum(np.abs(duration[ok] - truth[ok]) > bound[ok]))
    assert checked > 200
    assert wrong == 0
