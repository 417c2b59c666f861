"""A pair of domains over any number of sync phases: spans between neighbouring phases, and drift.

Each phase that probed the pair gives an *edge*: the src-domain stamp of its
MinRTT probe. Neighbouring edges bound a *span*; a record is translated with
the relation of the span its stamp falls in (the first or last span, widened
by the affine extrapolation, outside the probed window). Per span:

* ``minrtt``: the polygon of the two phases' MinRTT probes, the paper's
  two-point method: per phase the direction whose MinRTT is smaller in dst's
  units (both directions bracket the relation within half their round trip);
* ``hull``: the polygon of every probe of the two phases, both directions.

The affine assumption is tested on the neighbourhood of every span: the hull
of all probes of the span's phases and of the neighbouring spans' (up to four
phases) must admit one affine relation; where it does not, the span is
``drift`` for every method, unless the misfit is located in a neighbouring
span and the span's own phases agree with the phase on its far side. The hull
over the whole run is tested too and reported (a slow drift that every
neighbourhood absorbs leaves each span usable on its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cp_sync.translate.hull import AssumptionViolated, Constraints, Polygon, consistent, feasible_polygon

Probes = tuple[np.ndarray, np.ndarray, np.ndarray]  # c_i, c_j, c_k


@dataclass(frozen=True)
class PhaseProbes:
    """One phase's probes of the pair: dst-initiated (c_j in src) and src-initiated."""

    name: str
    fwd: Probes
    back: Probes
    edge: int  # src stamp of the phase's MinRTT probe (c_j, or the midpoint of a src-initiated one)
    best: tuple[str, int]  # ("fwd" | "back", row) of the MinRTT probe
    e: float  # half its round trip, in dst cycles


@dataclass(frozen=True)
class PairSpans:
    """The spans of one ordered pair src -> dst for one method."""

    src: str
    dst: str
    method: str
    edges: np.ndarray  # int64, one per phase, increasing
    polygons: tuple[Polygon | None, ...]  # one per span (None: no relation fits even two probes)
    drift: np.ndarray  # bool per span
    phases: tuple[str, ...]
    whole_run_affine: bool
    notes: tuple[str, ...]
    # Cover for a rate change the neighbours cannot reveal (see span_cover): per span the rate range
    # [lo, hi] a record's duration may take, the rate spread, and how the value allowance grows
    # (0 none, 1 interior span, 2 first span, 3 last span).
    rates: np.ndarray | None = None  # float64 (spans, 2)
    spread: np.ndarray | None = None  # float64 per span
    cover: np.ndarray | None = None  # int8 per span


def _arrays(t: pa.Table) -> Probes:
    i, j, k = (t[c].to_numpy().astype(np.int64) for c in ("c_i", "c_j", "c_k"))
    return i, j, k


