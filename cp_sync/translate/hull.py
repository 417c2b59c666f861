"""The feasible set of affine clock relations allowed by a set of probes, in exact arithmetic.

A relation maps one domain's continuous counter u^src to another's:
u^dst = a + b * u^src, b > 0. Each probe bracket gives two linear
constraints on (a, b) (see docs/sync.md for the derivation, counter
quantisation included). The set of (a, b) meeting all of them is a convex
polygon; translation needs only its vertices, since the extremes of any
linear function of (a, b) lie there.

Coordinates are local: u^dst = c0 + alpha + b * (u^src - x0), with integers
c0, x0 near the data, so every constraint has integer coefficients and the
vertices are exact rationals (``fractions.Fraction``). Floating point enters
only when the vertices are handed to the translation kernel, which pads its
result by an error term that scales with the magnitudes involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

Vertex = tuple[Fraction, Fraction]  # (alpha, b)
_BOX_ALPHA = Fraction(2**80)  # far beyond any counter: a vertex on the box means the set is unbounded
_BOX_RATE = Fraction(2**40)


class AssumptionViolated(ValueError):
    """No affine relation fits every probe: the upper and lower hull lines cross."""


@dataclass(frozen=True)
class Constraints:
    """Linear constraints F(x) >= v (sense +1) or F(x) <= v (sense -1) on F(x) = a + b x."""

    x: np.ndarray  # int64, src-domain counter values
    v: np.ndarray  # int64, dst-domain counter values
    sense: np.ndarray  # int8, +1 or -1

    @staticmethod
    def from_probes(
        dst_init: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
        src_init: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    ) -> Constraints:
        """Constraints from probes initiated by dst (c_i, c_j, c_k with c_j in src) and by src."""
        xs, vs, ss = [], [], []
        if dst_init is not None and len(dst_init[0]):
            i, j, k = dst_init
            xs += [j + 1, j]  # F(j + 1) >= i ; F(j) <= k + 1
            vs += [i, k + 1]
            ss += [np.ones(len(i), np.int8), -np.ones(len(i), np.int8)]
        if src_init is not None and len(src_init[0]):
            i, j, k = src_init
            xs += [i, k + 1]  # F(i) <= j + 1 ; F(k + 1) >= j
            vs += [j + 1, j]
            ss += [-np.ones(len(i), np.int8), np.ones(len(i), np.int8)]
        if not xs:
            raise ValueError("no probes")
        return Constraints(
            np.concatenate(xs).astype(np.int64), np.concatenate(vs).astype(np.int64), np.concatenate(ss)
        )


@dataclass(frozen=True)
class Polygon:
    """Vertices of the feasible (alpha, b) set around the local origin (x0, c0), exact and as float64."""

    x0: int
    c0: int
    alpha_q: tuple[Fraction, ...]
    rate_q: tuple[Fraction, ...]
    alpha: np.ndarray  # float64 per vertex (nearest to the exact value)
    rate: np.ndarray  # float64 per vertex

    @property
    def rate_range(self) -> tuple[float, float]:
        return float(self.rate.min()), float(self.rate.max())

    def value_range(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """min and max of F(y) - c0 over the polygon (float64 arrays)."""
        dy = (np.asarray(y, np.int64) - self.x0).astype(np.float64)
        vals = self.alpha[:, None] + self.rate[:, None] * dy[None, :]
        return vals.min(axis=0), vals.max(axis=0)

    def exact_range(self, y: int) -> tuple[Fraction, Fraction]:
        """min and max of F(y) - c0 over the polygon, exactly."""
        vals = [a + b * (y - self.x0) for a, b in zip(self.alpha_q, self.rate_q, strict=True)]
        return min(vals), max(vals)


def _cross(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _chain(points: list[tuple[int, int]], upper: bool) -> list[tuple[int, int]]:
    """The upper (or lower) convex chain of integer points, exactly (monotone chain)."""
    out: list[tuple[int, int]] = []
    for p in points:
        while len(out) >= 2 and (
            _cross(out[-2], out[-1], p) >= 0 if upper else _cross(out[-2], out[-1], p) <= 0
        ):
            out.pop()
        out.append(p)
    return out


def _relevant(c: Constraints, x0: int, c0: int) -> list[tuple[int, int, int]]:
    """(dx, dv, sense) of the constraints that can bound the set: the hull chains of each side.

    A line above every lower point is above their upper hull and conversely, so only the
    upper chain of the F >= v points and the lower chain of the F <= v points matter.
    """
    dx = (c.x - x0).tolist()
    dv = (c.v - c0).tolist()
    sense = c.sense.tolist()
    lower = sorted({(x, v) for x, v, s in zip(dx, dv, sense, strict=True) if s > 0})
    upper = sorted({(x, v) for x, v, s in zip(dx, dv, sense, strict=True) if s < 0})
    out = [(x, v, 1) for x, v in _chain(lower, upper=True)]
    out += [(x, v, -1) for x, v in _chain(upper, upper=False)]
    return out


def _clip(poly: list[Vertex], dx: int, dv: int, s: int) -> list[Vertex]:
    """The part of convex polygon ``poly`` where s * (alpha + b dx - dv) >= 0 (closed), exactly."""
    out: list[Vertex] = []
    n = len(poly)
    g = [s * (a + b * dx - dv) for a, b in poly]
    for m in range(n):
        p, q = poly[m], poly[(m + 1) % n]
        gp, gq = g[m], g[(m + 1) % n]
        if gp >= 0:
            out.append(p)
        if (gp > 0 > gq) or (gp < 0 < gq):
            t = gp / (gp - gq)
            out.append((p[0] + (q[0] - p[0]) * t, p[1] + (q[1] - p[1]) * t))
    dedup: list[Vertex] = []
    for v in out:
        if not dedup or dedup[-1] != v:
            dedup.append(v)
    while len(dedup) > 1 and dedup[0] == dedup[-1]:
        dedup.pop()
    return dedup


def exact_vertices(c: Constraints, x0: int, c0: int) -> list[Vertex]:
    """Exact vertices of {(alpha, b): b >= 0, every constraint}; empty when no relation fits."""
    poly: list[Vertex] = [
        (-_BOX_ALPHA, Fraction(0)),
        (_BOX_ALPHA, Fraction(0)),
        (_BOX_ALPHA, _BOX_RATE),
        (-_BOX_ALPHA, _BOX_RATE),
    ]
    for dx, dv, s in _relevant(c, x0, c0):
        poly = _clip(poly, dx, dv, s)
        if not poly:
            break
    return poly


def feasible_polygon(c: Constraints, x0: int, c0: int, r0: float | None = None) -> Polygon:
    """The polygon of relations meeting every constraint; AssumptionViolated when it is empty.

    ``r0`` (a rate estimate) is accepted for callers of the earlier float version and not needed.
    """
    del r0
    if int(c.x.max()) == int(c.x.min()):
        raise ValueError("probes at a single instant cannot fix a rate")
    verts = exact_vertices(c, int(x0), int(c0))
    if not verts:
        raise AssumptionViolated(
            "the probes admit no affine relation (upper and lower hull lines cross): "
            "a clock jumped, drifted non-linearly, or a stamp is wrong"
        )
    if any(abs(a) == _BOX_ALPHA or b == _BOX_RATE or b == 0 for a, b in verts):
        raise ValueError("cannot bound the relation from these probes (they do not bracket it on both sides)")
    aq = tuple(a for a, _ in verts)
    bq = tuple(b for _, b in verts)
    return Polygon(
        int(x0),
        int(c0),
        aq,
        bq,
        np.array([float(a) for a in aq]),
        np.array([float(b) for b in bq]),
    )


def consistent(c: Constraints, x0: int, c0: int) -> bool:
    """Whether some affine increasing relation meets every constraint (exact)."""
    return bool(exact_vertices(c, int(x0), int(c0)))
