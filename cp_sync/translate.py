"""Translation of stamps between TSC domains with an error bound and a status per record.

Relations between domains come from the sync table's probes over any number
of phases (cp_sync.phase_spans): each record is translated with the relation
of the span between the two phases that bracket its stamp, by one of two
methods that share the same evaluation:

* ``minrtt`` (the paper's two-point method): the MinRTT probe of each of the
  span's two phases, from whichever direction has the smaller MinRTT;
* ``hull``: every probe of the span's two phases, both directions (the
  convex-hull / LP bound: never looser than ``minrtt``).

Each relation is the exact polygon of affine maps its probes allow
(cp_sync.hull). Per record the scenario decides how the two stamps are
combined (docs/sync.md derives every formula): 0 both stamps on the
reference, 1 both on one other domain (the rate error only, 2 d/D e), 2 one on
the reference (the value error, e), 3 two other domains (the best of the
direct relation and the route through the reference: about e). ``naive``
translates each end to the reference on its own (2e), the baseline the paper
improves on. The estimate is the centre of the interval the truth must lie in
and the bound its half-width.

Every record gets a status (STATUSES): ``ok`` where the bound is guaranteed
under the model (each clock affine over the span, checked against the
neighbouring spans), else the reason; a record is refused alone, never the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from cp_store.location import Location
from cp_sync.hull import Polygon
from cp_sync.phase_spans import PairSpans, PhaseProbes, fit_spans, pair_phases, span_cover, span_drift
from cp_sync.record_points import read_points
from cp_sync.sync_table import minrtt
from native_tsc.stamp_columns import node_column, tsc_column

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


# -- kernels -------------------------------------------------------------------------------------
# Relations are packed into arrays (each relation's spans flat, vertices padded per span) and every
# record is translated in one pass: per record, its (start domain, end domain) group picks the rule
# and relations, and each stamp picks its span by binary search over the relation's phase edges.

K_NONE, K_REF, K_SAME, K_REF_START, K_REF_END, K_TWO, K_NAIVE = -1, 0, 1, 2, 3, 4, 5


@njit(cache=True, inline="always")
def _locate(edges, RI, r, y):
    """(span, extrapolated) of stamp y among relation r's spans (edges RI[r, 2] .. RI[r, 2] + RI[r, 1]).

    RI[r, 3] remembers the last span found: records mostly come in time order, so it usually holds.
    """
    e0, n, lo = RI[r, 2], RI[r, 1], RI[r, 3]
    ext = 0
    if y < edges[e0] or y > edges[e0 + n]:
        ext = 1
    if not (edges[e0 + lo] <= y <= edges[e0 + lo + 1]):
        # The last of the first n edges at or before y (0 if none): a binary search without
        # branches on the data.
        lo = 0
        size = n
        while size > 1:
            half = size >> 1
            lo += half * (edges[e0 + lo + half] <= y)
            size -= half
        RI[r, 3] = lo
    return lo, ext


@njit(cache=True, inline="always")
def _range(SI, AL, RT, s, y):
    dy = float(y - SI[s, 0])
    lo = AL[s, 0] + RT[s, 0] * dy
    hi = lo
    for v in range(1, SI[s, 2]):
        val = AL[s, v] + RT[s, v] * dy
        lo = min(lo, val)
        hi = max(hi, val)
    return lo, hi, abs(dy)


# The relation arrays (see _pack): RI per relation (first span, spans, first edge, last span found),
# edges, SI per span
# (x0, c0, vertices, status, cover kind), SF per span (min rate, max rate, max |alpha|, cover spread),
# AL and RT the vertices.


@njit(cache=True, inline="always")
def _stamp(RI, edges, SI, SF, AL, RT, r, y):
    # The dst reading at the instant of stamp y (relative to the span's c0):
    # floor(F(u)) with u in [y, y + 1) lies in (min F(y) - 1, max F(y + 1)), widened by the cover.
    sp, ext = _locate(edges, RI, r, y)
    s = RI[r, 0] + sp
    lo, _, dy = _range(SI, AL, RT, s, y)
    _, hi, _ = _range(SI, AL, RT, s, y + 1)
    a = _allow(RI, edges, SI, SF, r, sp, y)
    return lo - 1.0 - a, hi + a, SI[s, 1], max(ext, SI[s, 3]), (dy + 1.0) * SF[s, 1] + SF[s, 2] + a


@njit(cache=True, inline="always")
def _allow(RI, edges, SI, SF, r, sp, y):
    """How far a value at stamp y may move off span sp's relation through a rate change its
    neighbours cannot reveal (cp_sync.phase_spans.span_cover)."""
    s = RI[r, 0] + sp
    c = SI[s, 4]
    w = 0.0
    if c != 0:
        xk = edges[RI[r, 2] + sp]
        xk1 = edges[RI[r, 2] + sp + 1]
        if c == 1:
            w = max(float(y - xk), 0.0) * max(float(xk1 - y), 0.0) / float(xk1 - xk)
        elif c == 2:
            w = max(float(xk1 - y), 0.0)
        else:
            w = max(float(y - xk), 0.0)
    return SF[s, 3] * w


@njit(cache=True, inline="always")
def _rates(RI, edges, SI, SF, r, ya, yb):
    """Rate range of relation r over every span that [ya, yb] (src counter) touches, its status, and
    the cycles a first or last span's cover adds to a duration there."""
    e0, n = RI[r, 2], RI[r, 1]
    s0, x_a = _locate(edges, RI, r, ya)
    if yb <= edges[e0 + s0 + 1]:  # the usual case, a duration within one span: no second search
        s1 = s0
        x_b = 1 if yb < edges[e0] or yb > edges[e0 + n] else 0
    else:
        s1, x_b = _locate(edges, RI, r, yb)
    b = RI[r, 0]
    lo = SF[b + s0, 0]
    hi = SF[b + s0, 1]
    st = max(x_a, x_b)
    extra = 0.0
    for sp in range(s0, s1 + 1):
        lo = min(lo, SF[b + sp, 0])
        hi = max(hi, SF[b + sp, 1])
        st = max(st, SI[b + sp, 3])
        if SI[b + sp, 4] >= 2:
            extra = max(extra, _end_cover(edges, e0 + sp, SI[b + sp, 4], SF[b + sp, 3], s0 == s1, ya, yb))
    return lo, hi, st, extra


