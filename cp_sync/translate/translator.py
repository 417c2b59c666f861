"""The Translator: relations fitted lazily from one sync table, stamp pairs translated per method."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cp_sync.translate.kernel import (
    K_NAIVE,
    K_NONE,
    K_REF,
    K_REF_END,
    K_REF_START,
    K_SAME,
    K_TWO,
    _pack,
    _translate_kernel,
)
from cp_sync.translate.phase_spans import (
    PairSpans,
    PhaseProbes,
    fit_spans,
    pair_phases,
    span_cover,
    span_drift,
)
from cp_sync.translate.relation import METHODS, STAMP_MARGIN, Relation, _relation


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
