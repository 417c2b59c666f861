"""The feasible set of affine clock relations allowed by a set of probes.

A relation maps one domain's continuous counter u^src to another's:
u^dst = a + b * u^src, b > 0. Each probe bracket gives two linear
constraints on (a, b) (see docs/sync.md for the derivation, counter
quantisation included). The set of (a, b) meeting all of them is a convex
polygon; translation needs only its vertices, since the extremes of any
linear function of (a, b) lie there.

Coordinates are centred for conditioning: u^dst = c0 + alpha + (r0 + gamma / scale) * (u^src - x0),
with integers c0, x0 near the data, r0 a rate estimate and scale the span of
the probes, so alpha and gamma are both a few cycles to a few thousand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.spatial import HalfspaceIntersection


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
        if dst_init is not None:
            i, j, k = dst_init
            xs += [j + 1, j]  # F(j + 1) >= i ; F(j) <= k + 1
            vs += [i, k + 1]
            ss += [np.ones(len(i), np.int8), -np.ones(len(i), np.int8)]
        if src_init is not None:
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
    """Vertices of the feasible (a, b) set in centred coordinates."""

    x0: int
    c0: int
    r0: float
    scale: float
    alpha: np.ndarray  # float64 per vertex
    rate: np.ndarray  # float64 per vertex: r0 + gamma / scale
    slack: float  # Chebyshev radius of the polygon (in alpha/gamma units): how far from crossing

    @property
    def rate_range(self) -> tuple[float, float]:
        return float(self.rate.min()), float(self.rate.max())

    def value_range(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """min and max of F(y) - c0 over the polygon (float64 arrays)."""
        dy = (np.asarray(y, np.int64) - self.x0).astype(np.float64)
        vals = self.alpha[:, None] + self.rate[:, None] * dy[None, :]
        return vals.min(axis=0), vals.max(axis=0)


def feasible_polygon(c: Constraints, x0: int, c0: int, r0: float) -> Polygon:
    """The polygon of relations meeting every constraint; AssumptionViolated when it is empty."""
    dx = (c.x - x0).astype(np.float64)
    dv = (c.v - c0).astype(np.float64)
    span = float(c.x.max() - c.x.min())
    if span <= 0:
        raise ValueError("probes at a single instant cannot fix a rate")
    scale = span
    s = c.sense.astype(np.float64)
    # F >= v  <=>  -alpha - gamma*dx/scale <= r0*dx - dv ;  F <= v  <=>  alpha + gamma*dx/scale <= dv - r0*dx
    A = np.column_stack([-s, -s * dx / scale])
    b = s * (r0 * dx - dv)
    norms = np.hypot(A[:, 0], A[:, 1])
    # Chebyshev centre: the interior point HalfspaceIntersection needs, and the emptiness test.
    res = linprog(
        c=[0.0, 0.0, -1.0],
        A_ub=np.column_stack([A, norms]),
        b_ub=b,
        bounds=[(None, None), (None, None), (None, 1e12)],
        method="highs",
    )
    if res.status == 2 or (res.status == 0 and res.x[2] <= 1e-9):
        raise AssumptionViolated(
            "the probes admit no affine relation (upper and lower hull lines cross): "
            "a clock jumped, drifted non-linearly, or a stamp is wrong"
        )
    if res.status != 0 or res.x[2] >= 1e11:
        raise ValueError(f"cannot bound the relation from these probes ({res.message})")
    centre = res.x[:2]
    hs = HalfspaceIntersection(np.column_stack([A, -b]), centre)
    pts = hs.intersections
    alpha = pts[:, 0]
    rate = r0 + pts[:, 1] / scale
    return Polygon(int(x0), int(c0), float(r0), scale, alpha.copy(), rate.copy(), float(res.x[2]))
