"""Tuple-id ranges as the ledger keeps them: merged ``[first, count]`` lists, and what they cover."""

from __future__ import annotations

from typing import Any

import numpy as np

from cp_source.wire.bucket import merge_ranges


def ranges_of(pairs: Any) -> list[list[int]]:
    """[first, count] pairs (an (n, 2) array or list) as a merged list of int pairs."""
    return merge_ranges(
        [[int(a), int(c)] for a, c in (pairs.tolist() if hasattr(pairs, "tolist") else pairs)]
    )


def in_ranges(values: np.ndarray, ranges: list[list[int]]) -> np.ndarray:
    """A mask: which of ``values`` lie in the merged ``ranges``."""
    if not ranges or not len(values):
        return np.zeros(len(values), dtype=bool)
    r = np.asarray(ranges, dtype=np.int64)
    i = np.searchsorted(r[:, 0], values, side="right") - 1
    return (i >= 0) & (values < r[np.maximum(i, 0), 0] + r[np.maximum(i, 0), 1])


def new_pieces(recs: np.ndarray, covered: list[list[int]]) -> int:
    """Distinct first ids among ``recs`` not in ``covered`` (the merged id ranges of earlier records).

    A sender's records never overlap in part (a bucket's pieces are disjoint, and its bad rows fail
    alike wherever it is parsed), so a record whose first id an earlier one covers, or that repeats
    one here, is a duplicate."""
    firsts = np.unique(recs[:, 3])
    return int(np.count_nonzero(~in_ranges(firsts, covered)))


def count_below(ranges: list[list[int]], limit: int) -> int:
    """How many integers of the merged ``ranges`` are below ``limit``."""
    return int(sum(max(0, min(a + c, limit) - a) for a, c in ranges))


def intersect(ranges: list[list[int]], within: list[list[int]]) -> list[list[int]]:
    """The parts of ``ranges`` inside ``within`` (both merged [first, count] lists)."""
    out = []
    for a, c in ranges:
        for b, d in within:
            lo, hi = max(a, b), min(a + c, b + d)
            if lo < hi:
                out.append([lo, hi - lo])
    return merge_ranges(out)


def split_lost(lost: list[list[int]], accepted: list[list[int]]) -> dict[str, list[list[int]]]:
    """Lost ranges by reason: accepted by the factory's front end and never published or rejected
    (``in_factory``: a worker died, a write failed), or never accepted (``before_factory``)."""
    inside = intersect(lost, accepted)
    before = [r for a, c in lost for r in complement(a, a + c, inside)]
    return {"in_factory": inside, "before_factory": before}


def complement(lo: int, hi: int, covered: list[list[int]]) -> list[list[int]]:
    """Ranges [first, count] of [lo, hi) not covered by ``covered``."""
    out = []
    pos = lo
    for a, c in merge_ranges(covered):
        if a > pos:
            out.append([pos, min(a, hi) - pos])
        pos = max(pos, a + c)
        if pos >= hi:
            break
    if pos < hi:
        out.append([pos, hi - pos])
    return [r for r in out if r[1] > 0]