@njit(cache=True, inline="always")
def _end_cover(edges, e, kind, spread, inside, ya, yb):
    """The cycles one rate change in a first (kind 2) or last (kind 3) span adds to a duration [ya, yb].

    At most spread * T (T the span). Within the span the change at c leaves the neighbour's rate on
    the far side of c, and the near side's rate differs from it by at most spread * T / (c - x0) (first
    span; (x1 - c) in the last), over at most the part of [ya, yb] on that side: so the duration moves
    by at most spread * T * (yb - ya) / (yb - x0), or / (x1 - ya) (docs/sync.md, "Drift")."""
    x0 = float(edges[e])
    x1 = float(edges[e + 1])
    full = spread * (x1 - x0)
    if not inside or ya < x0 or yb > x1:
        return full
    den = float(yb) - x0 if kind == 2 else x1 - float(ya)
    if den <= 0.0:
        return 0.0
    return min(full, full * float(yb - ya) / den)


@njit(cache=True, inline="always")
def _mul_range(alo, ahi, blo, bhi):
    p1, p2, p3, p4 = alo * blo, alo * bhi, ahi * blo, ahi * bhi
    return min(min(p1, p2), min(p3, p4)), max(max(p1, p2), max(p3, p4))


@njit(cache=True, inline="always")
def _naive(RI, edges, SI, SF, AL, RT, a, b, ys, ye):
    """Both ends translated to the reference on their own (relations a for the start, b for the end)."""
    slo, shi, cs, sts, ms = _stamp(RI, edges, SI, SF, AL, RT, a, ys)
    elo, ehi, ce, ste, me = _stamp(RI, edges, SI, SF, AL, RT, b, ye)
    shift = float(ce - cs)
    return shift + elo - shi, shift + ehi - slo, max(sts, ste), ms + me + abs(shift)


