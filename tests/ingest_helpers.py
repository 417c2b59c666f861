"""Helpers shared by the ingest tests: read every id in a spool and compute the ids a run must deliver."""

from __future__ import annotations

from typing import Any

import numpy as np

from cp_source.spool import Spool, read_segment


def spool_ids(spool: Spool, commit: bool = False) -> np.ndarray:
    """All tuple ids in the spool's published segments (optionally committing them)."""
    parts = [np.empty(0, dtype=np.int64)]
    done = spool.committed()
    latest = spool.latest()
    for w, upto in latest.items():
        for seg in spool.segments(w, done.get(w, -1), upto):
            parts.append(read_segment(seg.path).column("tuple_id").to_numpy())
    if commit:
        spool.commit(latest)
    return np.concatenate(parts)


def ranges_to_ids(ranges: list[list[int]]) -> np.ndarray:
    if not ranges:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, a + c, dtype=np.int64) for a, c in ranges])


def expected_ids(summary: dict[str, Any], lost: dict[str, list[list[int]]] | None = None) -> np.ndarray:
    """Every id the generator assigned, minus those it dropped and those the factory counted as lost."""
    keep = []
    for s in summary["senders"]:
        all_ids = np.arange(s["first_tuple_id"], s["next_tuple_id"], dtype=np.int64)
        gone = np.concatenate([ranges_to_ids(s["dropped_ranges"]),
                               ranges_to_ids((lost or {}).get(str(s["id"]), []))])
        keep.append(np.setdiff1d(all_ids, gone, assume_unique=False))
    return np.sort(np.concatenate(keep))
