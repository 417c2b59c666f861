"""Translation of stamps between TSC domains with a strict error bound per record.

Relations between domains come from the sync table's probes, by one of two
methods that share the same evaluation:

* ``minrtt`` (the paper's two-point method): the MinRTT probe of the first and
  of the last phase, initiated by the domain translated into;
* ``hull``: every probe of the pair, both directions, every phase (the
  convex-hull / LP bound: never looser than ``minrtt``, and it refuses with
  :class:`AssumptionViolated` when no affine relation fits the probes).

Each relation is the polygon of affine maps its probes allow (cp_sync.hull).
Per record the scenario decides how the two stamps are combined (docs/sync.md
derives every formula): 0 both stamps on the reference, 1 both on one other
domain (the rate error only, 2 d/D e), 2 one on the reference (the value
error, e), 3 two other domains (their direct relation, then the rate to the
reference: about e). ``naive`` translates each end to the reference on its
own (2e), the baseline the paper improves on. The estimate is the centre of
the interval the truth must lie in and the bound its half-width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from cp_sync.hull import AssumptionViolated, Constraints, Polygon, feasible_polygon
from cp_sync.sync_table import minrtt

METHODS = ("minrtt", "hull", "naive")
SCENARIOS = {0: "reference", 1: "same-node", 2: "reference-node", 3: "two-nodes"}
_EPS = 1e-3  # outward rounding of every bound (cycles), covers float evaluation of the vertices


@dataclass(frozen=True)
class Relation:
    """src -> dst affine relation polygon plus the paper's two-point figures."""

    src: str
    dst: str
    method: str
    polygon: Polygon
    e_before: float  # half MinRTT, first phase (cycles of dst)
    e_after: float  # half MinRTT, last phase
    rate: float  # the paper's r = d^dst[j,m] / d^src[j,m]
    span_src: int  # D: src cycles between the two MinRTT receipts
    probes: int


def _pair_probes(table: pa.Table, initiator: str, responder: str) -> pa.Table:
    mask = pc.and_(pc.equal(table["initiator"], initiator), pc.equal(table["responder"], responder))
    return table.filter(mask)


def _np(t: pa.Table, col: str) -> np.ndarray:
    return t[col].to_numpy().astype(np.int64)


def _two_minrtt(t: pa.Table) -> pa.Table:
    """The MinRTT probes of the first and last phase of one initiator's probes (by its own clock)."""
    best = minrtt(t).sort_by("ns_i")
    if best.num_rows < 2:
        raise ValueError(
            f"two phases needed for {t['initiator'][0]} -> {t['responder'][0]}, found {best.num_rows}: "
            "run 'cloudprofiler sync run' before and after"
        )
    return best.take([0, best.num_rows - 1])