def _rate_guess(fwd: Probes, back: Probes) -> float:
    """dst cycles per src cycle from the earliest and latest probe of either direction (1.0 if unknown).

    Only used to compare the two directions' round trips in dst's units, so a rough figure serves.
    """
    src = np.concatenate([fwd[1], (back[0] + back[2]) // 2]).astype(np.float64)
    dst = np.concatenate([(fwd[0] + fwd[2]) / 2, back[1]]).astype(np.float64)
    if len(src) < 2:
        return 1.0
    a, b = int(np.argmin(src)), int(np.argmax(src))
    rate = (dst[b] - dst[a]) / (src[b] - src[a]) if src[b] > src[a] else 1.0
    return rate if np.isfinite(rate) and rate > 0 else 1.0


def _best(fwd: Probes, back: Probes, rate: float) -> tuple[int, tuple[str, int], float]:
    """(edge, best, e) of a phase: the direction whose MinRTT, in dst cycles, is smaller (dst's on a tie).

    A dst-initiated probe puts its c_j (a src stamp) between c_i and c_k of dst; a src-initiated one
    puts its c_j (a dst stamp) between c_i and c_k of src, whose round trip is rate times as long in
    dst. Either brackets the relation within half its round trip (docs/sync.md, "Two methods").
    """
    cands = []
    if len(fwd[0]):
        rtt = fwd[2] - fwd[0]
        r = int(np.argmin(rtt))
        cands.append((float(rtt[r]) / 2, int(fwd[1][r]), ("fwd", r)))
    if len(back[0]):
        rtt = back[2] - back[0]
        r = int(np.argmin(rtt))
        cands.append((float(rtt[r]) * rate / 2, int((back[0][r] + back[2][r]) // 2), ("back", r)))
    e, edge, best = min(cands, key=lambda c: c[0])  # stable: dst-initiated first on a tie
    return edge, best, e


def _pair_phases(table: pa.Table, src: str, dst: str) -> list[PhaseProbes]:
    """The phases that probed the pair, ordered by their edge in src's counter."""
    fwd_all = table.filter(pc.and_(pc.equal(table["initiator"], dst), pc.equal(table["responder"], src)))
    back_all = table.filter(pc.and_(pc.equal(table["initiator"], src), pc.equal(table["responder"], dst)))
    names = sorted(set(fwd_all["phase"].to_pylist()) | set(back_all["phase"].to_pylist()))
    rate = _rate_guess(_arrays(fwd_all), _arrays(back_all))
    out = []
    for name in names:
        fwd = _arrays(fwd_all.filter(pc.equal(fwd_all["phase"], name)))
        back = _arrays(back_all.filter(pc.equal(back_all["phase"], name)))
        edge, best, e = _best(fwd, back, rate)
        out.append(PhaseProbes(name, fwd, back, edge, best, e))
    out.sort(key=lambda p: p.edge)
    return out


def _cat(parts: list[Probes]) -> Probes | None:
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return None
    return tuple(np.concatenate([p[n] for p in parts]) for n in range(3))  # type: ignore[return-value]


def hull_constraints(phases: list[PhaseProbes]) -> Constraints:
    """Every probe of ``phases``, both directions."""
    return Constraints.from_probes(_cat([p.fwd for p in phases]), _cat([p.back for p in phases]))


def minrtt_constraints(phases: list[PhaseProbes]) -> Constraints:
    """The MinRTT probe of each of ``phases`` (its own direction)."""
    fwd: list[Probes] = []
    back: list[Probes] = []
    for p in phases:
        d, r = p.best
        src = p.fwd if d == "fwd" else p.back
        one = (src[0][r : r + 1], src[1][r : r + 1], src[2][r : r + 1])
        (fwd if d == "fwd" else back).append(one)
    return Constraints.from_probes(_cat(fwd), _cat(back))


def _origin(phases: list[PhaseProbes]) -> tuple[int, int]:
    """A local origin (src, dst counters) near the first phase's MinRTT probe."""
    p = phases[0]
    d, r = p.best
    i, j, k = p.fwd if d == "fwd" else p.back
    if d == "fwd":
        return int(j[r]), int((int(i[r]) + int(k[r])) // 2)
    return int((int(i[r]) + int(k[r])) // 2), int(j[r])


def _polygon(cons: Constraints, phases: list[PhaseProbes]) -> Polygon | None:
    x0, c0 = _origin(phases)
    try:
        return feasible_polygon(cons, x0, c0)
    except AssumptionViolated:
        return None


def _consistent(phases: list[PhaseProbes]) -> bool:
    x0, c0 = _origin(phases)
    return consistent(hull_constraints(phases), x0, c0)


def pair_phases(table: pa.Table, src: str, dst: str) -> list[PhaseProbes]:
    """The phases that probed src <-> dst, ordered by their edge in src's counter."""
    return _pair_phases(table, src, dst)


def span_drift(phases: list[PhaseProbes]) -> np.ndarray:
    """Per span: no affine relation fits the probes of the span and its neighbours (up to four phases),
    unless the misfit is located in a neighbouring span.

    A span is a located change when its two phases agree with neither the phase before nor the
    phase after. Its neighbour on either side is then affine under the model (at most one change
    in three neighbouring spans), and is cleared when its own phases agree with the phase on its far
    side: a rate change between two phases marks only the span it lies in. A change next to a phase
    is located nowhere (either span beside the phase may hold it), so both stay drift.
    """
    n = len(phases) - 1
    old = np.array([not _consistent(phases[max(0, k - 1) : k + 3]) for k in range(n)], dtype=bool)
    if n < 3:
        return old
    # fits[k]: phases k, k + 1, k + 2 admit one affine relation (the triple right of span k).
    fits = np.array([_consistent(phases[k : k + 3]) for k in range(n - 1)], dtype=bool)
    left = np.r_[False, fits]  # span k with the phase before (absent for the first span)
    right = np.r_[fits, False]  # span k with the phase after (absent for the last span)
    located = np.zeros(n, bool)
    located[1:-1] = ~fits[:-1] & ~fits[1:]
    cleared = np.zeros(n, bool)
    cleared[:-1] |= located[1:] & left[:-1]
    cleared[1:] |= located[:-1] & right[1:]
    return old & ~cleared  # a located change is never cleared: neither of its triples fits


def _first_stamps(table: pa.Table, dom: str) -> dict[str, int]:
    """Per phase, the earliest stamp ``dom`` took in it (sending or answering a probe of any pair)."""
    out: dict[str, int] = {}
    for role, col in (("initiator", "c_i"), ("responder", "c_j")):
        rows = table.filter(pc.equal(table[role], dom))
        if rows.num_rows:
            g = rows.group_by("phase").aggregate([(col, "min")])
            for name, v in zip(g["phase"].to_pylist(), g[f"{col}_min"].to_pylist(), strict=True):
                out[name] = min(out.get(name, v), v)
    return out


def skipped_phases(table: pa.Table, src: str, dst: str, phases: list[PhaseProbes]) -> list[list[str]]:
    """Per span of the pair: the run's other phases that fall inside it, which probed one of the two
    domains but not this pair (its agent was away for them, or the pair failed).

    Such a span was not checked as often as the run's period promises, so a record in it is not
    ``ok``. A phase is placed by the domains' own counters (dst's first, else src's): phases run one
    after the other, so each domain's earliest stamp per phase orders them.
    """
    gaps: list[list[str]] = [[] for _ in range(len(phases) - 1)]
    own = {p.name for p in phases}
    if len(phases) < 2 or set(table["phase"].unique().to_pylist()) <= own:
        return gaps
    placed: set[str] = set()
    for dom in (dst, src):
        first = _first_stamps(table, dom)
        marks = np.array([first.get(p.name, -1) for p in phases], np.int64)
        if any(p.name not in first for p in phases) or np.any(np.diff(marks) <= 0):
            continue  # cannot order by this domain's counter
        for name, t in first.items():
            if name in own or name in placed:
                continue
            k = int(np.searchsorted(marks, t)) - 1
            if 0 <= k < len(gaps):
                gaps[k].append(name)
                placed.add(name)
    return [sorted(g) for g in gaps]


def _rate_range(p: Polygon | None) -> tuple[float, float]:
    return p.rate_range if p is not None else (float("nan"), float("nan"))


def span_cover(phases: list[PhaseProbes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rates, spread, cover) per span: what a record needs so its bound survives one rate change
    inside its span that the neighbouring phases cannot reveal (docs/sync.md, "Drift").

    With one span (two phases) nothing can be checked and nothing is added. An interior span's rate
    before and after such a change is the rate of the neighbouring spans (each affine: at most one
    change in three spans), so the rate range is the neighbours' hull ranges with its own, and a value
    inside the span moves off the span's relation by at most spread * (y - x_k)(x_k+1 - y) / T. In
    the first (last) span the rate before (after) the change is bounded only through the span's
    average rate, from its two MinRTT brackets (true whatever the clock did): a value moves by at most
    spread * (x_1 - y) (spread * (y - x_k)).
    """
    n = len(phases) - 1
    hull = np.array(
        [_rate_range(_polygon(hull_constraints(phases[k : k + 2]), phases[k : k + 2])) for k in range(n)]
    )
    two = np.array(
        [_rate_range(_polygon(minrtt_constraints(phases[k : k + 2]), phases[k : k + 2])) for k in range(n)]
    )
    hull = np.where(np.isnan(hull), two, hull)
    rates = np.full((n, 2), np.nan)  # the neighbours' rates; the span's own are added where it is used
    spread = np.zeros(n)
    cover = np.zeros(n, np.int8)
    if n == 1:
        return rates, spread, cover
    for k in range(n):
        if 0 < k < n - 1:
            lo, hi = min(hull[k - 1, 0], hull[k + 1, 0]), max(hull[k - 1, 1], hull[k + 1, 1])
            cover[k] = 1
        else:
            nb = hull[1] if k == 0 else hull[n - 2]
            lo, hi = min(two[k, 0], nb[0]), max(two[k, 1], nb[1])
            cover[k] = 2 if k == 0 else 3
        spread[k] = hi - lo
        rates[k] = (lo, hi)
    return rates, spread, cover


def fit_spans(
    table: pa.Table,
    src: str,
    dst: str,
    method: str,
    phases: list[PhaseProbes] | None = None,
    drift: np.ndarray | None = None,
    cover: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> PairSpans:
    """The spans of src -> dst by ``method`` (minrtt or hull); ValueError when fewer than two phases.

    ``phases`` and ``drift`` (from pair_phases and span_drift) may be passed in to share them
    between methods.
    """
    if method not in ("minrtt", "hull"):
        raise ValueError(f"unknown method {method!r}")
    if phases is None:
        phases = _pair_phases(table, src, dst)
    if len(phases) < 2:
        raise ValueError(
            f"two phases needed for {src} <-> {dst}, found {len(phases)}: "
            "run 'cloudprofiler sync run' before and after (or periodically)"
        )
    edges = np.array([p.edge for p in phases], np.int64)
    if np.any(np.diff(edges) <= 0):
        raise ValueError(f"two phases of {src} <-> {dst} probed at the same instant of {src}'s counter")
    polys: list[Polygon | None] = []
    drift = (span_drift(phases) if drift is None else drift).copy()
    notes = []
    for k in range(len(phases) - 1):
        two = phases[k : k + 2]
        poly = None
        if method == "hull":
            poly = _polygon(hull_constraints(two), two)
        if poly is None:  # minrtt, or a hull that no line fits: the two MinRTT probes still give numbers
            poly = _polygon(minrtt_constraints(two), two)
        if poly is None:
            drift[k] = True
        polys.append(poly)
        if drift[k]:
            notes.append(f"span {two[0].name} -> {two[1].name}: no affine relation fits the probes nearby")
    whole = bool(not drift.any()) and (len(phases) <= 4 or _consistent(phases))
    for k, missed in enumerate(skipped_phases(table, src, dst, phases)):
        if missed:  # the run probed others in between: this pair's span went unchecked there
            drift[k] = True
            notes.append(
                f"span {phases[k].name} -> {phases[k + 1].name}: phase(s) {', '.join(missed)} did not "
                f"probe {src} <-> {dst} (an agent away or the pair failed)"
            )
    names = tuple(p.name for p in phases)
    rates, spread, kinds = span_cover(phases) if cover is None else cover
    return PairSpans(
        src, dst, method, edges, tuple(polys), drift, names, whole, tuple(notes), rates, spread, kinds
    )
