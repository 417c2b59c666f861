"""A relation between two TSC domains: the polygon of affine maps their probes allow, over every span."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from cp_sync.translate.hull import Polygon
from cp_sync.translate.phase_spans import PairSpans, PhaseProbes, fit_spans, pair_phases

METHODS = ("minrtt", "hull", "naive")
SCENARIOS = {0: "reference", 1: "same-node", 2: "reference-node", 3: "two-nodes"}
# Worst reason wins: a record's status is the largest code of every part it used.
STATUSES = ("ok", "extrapolated", "drift", "stamp_domain", "no_relation")
ST_OK, ST_EXTRAPOLATED, ST_DRIFT, ST_STAMP_DOMAIN, ST_NO_RELATION = range(5)
_EPS = 1e-3  # fixed outward rounding of every bound (cycles)
_REL_EPS = 2e-15  # plus this times the magnitudes the float evaluation went through (about 4 roundings)
STAMP_MARGIN = 3.0  # a stamp further outside its domain's probed range than this many windows is implausible


@dataclass(frozen=True)
class Relation:
    """src -> dst relation over every span, plus the paper's two-point figures (first and last phase)."""

    src: str
    dst: str
    method: str
    polygon: Polygon | None  # the first span's
    e_before: float  # half MinRTT, first phase (dst cycles)
    e_after: float  # half MinRTT, last phase (dst cycles)
    rate: float  # the paper's r = d^dst[j,m] / d^src[j,m], first to last phase
    span_src: int  # D: src cycles between the first and last phase's MinRTT probes
    probes: int
    spans: PairSpans | None = None


def _midpoints(p: PhaseProbes) -> tuple[int, float]:
    """(src stamp, dst midpoint) of a phase's MinRTT probe."""
    d, r = p.best
    i, j, k = p.fwd if d == "fwd" else p.back
    if d == "fwd":
        return int(j[r]), (int(i[r]) + int(k[r])) / 2
    return (int(i[r]) + int(k[r])) // 2, float(j[r])


def _relation(spans: PairSpans, phases: list[PhaseProbes]) -> Relation:
    (x1, m1), (x2, m2) = _midpoints(phases[0]), _midpoints(phases[-1])
    n = sum(len(p.fwd[0]) + len(p.back[0]) for p in phases)
    if spans.method == "minrtt":
        n = len(phases)
    return Relation(
        spans.src,
        spans.dst,
        spans.method,
        spans.polygons[0],
        phases[0].e,
        phases[-1].e,
        (m2 - m1) / (x2 - x1),
        x2 - x1,
        n,
        spans,
    )


def fit_relation(table: pa.Table, src: str, dst: str, method: str) -> Relation:
    """The relation src -> dst from the probes in ``table`` by ``method`` (minrtt or hull)."""
    phases = pair_phases(table, src, dst)
    return _relation(fit_spans(table, src, dst, method, phases), phases)