def fit_relation(table: pa.Table, src: str, dst: str, method: str) -> Relation:
    """The relation src -> dst from the probes in ``table`` by ``method`` (minrtt or hull)."""
    fwd = _pair_probes(table, dst, src)  # dst initiates, src stamps c_j
    if fwd.num_rows == 0:
        raise ValueError(f"no probes from {dst} to {src} in the sync table")
    two = _two_minrtt(fwd)
    i, j, k = _np(two, "c_i"), _np(two, "c_j"), _np(two, "c_k")
    e1, e2 = (k[0] - i[0]) / 2, (k[1] - i[1]) / 2
    d_src = int(j[1] - j[0])
    mid2 = int(i[1] + k[1]) - int(i[0] + k[0])  # twice the midpoint difference, exact
    if d_src <= 0:
        raise ValueError(f"the MinRTT probes of {dst} -> {src} are not in time order")
    r = mid2 / 2 / d_src
    x0, c0 = int(j[0]), int((i[0] + k[0]) // 2)
    if method == "minrtt":
        cons = Constraints.from_probes((i, j, k), None)
        n = 2
    elif method == "hull":
        back = _pair_probes(table, src, dst)
        src_init = (_np(back, "c_i"), _np(back, "c_j"), _np(back, "c_k")) if back.num_rows else None
        cons = Constraints.from_probes((_np(fwd, "c_i"), _np(fwd, "c_j"), _np(fwd, "c_k")), src_init)
        n = fwd.num_rows + back.num_rows
    else:
        raise ValueError(f"unknown method {method!r}")
    try:
        poly = feasible_polygon(cons, x0, c0, r)
    except AssumptionViolated as e:
        raise AssumptionViolated(f"{method} {src} -> {dst}: {e}") from None
    return Relation(src, dst, method, poly, float(e1), float(e2), r, d_src, n)


# -- kernels -------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _range(alpha, rate, x0, y):
    dy = float(y - x0)
    lo = alpha[0] + rate[0] * dy
    hi = lo
    for v in range(1, alpha.shape[0]):
        val = alpha[v] + rate[v] * dy
        lo = min(lo, val)
        hi = max(hi, val)
    return lo, hi


@njit(cache=True, inline="always")
def _mul_range(alo, ahi, blo, bhi):
    p1, p2, p3, p4 = alo * blo, alo * bhi, ahi * blo, ahi * bhi
    return min(min(p1, p2), min(p3, p4)), max(max(p1, p2), max(p3, p4))


@njit(cache=True)
def _k_same_node(ys, ye, bmin, bmax, lo_out, hi_out):
    # truth = floor(F(u_e)) - floor(F(u_s)), u_e - u_s in (d-1, d+1), F(u_e) - F(u_s) = b (u_e - u_s)
    for n in range(ys.shape[0]):
        d = float(ye[n] - ys[n])
        lo, hi = _mul_range(bmin, bmax, d - 1.0, d + 1.0)
        lo_out[n] = lo - 1.0
        hi_out[n] = hi + 1.0


@njit(cache=True)
def _k_ref_start(cs, ye, alpha, rate, x0, c0, lo_out, hi_out):
    # start on the reference (exact), end on X: floor(F(u_e)) in (F(y) - 1, F(y + 1))
    for n in range(cs.shape[0]):
        base = float(c0 - cs[n])
        lo, _ = _range(alpha, rate, x0, ye[n])
        _, hi = _range(alpha, rate, x0, ye[n] + 1)
        lo_out[n] = base + lo - 1.0
        hi_out[n] = base + hi


@njit(cache=True)
def _k_ref_end(ys, ce, alpha, rate, x0, c0, lo_out, hi_out):
    for n in range(ys.shape[0]):
        base = float(ce[n] - c0)
        lo, _ = _range(alpha, rate, x0, ys[n])
        _, hi = _range(alpha, rate, x0, ys[n] + 1)
        lo_out[n] = base - hi
        hi_out[n] = base - lo + 1.0


@njit(cache=True)
def _k_two_nodes(ys, ye, alpha, rate, x0, c0, bmin, bmax, lo_out, hi_out):
    # G: X -> Y carries the start into Y's counter, then Y's rate to the reference scales the duration
    for n in range(ys.shape[0]):
        glo, _ = _range(alpha, rate, x0, ys[n])
        _, ghi = _range(alpha, rate, x0, ys[n] + 1)
        base = float(ye[n] - c0)
        lo, hi = _mul_range(bmin, bmax, base - ghi, base + 1.0 - glo)
        lo_out[n] = lo - 1.0
        hi_out[n] = hi + 1.0


@njit(cache=True)
def _k_naive(ys, ye, a_s, r_s, x0_s, c0_s, exact_s, a_e, r_e, x0_e, c0_e, exact_e, lo_out, hi_out):
    # each end translated to the reference on its own, then subtracted
    shift = float(c0_e - c0_s)
    for n in range(ys.shape[0]):
        if exact_s:
            slo = float(ys[n] - c0_s)
            shi = slo
        else:
            slo, _ = _range(a_s, r_s, x0_s, ys[n])
            _, shi = _range(a_s, r_s, x0_s, ys[n] + 1)
            slo -= 1.0
        if exact_e:
            elo = float(ye[n] - c0_e)
            ehi = elo
        else:
            elo, _ = _range(a_e, r_e, x0_e, ye[n])
            _, ehi = _range(a_e, r_e, x0_e, ye[n] + 1)
            elo -= 1.0
        lo_out[n] = shift + elo - shi
        hi_out[n] = shift + ehi - slo


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype)


# -- translation ---------------------------------------------------------------------------------


