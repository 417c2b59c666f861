"""The hull's vertices are exact, and the float translation covers the exact interval, for long windows.

Against an independent brute force in ``fractions.Fraction`` (every pair of constraint lines, kept
when it meets every constraint), over windows of 1 hour, 7 days and 30 days at 2.6 GHz.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from cp_sync.compare.synthetic import Paths, synth_phases
from cp_sync.translate.hull import feasible_polygon
from cp_sync.translate.phase_spans import hull_constraints, pair_phases
from cp_sync.translate.relation import STATUSES
from cp_sync.translate.translator import Translator
from native_tsc.domain import make_virtual

HZ = 2_600_000_000
T0 = 7 * 10**14
WINDOWS = {"1 hour": 3600 * HZ, "7 days": 7 * 86400 * HZ, "30 days": 30 * 86400 * HZ}


def _brute_vertices(cons, x0: int, c0: int) -> list[tuple[Fraction, Fraction]]:
    """Every intersection of two constraint lines that meets every constraint (exact)."""
    lines = list(zip((cons.x - x0).tolist(), (cons.v - c0).tolist(), cons.sense.tolist(), strict=True))
    out = []
    for (x1, v1, _), (x2, v2, _) in combinations(lines, 2):
        if x1 == x2:
            continue
        b = Fraction(v2 - v1, x2 - x1)
        a = v1 - b * x1
        if all(s * (a + b * x - v) >= 0 for x, v, s in lines):
            out.append((a, b))
    return out


def _setup(window: int, seed: int):
    rng = np.random.default_rng(seed)
    ref = make_virtual("ref", "0", 0)
    x = make_virtual("x", "-321.5", 4 * 10**15)
    paths = Paths(fwd=(8_000, 60_000), back=(9_000, 30_000), outlier_p=0.1)
    table = synth_phases([ref, x], [T0, T0 + window], 8, rng, paths)
    return ref, x, table


@pytest.mark.parametrize("label", list(WINDOWS))
def test_vertices_are_exact_and_consistent_probes_are_accepted(label: str) -> None:
    ref, x, table = _setup(WINDOWS[label], 5)
    phases = pair_phases(table, x.domain, ref.domain)
    cons = hull_constraints(phases)
    x0, c0 = int(cons.x.min()), int(cons.v.min())
    poly = feasible_polygon(cons, x0, c0)  # no false refusal, however long the window
    brute = _brute_vertices(cons, x0, c0)
    assert brute and set(zip(poly.alpha_q, poly.rate_q, strict=True)) <= set(brute)
    w = WINDOWS[label]
    for y in np.linspace(x0 - 2 * w, x0 + 3 * w, 41).astype(np.int64).tolist():
        vals = [a + b * (y - x0) for a, b in brute]
        assert poly.exact_range(y) == (min(vals), max(vals))
    tr = Translator(table, ref.domain)
    rel = tr.relation(x.domain, ref.domain, "hull")
    assert rel is not None and rel.spans is not None and not rel.spans.drift.any()


@pytest.mark.parametrize("label", list(WINDOWS))
def test_float_translation_covers_the_exact_interval(label: str) -> None:
    w = WINDOWS[label]
    ref, x, table = _setup(w, 9)
    tr = Translator(table, ref.domain)
    n = 200
    rng = np.random.default_rng(1)
    raw = T0 + rng.integers(-2 * w, 3 * w, n)
    ys = np.array([ref.apply(int(t)) for t in raw], np.int64)  # start on the reference, end in x
    ye = np.array([x.apply(int(t) + 1000) for t in raw], np.int64)
    for method in ("minrtt", "hull"):
        (t,) = tr.translate(ys, np.array(["ref"] * n), ye, np.array(["x"] * n), (method,))
        spans = tr.relation("x", "ref", method).spans
        assert spans is not None
        poly = spans.polygons[0]
        assert poly is not None
        for k in range(n):
            # The exact interval of the rule: floor(F(u)), u in [y, y + 1), in (min F(y) - 1, max F(y + 1)).
            lo_f, _ = poly.exact_range(int(ye[k]))
            _, hi_f = poly.exact_range(int(ye[k]) + 1)
            lo = poly.c0 + lo_f - 1 - int(ys[k])
            hi = poly.c0 + hi_f - int(ys[k])
            got_lo = Fraction(t.duration[k]) - Fraction(t.bound[k])
            got_hi = Fraction(t.duration[k]) + Fraction(t.bound[k])
            assert got_lo <= lo and got_hi >= hi, (method, k)
            # ... and not much wider: per side the fixed 0.001 cycles plus 2e-15 of the magnitudes the
            # evaluation went through (a few times the distance from the polygon's origin).
            slack = (lo - got_lo) + (got_hi - hi)
            dy = abs(int(ye[k]) - poly.x0) + 1000
            assert slack <= Fraction(2, 1000) + Fraction(2.4e-14) * dy, (method, k)
        st = {STATUSES[s] for s in t.status}
        assert st <= {"ok", "extrapolated"}
