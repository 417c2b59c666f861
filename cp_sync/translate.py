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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from cp_sync.hull import AssumptionViolated, Constraints, Polygon, feasible_polygon
from cp_sync.sync_table import minrtt
from native_tsc.stamp_columns import node_column, stamp_points, tsc_column

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
# Relations are packed into arrays (vertices padded per relation) and every record is translated in one
# pass: per record, its (start domain, end domain) group picks the combination rule.

K_SKIP, K_REF, K_SAME, K_REF_START, K_REF_END, K_TWO, K_NAIVE = -1, 0, 1, 2, 3, 4, 5


@njit(cache=True, inline="always")
def _range(alpha, rate, nv, r, y, x0):
    dy = float(y - x0)
    lo = alpha[r, 0] + rate[r, 0] * dy
    hi = lo
    for v in range(1, nv[r]):
        val = alpha[r, v] + rate[r, v] * dy
        lo = min(lo, val)
        hi = max(hi, val)
    return lo, hi


@njit(cache=True, inline="always")
def _stamp(alpha, rate, nv, x0, r, y):
    # The reference reading at the instant of stamp y (relative to the relation's c0):
    # floor(F(u)) with u in [y, y + 1) lies in (min F(y) - 1, max F(y + 1)).
    lo, _ = _range(alpha, rate, nv, r, y, x0[r])
    _, hi = _range(alpha, rate, nv, r, y + 1, x0[r])
    return lo - 1.0, hi


@njit(cache=True, inline="always")
def _mul_range(alo, ahi, blo, bhi):
    p1, p2, p3, p4 = alo * blo, alo * bhi, ahi * blo, ahi * bhi
    return min(min(p1, p2), min(p3, p4)), max(max(p1, p2), max(p3, p4))


@njit(cache=True)
def _translate_kernel(
    ys, ye, sc, ec, n_end, kind, rel_a, rel_b, alpha, rate, nv, x0, c0, bmin, bmax, eps, mid, half
):
    for n in range(ys.shape[0]):
        g = sc[n] * n_end + ec[n]
        k = kind[g]
        a = rel_a[g]
        b = rel_b[g]
        if k == 0:  # both on the reference: exact
            lo = float(ye[n] - ys[n])
            hi = lo
        elif k == 1:  # one other domain: d in (y_e - y_s - 1, y_e - y_s + 1) times its rate, +-1 for floors
            d = float(ye[n] - ys[n])
            lo, hi = _mul_range(bmin[a], bmax[a], d - 1.0, d + 1.0)
            lo -= 1.0
            hi += 1.0
        elif k == 2:  # start on the reference, end translated
            elo, ehi = _stamp(alpha, rate, nv, x0, a, ye[n])
            base = float(c0[a] - ys[n])
            lo = base + elo
            hi = base + ehi
        elif k == 3:  # start translated, end on the reference
            slo, shi = _stamp(alpha, rate, nv, x0, a, ys[n])
            base = float(ye[n] - c0[a])
            lo = base - shi
            hi = base - slo
        elif k == 4:  # two other domains: start carried into the end's counter (a), end's rate (b)
            glo, _ = _range(alpha, rate, nv, a, ys[n], x0[a])
            _, ghi = _range(alpha, rate, nv, a, ys[n] + 1, x0[a])
            base = float(ye[n] - c0[a])
            lo, hi = _mul_range(bmin[b], bmax[b], base - ghi, base + 1.0 - glo)
            lo -= 1.0
            hi += 1.0
        elif k == 5:  # naive: both ends translated to the reference on their own
            slo, shi = _stamp(alpha, rate, nv, x0, a, ys[n])
            elo, ehi = _stamp(alpha, rate, nv, x0, b, ye[n])
            shift = float(c0[b] - c0[a])
            lo = shift + elo - shi
            hi = shift + ehi - slo
        else:
            lo = np.nan
            hi = np.nan
        mid[n] = (lo + hi) * 0.5
        half[n] = (hi - lo) * 0.5 + eps


