"""Synthetic probes between virtual TSC domains of one raw counter, with exact ground truth.

A virtual domain is an exact affine transform of the raw counter
(``native_tsc.domain.VirtualDomain``), so for any raw instant the reading every
domain would have taken is known exactly. Tests check translation bounds
against that truth; the benchmark measures translation throughput on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from cp_sync.sync_table import probes_table
from native_tsc.domain import VirtualDomain, make_virtual

# Four domains: the reference, and three whose rates differ from it by tens to hundreds of ppm, with large
# offsets.
DOMAINS = [
    make_virtual("ref-node", "0", 0),
    make_virtual("node-b", "87.5", 3_000_000_000_000),
    make_virtual("node-c", "-143.25", -5_000_000_000_000),
    make_virtual("node-d", "310", 123_456_789_012),
]


class Domain(Protocol):
    """What the generators need of a domain: its id and its exact reading at a raw counter value."""

    @property
    def domain(self) -> str: ...

    def apply(self, tsc: int) -> int: ...


@dataclass(frozen=True)
class Drift:
    """A domain whose rate changes at one raw instant, its reading continuous there (what translation
    flags as ``drift``).

    Before ``at`` it reads as ``before``; from ``at`` on it advances as ``after`` does.
    """

    before: VirtualDomain
    after: VirtualDomain
    at: int

    @property
    def domain(self) -> str:
        return self.before.domain

    def apply(self, tsc: int) -> int:
        if tsc < self.at:
            return self.before.apply(tsc)
        return self.before.apply(self.at) + self.after.apply(tsc) - self.after.apply(self.at)


def stamp(v: Domain, raw: np.ndarray) -> np.ndarray:
    """Readings of domain ``v`` at raw counter values (exact, the same arithmetic as native_tsc)."""
    return np.array([v.apply(int(t)) for t in raw], dtype=np.int64)


def invert(v: VirtualDomain, c: int) -> int:
    """The smallest raw counter value whose reading in domain ``v`` is ``c``."""
    raw = int((c - v.offset) / v.rate())
    # The float estimate is within a few counts; step to the exact answer.
    while v.apply(raw) > c:
        raw -= 1
    while v.apply(raw + 1) <= c:
        raw += 1
    return raw


def synth_probes(
    domains: list[VirtualDomain] | list[Domain],
    phases: dict[str, int],
    rounds: int,
    rng: np.random.Generator,
    fwd_cycles: tuple[int, int] = (8_000, 40_000),
    back_cycles: tuple[int, int] = (8_000, 40_000),
) -> pa.Table:
    """A sync table: ``rounds`` probes per ordered pair, each phase from a raw instant, random one-way delays.

    ``phases`` maps a phase name to the raw counter value it starts at; pairs are probed one after the
    other, as the coordinator runs them. ``ns_i`` stands in for a 2.6 GHz counter.
    """
    tabs = []
    for phase, start in phases.items():
        t = start
        for a in domains:
            for b in domains:
                if a is b:
                    continue
                fwd = rng.integers(*fwd_cycles, size=rounds)
                back = rng.integers(*back_cycles, size=rounds)
                gaps = rng.integers(50_000, 150_000, size=rounds)
                ri = t + np.cumsum(gaps + fwd + back) - fwd - back
                rj = ri + fwd
                rk = rj + back
                t = int(rk[-1]) + 100_000
                ns = (ri // 2.6).astype(np.int64)
                tabs.append(
                    probes_table(phase, a.domain, b.domain, stamp(a, ri), stamp(b, rj), stamp(a, rk), ns)
                )
    return pa.concat_tables(tabs)


@dataclass(frozen=True)
class Paths:
    """One-way delays of synthetic probes (raw cycles): uniform ranges, plus rare outliers."""

    fwd: tuple[int, int] = (8_000, 40_000)
    back: tuple[int, int] = (8_000, 40_000)
    outlier_p: float = 0.0  # chance a one-way delay is multiplied by ``outlier_x``
    outlier_x: int = 50
    gap: tuple[int, int] = (50_000, 150_000)  # between probes


def synth_phases(
    domains: Sequence[Domain],
    starts: list[int],
    rounds: int,
    rng: np.random.Generator,
    paths: Paths | None = None,
    pairs: list[tuple[int, int]] | None = None,
    names: list[str] | None = None,
) -> pa.Table:
    """A sync table of phases starting at raw ``starts``: ``rounds`` probes per ordered pair in ``pairs``
    (default every ordered pair), pairs one after the other, phase names ``names`` (default p0000, ...)."""
    paths = paths or Paths()
    pairs = pairs or [(a, b) for a in range(len(domains)) for b in range(len(domains)) if a != b]
    tabs = []
    for n, start in enumerate(starts):
        t = start
        for a, b in pairs:
            fwd = _delays(rng, paths.fwd, paths, rounds)
            back = _delays(rng, paths.back, paths, rounds)
            gaps = rng.integers(*paths.gap, size=rounds)
            ri = t + np.cumsum(gaps + fwd + back) - fwd - back
            rj, rk = ri + fwd, ri + fwd + back
            t = int(rk[-1]) + paths.gap[0]
            da, db = domains[a], domains[b]
            name = names[n] if names else f"p{n:04d}"
            ns = (ri // 2.6).astype(np.int64)
            tabs.append(
                probes_table(name, da.domain, db.domain, stamp(da, ri), stamp(db, rj), stamp(da, rk), ns)
            )
    return pa.concat_tables(tabs)


def _delays(rng: np.random.Generator, span: tuple[int, int], paths: Paths, n: int) -> np.ndarray:
    d = rng.integers(span[0], span[1] + 1, size=n)
    if paths.outlier_p > 0:
        d = np.where(rng.random(n) < paths.outlier_p, d * paths.outlier_x, d)
    return d