@dataclass
class Translation:
    """Per-record results of one method: interval centre and half-width in reference cycles."""

    method: str
    index: np.ndarray  # record positions
    scenario: np.ndarray  # int8
    duration: np.ndarray  # float64 cycles
    bound: np.ndarray  # float64 cycles


@dataclass
class Translator:
    """Fits relations lazily from one sync table and translates stamp pairs to a reference domain."""

    table: pa.Table
    reference: str
    relations: dict[tuple[str, str, str], Relation] = field(default_factory=dict)
    violations: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def relation(self, src: str, dst: str, method: str) -> Relation | None:
        key = (src, dst, method)
        if key not in self.relations and key not in self.violations:
            try:
                self.relations[key] = fit_relation(self.table, src, dst, method)
            except AssumptionViolated as e:
                self.violations[key] = str(e)
        return self.relations.get(key)

    def translate(self, ys: np.ndarray, ds: np.ndarray, ye: np.ndarray, de: np.ndarray,
                  methods: tuple[str, ...] = METHODS) -> list[Translation]:
        """Durations end - start in reference cycles, per method; ds/de are domain ids per record."""
        ys = np.ascontiguousarray(ys, np.int64)
        ye = np.ascontiguousarray(ye, np.int64)
        pairs, inverse = np.unique(np.stack([ds.astype(str), de.astype(str)]), axis=1, return_inverse=True)
        inverse = inverse.reshape(-1)
        out = []
        for method in methods:
            idx_parts, sc_parts, dur_parts, bnd_parts = [], [], [], []
            for g in range(pairs.shape[1]):
                s_dom, e_dom = str(pairs[0, g]), str(pairs[1, g])
                idx = np.flatnonzero(inverse == g)
                res = self._group(method, s_dom, e_dom, ys[idx], ye[idx])
                if res is None:
                    continue
                scen, lo, hi = res
                idx_parts.append(idx)
                sc_parts.append(np.full(len(idx), scen, np.int8))
                dur_parts.append((lo + hi) / 2)
                bnd_parts.append((hi - lo) / 2 + _EPS)
            out.append(Translation(method, _cat(idx_parts, np.int64), _cat(sc_parts, np.int8),
                                   _cat(dur_parts, np.float64), _cat(bnd_parts, np.float64)))
        return out

    def _group(self, method: str, s: str, e: str, ys: np.ndarray, ye: np.ndarray
               ) -> tuple[int, np.ndarray, np.ndarray] | None:
        ref = self.reference
        n = len(ys)
        lo, hi = np.empty(n), np.empty(n)
        if s == ref and e == ref:
            d = (ye - ys).astype(np.float64)
            return 0, d, d.copy()
        if method == "naive":
            rel = {d: self.relation(d, ref, "minrtt") for d in (s, e) if d != ref}
            if any(r is None for r in rel.values()):
                return None
            ident = (np.zeros(1), np.ones(1), 0, 0, True)

            def parts(d: str, y: np.ndarray):
                if d == ref:
                    return (ident[0], ident[1], int(y[0]), int(y[0]), True)
                p = rel[d].polygon
                return (p.alpha, p.rate, p.x0, p.c0, False)

            _k_naive(ys, ye, *parts(s, ys), *parts(e, ye), lo, hi)
            scen = 1 if s == e else (2 if ref in (s, e) else 3)
            return scen, lo, hi
        if s == e:
            r = self.relation(s, ref, method)
            if r is None:
                return None
            bmin, bmax = r.polygon.rate_range
            _k_same_node(ys, ye, bmin, bmax, lo, hi)
            return 1, lo, hi
        if s == ref or e == ref:
            other = e if s == ref else s
            r = self.relation(other, ref, method)
            if r is None:
                return None
            p = r.polygon
            if s == ref:
                _k_ref_start(ys, ye, p.alpha, p.rate, p.x0, p.c0, lo, hi)
            else:
                _k_ref_end(ys, ye, p.alpha, p.rate, p.x0, p.c0, lo, hi)
            return 2, lo, hi
        g = self.relation(s, e, method)
        r = self.relation(e, ref, method)
        if g is None or r is None:
            return None
        bmin, bmax = r.polygon.rate_range
        p = g.polygon
        _k_two_nodes(ys, ye, p.alpha, p.rate, p.x0, p.c0, bmin, bmax, lo, hi)
        return 3, lo, hi