@njit(cache=True, inline="always")
def _direct(RI, edges, SI, SF, AL, RT, a, b, ys, ye):
    """Two other domains: the start carried into the end's counter (a), times the end's rate (b)."""
    sp, ext = _locate(edges, RI, a, ys)
    s = RI[a, 0] + sp
    glo, _, dy = _range(SI, AL, RT, s, ys)
    _, ghi, _ = _range(SI, AL, RT, s, ys + 1)
    a_s = _allow(RI, edges, SI, SF, a, sp, ys)
    glo -= a_s
    ghi += a_s
    base = float(ye - SI[s, 1])
    dlo = base - ghi
    dhi = base + 1.0 - glo
    start = ye
    if glo == glo and abs(glo) < 4e18:
        start = SI[s, 1] + np.int64(glo)
    blo, bhi, st, extra = _rates(RI, edges, SI, SF, b, min(start, ye), max(start, ye))
    lo, hi = _mul_range(blo, bhi, dlo, dhi)
    mag = (dy + 1.0) * SF[s, 1] + SF[s, 2] + abs(base) + (abs(dlo) + abs(dhi)) * bhi + a_s
    return lo - 1.0 - extra, hi + 1.0 + extra, max(max(ext, SI[s, 3]), st), mag


@njit(cache=True, inline="always")
def _two(RI, edges, SI, SF, AL, RT, a, b, c, ys, ye):
    """Best of the valid routes between two other domains: direct (a, then b) and through the reference."""
    lo1, hi1, st1, m1 = np.nan, np.nan, 99, 0.0
    lo2, hi2, st2, m2 = np.nan, np.nan, 99, 0.0
    if a >= 0:
        lo1, hi1, st1, m1 = _direct(RI, edges, SI, SF, AL, RT, a, b, ys, ye)
    if c >= 0:
        lo2, hi2, st2, m2 = _naive(RI, edges, SI, SF, AL, RT, c, b, ys, ye)
    if st2 < st1:
        return lo2, hi2, st2, m2
    if st1 < st2:
        return lo1, hi1, st1, m1
    lo, hi = max(lo1, lo2), min(hi1, hi2)  # both valid under the same assumptions: so is their intersection
    if lo > hi:  # they exclude each other: some assumption failed
        return lo1, hi1, max(st1, 2), m1
    return lo, hi, st1, max(m1, m2)


# No reference counting in the kernel: it allocates nothing, and counting every array the inlined
# helpers touch (atomic increments per use) made it several times slower.
@njit(cache=True, _nrt=False)  # type: ignore[call-overload]  # numba's option, not in its stubs
def _translate_kernel(
    ys,
    ye,
    sc,
    ec,
    n_end,
    kind,
    ra,
    rb,
    rc,
    RI,
    edges,
    SI,
    SF,
    AL,
    RT,
    dlo_s,
    dhi_s,
    dlo_e,
    dhi_e,
    mid,
    half,
    status,
):
    for n in range(ys.shape[0]):
        g = sc[n] * n_end + ec[n]
        k = kind[g]
        a = ra[g]
        b = rb[g]
        st = 0
        mag = 0.0
        if ys[n] < dlo_s[sc[n]] or ys[n] > dhi_s[sc[n]] or ye[n] < dlo_e[ec[n]] or ye[n] > dhi_e[ec[n]]:
            st = 3
        if k == 0:  # both on the reference: exact
            lo = float(ye[n] - ys[n])
            hi = lo
        elif k == 1:  # one other domain: d in (y_e - y_s - 1, y_e - y_s + 1) times its rate, +-1 for floors
            d = float(ye[n] - ys[n])
            blo, bhi, s1, extra = _rates(RI, edges, SI, SF, a, min(ys[n], ye[n]), max(ys[n], ye[n]))
            lo, hi = _mul_range(blo, bhi, d - 1.0, d + 1.0)
            lo -= 1.0 + extra
            hi += 1.0 + extra
            st = max(st, s1)
            mag = (abs(d) + 1.0) * bhi
        elif k == 2:  # start on the reference, end translated
            elo, ehi, c, s1, mag = _stamp(RI, edges, SI, SF, AL, RT, a, ye[n])
            base = float(c - ys[n])
            lo = base + elo
            hi = base + ehi
            st = max(st, s1)
            mag += abs(base)
        elif k == 3:  # start translated, end on the reference
            slo, shi, c, s1, mag = _stamp(RI, edges, SI, SF, AL, RT, a, ys[n])
            base = float(ye[n] - c)
            lo = base - shi
            hi = base - slo
            st = max(st, s1)
            mag += abs(base)
        elif k == 4:
            lo, hi, s1, mag = _two(RI, edges, SI, SF, AL, RT, a, b, rc[g], ys[n], ye[n])
            st = max(st, s1)
        elif k == 5:
            lo, hi, s1, mag = _naive(RI, edges, SI, SF, AL, RT, a, b, ys[n], ye[n])
            st = max(st, s1)
        else:
            lo = np.nan
            hi = np.nan
            st = 4
        mid[n] = (lo + hi) * 0.5
        half[n] = (hi - lo) * 0.5 + 1e-3 + 2e-15 * (mag + abs(lo) + abs(hi))
        status[n] = st