def _codes(values: Any) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes (int32) and names of a column of domain ids (a dictionary array is used as it is)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        arr = values
    else:
        arr = pa.array(np.asarray(values, dtype=str))
    if isinstance(arr, pa.ChunkedArray):
        if pa.types.is_dictionary(arr.type):  # chunks may carry different dictionaries
            arr = arr.cast(arr.type.value_type)
        arr = arr.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    if arr.null_count:
        raise ValueError("a record has no domain id for a stamp")
    names = [str(x) for x in arr.dictionary.to_pylist()]
    return arr.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), names


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

    def _plan(self, method: str, s: str, e: str) -> tuple[int, int, Relation | None, Relation | None]:
        """(kind, scenario, relation a, relation b) for records from domain s to domain e."""
        ref = self.reference
        if s == ref and e == ref:
            return K_REF, 0, None, None
        scen = 1 if s == e else (2 if ref in (s, e) else 3)
        base = "minrtt" if method == "naive" else method
        if s == ref or e == ref:
            r = self.relation(e if s == ref else s, ref, base)
            return (K_SKIP if r is None else (K_REF_START if s == ref else K_REF_END)), scen, r, None
        if method == "naive":
            a, b = self.relation(s, ref, base), self.relation(e, ref, base)
            return (K_SKIP if a is None or b is None else K_NAIVE), scen, a, b
        if s == e:
            r = self.relation(s, ref, method)
            return (K_SKIP if r is None else K_SAME), scen, r, None
        g, r = self.relation(s, e, method), self.relation(e, ref, method)
        return (K_SKIP if g is None or r is None else K_TWO), scen, g, r

    def translate(
        self, ys: np.ndarray, ds: Any, ye: np.ndarray, de: Any, methods: tuple[str, ...] = METHODS
    ) -> list[Translation]:
        """Durations end - start in reference cycles, per method; ds/de are domain ids per record."""
        ys = np.ascontiguousarray(ys, np.int64)
        ye = np.ascontiguousarray(ye, np.int64)
        s_codes, s_names = _codes(ds)
        e_codes, e_names = _codes(de)
        ng = len(s_names) * len(e_names)
        out = []
        for method in methods:
            kind = np.full(ng, K_SKIP, np.int8)
            scen = np.full(ng, -1, np.int8)
            rel_a = np.zeros(ng, np.int32)
            rel_b = np.zeros(ng, np.int32)
            packed: list[Relation] = []
            for si, s in enumerate(s_names):
                for ei, e in enumerate(e_names):
                    g = si * len(e_names) + ei
                    k, sc, a, b = self._plan(method, s, e)
                    kind[g], scen[g] = k, sc
                    for arr, rel in ((rel_a, a), (rel_b, b)):
                        if rel is not None:
                            if rel not in packed:
                                packed.append(rel)
                            arr[g] = packed.index(rel)
            alpha, rate, nv, x0, c0, bmin, bmax = _pack(packed)
            mid, half = np.empty(len(ys)), np.empty(len(ys))
            _translate_kernel(
                ys,
                ye,
                s_codes,
                e_codes,
                len(e_names),
                kind,
                rel_a,
                rel_b,
                alpha,
                rate,
                nv,
                x0,
                c0,
                bmin,
                bmax,
                _EPS,
                mid,
                half,
            )
            rec_group = s_codes.astype(np.int64) * len(e_names) + e_codes
            rec_scen = scen[rec_group]
            if np.any(kind == K_SKIP) and np.any(skipped := kind[rec_group] == K_SKIP):
                # Records whose relation was refused get no row for this method rather than a wrong bound.
                keep = np.flatnonzero(~skipped)
                out.append(Translation(method, keep, rec_scen[keep], mid[keep], half[keep]))
            else:
                out.append(Translation(method, np.arange(len(ys)), rec_scen, mid, half))
        return out


def _pack(rels: list[Relation]) -> tuple[np.ndarray, ...]:
    n = max(len(rels), 1)
    vmax = max([len(r.polygon.alpha) for r in rels] + [1])
    alpha, rate = np.zeros((n, vmax)), np.zeros((n, vmax))
    nv = np.ones(n, np.int32)
    x0, c0 = np.zeros(n, np.int64), np.zeros(n, np.int64)
    bmin, bmax = np.ones(n), np.ones(n)
    for i, r in enumerate(rels):
        p = r.polygon
        k = len(p.alpha)
        alpha[i, :k], rate[i, :k], nv[i] = p.alpha, p.rate, k
        x0[i], c0[i] = p.x0, p.c0
        bmin[i], bmax[i] = p.rate_range
    return alpha, rate, nv, x0, c0, bmin, bmax


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


