"""The translation kernel: every record translated in one numba pass over the packed relations."""

from __future__ import annotations

import numpy as np
from numba import njit

from cp_sync.translate.phase_spans import PairSpans
from cp_sync.translate.relation import ST_DRIFT, ST_OK

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
    neighbours cannot reveal (cp_sync.translate.phase_spans.span_cover)."""
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