def _codes(values: Any) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes (int32) and names of a column of domain ids; a missing id is the name ''."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        arr = values
    else:
        arr = pa.array(np.asarray(values, dtype=str))
    if isinstance(arr, pa.ChunkedArray):
        if pa.types.is_dictionary(arr.type):  # chunks may carry different dictionaries
            arr = arr.cast(arr.type.value_type)
        arr = arr.combine_chunks()
    if arr.null_count:  # a record without a domain id gets no relation, alone
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(arr.type.value_type)
        arr = pc.fill_null(arr, "")
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    names = [str(x) for x in arr.dictionary.to_pylist()]
    return arr.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), names


# -- translation ---------------------------------------------------------------------------------


@dataclass
class Translation:
    """Per-record results of one method: interval centre and half-width in reference cycles, status."""

    method: str
    index: np.ndarray  # record positions (every record)
    scenario: np.ndarray  # int8
    duration: np.ndarray  # float64 cycles
    bound: np.ndarray  # float64 cycles
    status: np.ndarray  # int8 code into STATUSES


def _domain_ranges(table: pa.Table, margin: float) -> dict[str, tuple[int, int]]:
    """Per domain: the counter range its stamps may plausibly lie in (probed range widened by margin)."""
    parts = [
        (table["initiator"], table["c_i"]),
        (table["initiator"], table["c_k"]),
        (table["responder"], table["c_j"]),
    ]
    t = pa.concat_tables([pa.table({"d": d, "c": c}) for d, c in parts])
    g = t.group_by("d").aggregate([("c", "min"), ("c", "max")])
    out = {}
    for d, lo, hi in zip(g["d"].to_pylist(), g["c_min"].to_pylist(), g["c_max"].to_pylist(), strict=True):
        w = int(margin * (hi - lo))
        out[str(d)] = (max(lo - w, -(2**63)), min(hi + w, 2**63 - 1))
    return out