def _record_files(root: Path) -> list[Path]:
    """Parquet files under ``root``, skipping any file or directory whose name starts with ``_`` or ``.``."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        out += [
            Path(dirpath) / f
            for f in sorted(filenames)
            if f.endswith(".parquet") and not f.startswith(("_", "."))
        ]
    return out


def read_points(records_dir: str, from_point: str, to_point: str) -> pa.Table:
    """tuple_id and the two points' stamp columns from a records directory (staging ignored).

    Files without ``tuple_id`` (such as the sink's per-period counts) are not records and are skipped.
    """
    import pyarrow.dataset as pds
    import pyarrow.parquet as pq

    root = Path(records_dir)
    if not root.is_dir():
        raise ValueError(f"records directory {records_dir!r} does not exist")
    cols = [
        "tuple_id",
        tsc_column(from_point),
        node_column(from_point),
        tsc_column(to_point),
        node_column(to_point),
    ]
    files, seen = [], set()
    for f in _record_files(root):
        names = pq.read_schema(f).names
        if "tuple_id" in names:
            seen.update(names)
            if all(c in names for c in cols):
                files.append(str(f))
    if not seen:
        raise ValueError(f"no record files (Parquet with tuple_id) under {records_dir!r}")
    if not files:
        missing = [c for c in cols if c not in seen]
        raise ValueError(
            f"records in {records_dir!r} lack {', '.join(missing) or 'both points together'} "
            f"(stamp points present: {_points(sorted(seen))})"
        )
    schema = pa.schema(
        [
            ("tuple_id", pa.int64()),
            (cols[1], pa.int64()),
            (cols[2], pa.string()),
            (cols[3], pa.int64()),
            (cols[4], pa.string()),
        ]
    )
    t = pds.dataset(files, format="parquet", schema=schema).to_table(columns=cols)
    valid = pc.and_(pc.is_valid(t[cols[1]]), pc.is_valid(t[cols[3]]))
    return t.filter(valid)


def _points(names: list[str]) -> str:
    return ", ".join(stamp_points(names)) or "none"


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
) -> tuple[pa.Table, Translator]:
    """The output table: one row per record and method with duration and bound in cycles and ns."""
    ys = points[tsc_column(from_point)].to_numpy()
    ye = points[tsc_column(to_point)].to_numpy()
    ds_ = points[node_column(from_point)]
    de = points[node_column(to_point)]
    tr = Translator(sync, reference)
    parts = []
    scen_dict = pa.array([SCENARIOS[k] for k in sorted(SCENARIOS)])
    for res in tr.translate(ys, ds_, ye, de, methods):
        idx = pa.array(res.index)
        n = len(res.index)
        parts.append(
            pa.table(
                {
                    "tuple_id": points["tuple_id"].take(idx),
                    "from_point": pa.array([from_point] * n, pa.string()),
                    "to_point": pa.array([to_point] * n, pa.string()),
                    "from_domain": ds_.take(idx),
                    "to_domain": de.take(idx),
                    "reference": pa.array([reference] * n, pa.string()),
                    "method": pa.array([res.method] * n, pa.string()),
                    "scenario": pa.DictionaryArray.from_arrays(pa.array(res.scenario), scen_dict).cast(
                        pa.string()
                    ),
                    "duration_cycles": pa.array(res.duration),
                    "bound_cycles": pa.array(res.bound),
                    "duration_ns": pa.array(res.duration * (1e9 / hz)),
                    "bound_ns": pa.array(res.bound * (1e9 / hz)),
                }
            )
        )
    return pa.concat_tables(parts), tr


def translate_records(
    records_dir: str,
    sync_dir: str,
    from_point: str,
    to_point: str,
    reference: str | None = None,
    methods: tuple[str, ...] = METHODS,
) -> tuple[pa.Table, dict[str, Any]]:
    """Read records and sync tables, translate, and return the output table and facts about the run.

    Facts: reference, frequency_hz and its source, and the relations refused (hull crossings).
    """
    from cp_sync.sync_table import read_sync

    sync, reported = read_sync(sync_dir)
    points = read_points(records_dir, from_point, to_point)
    ref = reference or default_reference(points, to_point)
    hz, source = reference_hz(sync, ref, reported)
    out, tr = translate_points(points, sync, from_point, to_point, ref, hz, methods)
    refused = {f"{m} {s} -> {d}": why for (s, d, m), why in sorted(tr.violations.items())}
    return out, {"reference": ref, "frequency_hz": hz, "frequency_source": source, "refused": refused}