def reference_hz(table: pa.Table, reference: str, reported: dict[str, float]) -> tuple[float, str]:
    """Reference counts per second from its MinRTT probes of the first and last phase (else reported)."""
    own = table.filter(pc.equal(table["initiator"], reference))
    if own.num_rows:
        best = minrtt(own).sort_by("ns_i")
        if best.num_rows >= 2:
            c = _np(best, "c_i")
            ns = _np(best, "ns_i")
            if ns[-1] - ns[0] >= 10_000_000:  # 10 ms: the ns reads' jitter stays below 1e-4
                return float(c[-1] - c[0]) * 1e9 / float(ns[-1] - ns[0]), "minrtt"
    if reference in reported:
        return reported[reference], "agent"
    raise ValueError(f"no frequency for reference domain {reference!r}: no probes from it and none reported")


# -- records -------------------------------------------------------------------------------------


def read_points(records_dir: str, from_point: str, to_point: str) -> pa.Table:
    """tuple_id and the two points' stamp columns from a records dataset (staging dirs ignored)."""
    import pyarrow.dataset as pds

    cols = ["tuple_id", f"cp_tsc_{from_point}", f"cp_node_{from_point}", f"cp_tsc_{to_point}",
            f"cp_node_{to_point}"]
    try:
        dataset = pds.dataset(records_dir, format="parquet", ignore_prefixes=[".", "_"])
    except (FileNotFoundError, pa.ArrowInvalid) as e:
        raise ValueError(f"cannot read records from {records_dir!r}: {e}") from None
    missing = [c for c in cols if c not in dataset.schema.names]
    if missing:
        raise ValueError(f"records in {records_dir!r} lack {', '.join(missing)} "
                         f"(stamp points present: {_points(dataset.schema.names)})")
    t = dataset.to_table(columns=cols)
    valid = pc.and_(pc.is_valid(t[cols[1]]), pc.is_valid(t[cols[3]]))
    return t.filter(valid)


def _points(names: list[str]) -> str:
    pts = [n[len("cp_tsc_"):] for n in names if n.startswith("cp_tsc_")]
    return ", ".join(pts) or "none"


def default_reference(points: pa.Table, to_point: str) -> str:
    """The domain most end stamps were taken in."""
    counts = pc.value_counts(points[f"cp_node_{to_point}"]).to_pylist()
    if not counts:
        raise ValueError("no records to translate")
    return str(max(counts, key=lambda c: (c["counts"], c["values"]))["values"])


def translate_points(points: pa.Table, sync: pa.Table, from_point: str, to_point: str, reference: str,
                     hz: float, methods: tuple[str, ...] = METHODS) -> tuple[pa.Table, Translator]:
    """The output table: one row per record and method with duration and bound in cycles and ns."""
    ys = points[f"cp_tsc_{from_point}"].to_numpy()
    ye = points[f"cp_tsc_{to_point}"].to_numpy()
    ds_ = points[f"cp_node_{from_point}"].to_numpy(zero_copy_only=False)
    de = points[f"cp_node_{to_point}"].to_numpy(zero_copy_only=False)
    tr = Translator(sync, reference)
    parts = []
    scen_dict = pa.array([SCENARIOS[k] for k in sorted(SCENARIOS)])
    for res in tr.translate(ys, ds_, ye, de, methods):
        idx = pa.array(res.index)
        n = len(res.index)
        parts.append(pa.table({
            "tuple_id": points["tuple_id"].take(idx),
            "from_point": pa.array([from_point] * n, pa.string()),
            "to_point": pa.array([to_point] * n, pa.string()),
            "from_domain": points[f"cp_node_{from_point}"].take(idx),
            "to_domain": points[f"cp_node_{to_point}"].take(idx),
            "reference": pa.array([reference] * n, pa.string()),
            "method": pa.array([res.method] * n, pa.string()),
            "scenario": pa.DictionaryArray.from_arrays(pa.array(res.scenario), scen_dict).cast(pa.string()),
            "duration_cycles": pa.array(res.duration),
            "bound_cycles": pa.array(res.bound),
            "duration_ns": pa.array(res.duration * (1e9 / hz)),
            "bound_ns": pa.array(res.bound * (1e9 / hz)),
        }))
    return pa.concat_tables(parts), tr