@dataclass
class Translator:
    """Fits relations lazily from one sync table and translates stamp pairs to a reference domain.

    ``stamp_margin``: a stamp more than this many probed windows outside its domain's probed
    counter range is ``stamp_domain`` (implausible for the domain it is labelled with).
    """

    table: pa.Table
    reference: str
    stamp_margin: float = STAMP_MARGIN
    relations: dict[tuple[str, str, str], Relation] = field(default_factory=dict)
    violations: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _phases: dict[tuple[str, str], list[PhaseProbes]] = field(default_factory=dict, repr=False)
    _drift: dict[tuple[str, str], np.ndarray] = field(default_factory=dict, repr=False)
    _cover: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False
    )
    _ranges: dict[str, tuple[int, int]] | None = field(default=None, repr=False)

    def relation(self, src: str, dst: str, method: str) -> Relation | None:
        """The relation src -> dst (None, with the reason in ``violations``, when there is none)."""
        key = (src, dst, method)
        if key not in self.relations and key not in self.violations:
            try:
                if (src, dst) not in self._phases:
                    self._phases[(src, dst)] = pair_phases(self.table, src, dst)
                phases = self._phases[(src, dst)]
                pair = (min(src, dst), max(src, dst))
                if pair not in self._drift and len(phases) >= 2:
                    self._drift[pair] = span_drift(phases)
                if (src, dst) not in self._cover and len(phases) >= 2:
                    self._cover[(src, dst)] = span_cover(phases)
                drift, cover = self._drift.get(pair), self._cover.get((src, dst))
                spans = fit_spans(self.table, src, dst, method, phases, drift, cover)
                self.relations[key] = _relation(spans, phases)
            except ValueError as e:
                self.violations[key] = str(e)
        return self.relations.get(key)

    def drift_notes(self) -> dict[str, list[str]]:
        """Spans found not affine, per relation fitted."""
        return {
            f"{r.method} {r.src} -> {r.dst}": list(r.spans.notes)
            for r in self.relations.values()
            if r.spans is not None and r.spans.notes
        }

    def _plan(self, method: str, s: str, e: str) -> tuple[int, int, list[Relation | None]]:
        """(kind, scenario, [relation a, b, c]) for records from domain s to domain e."""
        ref = self.reference
        if s == ref and e == ref:
            return K_REF, 0, [None, None, None]
        scen = 1 if s == e else (2 if ref in (s, e) else 3)
        base = "minrtt" if method == "naive" else method
        if s == ref or e == ref:
            r = self.relation(e if s == ref else s, ref, base)
            return (K_NONE if r is None else (K_REF_START if s == ref else K_REF_END)), scen, [r, None, None]
        if method == "naive":
            a, b = self.relation(s, ref, base), self.relation(e, ref, base)
            return (K_NONE if a is None or b is None else K_NAIVE), scen, [a, b, None]
        if s == e:
            r = self.relation(s, ref, method)
            return (K_NONE if r is None else K_SAME), scen, [r, None, None]
        g, r, via = self.relation(s, e, method), self.relation(e, ref, method), self.relation(s, ref, method)
        if r is None or (g is None and via is None):
            return K_NONE, scen, [None, None, None]
        return K_TWO, scen, [g, r, via]

    def _domain_bounds(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self._ranges is None:
            self._ranges = _domain_ranges(self.table, self.stamp_margin)
        lo = np.array([self._ranges.get(n, (-(2**63), 2**63 - 1))[0] for n in names], np.int64)
        hi = np.array([self._ranges.get(n, (-(2**63), 2**63 - 1))[1] for n in names], np.int64)
        return lo, hi

    def translate(
        self, ys: np.ndarray, ds: Any, ye: np.ndarray, de: Any, methods: tuple[str, ...] = METHODS
    ) -> list[Translation]:
        """Durations end - start in reference cycles, per method; ds/de are domain ids per record."""
        ys = np.ascontiguousarray(ys, np.int64)
        ye = np.ascontiguousarray(ye, np.int64)
        s_codes, s_names = _codes(ds)
        e_codes, e_names = _codes(de)
        dlo_s, dhi_s = self._domain_bounds(s_names)
        dlo_e, dhi_e = self._domain_bounds(e_names)
        out = []
        for method in methods:
            if method not in METHODS:
                raise ValueError(f"unknown method {method!r}: choose from {', '.join(METHODS)}")
            kind, scen, rels, packed = self._groups(method, s_names, e_names)
            RI, edges, SI, SF, AL, RT = _pack(packed)
            mid, half = np.empty(len(ys)), np.empty(len(ys))
            status = np.empty(len(ys), np.int8)
            _translate_kernel(
                ys, ye, s_codes, e_codes, len(e_names), kind, rels[0], rels[1], rels[2],
                RI, edges, SI, SF, AL, RT, dlo_s, dhi_s, dlo_e, dhi_e, mid, half, status,
            )  # fmt: skip
            rec_scen = scen[s_codes.astype(np.int64) * len(e_names) + e_codes]
            out.append(Translation(method, np.arange(len(ys)), rec_scen, mid, half, status))
        return out

    def _groups(
        self, method: str, s_names: list[str], e_names: list[str]
    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[PairSpans]]:
        """Per (start, end) domain group: kind, scenario, the packed relations' indices (-1: none)."""
        ng = len(s_names) * len(e_names)
        kind = np.full(ng, K_NONE, np.int8)
        scen = np.full(ng, -1, np.int8)
        rels = [np.full(ng, -1, np.int32) for _ in range(3)]
        packed: list[PairSpans] = []
        for si, s in enumerate(s_names):
            for ei, e in enumerate(e_names):
                g = si * len(e_names) + ei
                k, sc, chosen = self._plan(method, s, e)
                kind[g], scen[g] = k, sc
                if sc < 0:
                    scen[g] = 1 if s == e else (2 if self.reference in (s, e) else 3)
                for arr, rel in zip(rels, chosen, strict=True):
                    if rel is not None and rel.spans is not None:
                        if rel.spans not in packed:
                            packed.append(rel.spans)
                        arr[g] = packed.index(rel.spans)
        return kind, scen, rels, packed


def _pack(rels: list[PairSpans]) -> tuple[np.ndarray, ...]:
    """The kernel's relation arrays: RI per relation (first span, spans, first edge, last span found),
    the edges, SI per
    span (x0, c0, vertices, status 0 ok or 2 drift, cover kind), SF per span (min rate, max rate,
    max |alpha|, rate spread of the cover), and
    the vertices AL (alpha) and RT (rate), NaN where a span has no polygon."""
    nr = max(len(rels), 1)
    total = max(sum(len(r.polygons) for r in rels), 1)
    vmax = max([len(p.alpha) for r in rels for p in r.polygons if p is not None] + [1])
    RI = np.zeros((nr, 4), np.int64)
    RI[:, 1] = 1
    edges = np.zeros(total + nr, np.int64)
    SI = np.zeros((total, 5), np.int64)
    SI[:, 2] = 1
    SF = np.full((total, 4), np.nan)
    SF[:, 2:] = 0.0
    AL, RT = np.full((total, vmax), np.nan), np.full((total, vmax), np.nan)
    s = 0
    for i, r in enumerate(rels):
        RI[i] = (s, len(r.polygons), s + i, 0)
        edges[s + i : s + i + len(r.edges)] = r.edges
        for k, p in enumerate(r.polygons):
            SI[s, 3] = ST_DRIFT if r.drift[k] else ST_OK
            if p is not None:
                n = len(p.alpha)
                AL[s, :n], RT[s, :n] = p.alpha, p.rate
                SI[s, :3] = (p.x0, p.c0, n)
                lo, hi = p.rate_range
                if r.cover is not None and r.cover[k] and r.rates is not None and r.spread is not None:
                    lo, hi = min(lo, r.rates[k, 0]), max(hi, r.rates[k, 1])
                    SF[s, 3], SI[s, 4] = r.spread[k], r.cover[k]
                SF[s, :3] = (lo, hi, float(np.abs(p.alpha).max()))
            s += 1
    return RI, edges, SI, SF, AL, RT


def reference_hz(table: pa.Table, reference: str, reported: dict[str, float]) -> tuple[float, str]:
    """Reference counts per second from its MinRTT probes of the first and last phase (else reported)."""
    hz, source, _ = reference_hz_estimate(table, reference, reported)
    return hz, source


REPORTED_HZ_ERROR = 1e-4  # relative error assumed for a frequency an agent reported (not measured here)


def reference_hz_estimate(
    table: pa.Table, reference: str, reported: dict[str, float]
) -> tuple[float, str, float]:
    """(counts per second, source, relative error) of the reference's counter.

    From its own MinRTT probes of the first and last phase: the cycles between their sends over the
    CLOCK_MONOTONIC_RAW ns read just before each send. The relative error allowed for is both probes'
    round trips (in cycles) over the cycles between them: the ns and the counter are read a moment
    apart, and a send that waited shows in its round trip. The rate of CLOCK_MONOTONIC_RAW itself
    against true seconds cannot be seen from the probes and is not included.
    """
    own = table.filter(pc.equal(table["initiator"], reference))
    if own.num_rows:
        best = minrtt(own).sort_by("ns_i")
        if best.num_rows >= 2:
            c = _np(best, "c_i")
            ns = _np(best, "ns_i")
            rtt = _np(best, "rtt")
            if ns[-1] - ns[0] >= 10_000_000:  # 10 ms: the ns reads' jitter stays below 1e-4
                err = float(rtt[0] + rtt[-1]) / float(c[-1] - c[0])
                return float(c[-1] - c[0]) * 1e9 / float(ns[-1] - ns[0]), "minrtt", err
    if reference in reported:
        return reported[reference], "agent", REPORTED_HZ_ERROR
    raise ValueError(f"no frequency for reference domain {reference!r}: no probes from it and none reported")


def _np(t: pa.Table, col: str) -> np.ndarray:
    return t[col].to_numpy().astype(np.int64)


# -- records -------------------------------------------------------------------------------------
# read_points (cp_sync.record_points) reads them from a path or URI.


def default_reference(points: pa.Table, to_point: str) -> str:
    """The domain most end stamps were taken in."""
    counts = pc.value_counts(points[node_column(to_point)]).to_pylist()
    if not counts:
        raise ValueError("no records to translate")
    return str(max(counts, key=lambda c: (c["counts"], c["values"]))["values"])


def translate_points(
    points: pa.Table,
    sync: pa.Table,
    from_point: str,
    to_point: str,
    reference: str,
    hz: float,
    methods: tuple[str, ...] = METHODS,
    hz_error: float = 0.0,
    stamp_margin: float = STAMP_MARGIN,
) -> tuple[pa.Table, Translator]:
    """The output table: one row per record and method with duration, bound and status.

    ``bound_ns`` is ``bound_cycles`` converted at ``hz`` (the frequency's own error excluded);
    ``bound_ns_with_hz_error`` also covers a relative error ``hz_error`` of ``hz``.
    """
    ys = points[tsc_column(from_point)].to_numpy()
    ye = points[tsc_column(to_point)].to_numpy()
    ds_ = points[node_column(from_point)]
    de = points[node_column(to_point)]
    tr = Translator(sync, reference, stamp_margin)
    parts = []
    scen_dict = pa.array([SCENARIOS[k] for k in sorted(SCENARIOS)])
    status_dict = pa.array(list(STATUSES))
    to_ns = 1e9 / hz
    for res in tr.translate(ys, ds_, ye, de, methods):
        n = len(res.index)
        with_hz = (res.bound + (np.abs(res.duration) + res.bound) * hz_error) * to_ns / (1.0 - hz_error)
        parts.append(
            pa.table(
                {
                    "tuple_id": points["tuple_id"],
                    "from_point": pa.array([from_point] * n, pa.string()),
                    "to_point": pa.array([to_point] * n, pa.string()),
                    "from_domain": ds_,
                    "to_domain": de,
                    "reference": pa.array([reference] * n, pa.string()),
                    "method": pa.array([res.method] * n, pa.string()),
                    "scenario": pa.DictionaryArray.from_arrays(pa.array(res.scenario), scen_dict).cast(
                        pa.string()
                    ),
                    "status": pa.DictionaryArray.from_arrays(pa.array(res.status), status_dict).cast(
                        pa.string()
                    ),
                    "duration_cycles": pa.array(res.duration),
                    "bound_cycles": pa.array(res.bound),
                    "duration_ns": pa.array(res.duration * to_ns),
                    "bound_ns": pa.array(res.bound * to_ns),
                    "bound_ns_with_hz_error": pa.array(with_hz),
                }
            )
        )
    return pa.concat_tables(parts), tr


def translate_records(
    records_dir: str | os.PathLike[str] | Location,
    sync_dir: str | os.PathLike[str] | Location,
    from_point: str,
    to_point: str,
    reference: str | None = None,
    methods: tuple[str, ...] = METHODS,
    stamp_margin: float = STAMP_MARGIN,
) -> tuple[pa.Table, dict[str, Any]]:
    """Read records and sync tables (paths or URIs), translate, and return the output table and facts.

    Facts: reference, frequency_hz, its source and relative error (frequency_error), the relations
    that could not be formed (refused: why), the spans found not affine (drift), and the number of
    records per method and status (status_counts).
    """
    from cp_sync.sync_table import read_sync

    sync, reported = read_sync(sync_dir)
    points = read_points(records_dir, from_point, to_point)
    ref = reference or default_reference(points, to_point)
    hz, source, hz_err = reference_hz_estimate(sync, ref, reported)
    out, tr = translate_points(points, sync, from_point, to_point, ref, hz, methods, hz_err, stamp_margin)
    refused = {f"{m} {s} -> {d}": why for (s, d, m), why in sorted(tr.violations.items())}
    return out, {
        "reference": ref,
        "frequency_hz": hz,
        "frequency_source": source,
        "frequency_error": hz_err,
        "refused": refused,
        "drift": tr.drift_notes(),
        "status_counts": status_counts(out),
    }


def status_counts(out: pa.Table) -> dict[str, dict[str, int]]:
    """Records per method and status, every status listed (zero included)."""
    g = out.group_by(["method", "status"]).aggregate([("status", "count")])
    counts: dict[str, dict[str, int]] = {}
    for m, s, c in zip(
        g["method"].to_pylist(), g["status"].to_pylist(), g["status_count"].to_pylist(), strict=True
    ):
        counts.setdefault(str(m), dict.fromkeys(STATUSES, 0))[str(s)] = int(c)
    return counts
