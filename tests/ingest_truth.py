"""Ground truth for exactly-once checks: which tuple ids must reach the output after a run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np


def _ranges_mask(lo: int, hi: int, ranges: list[list[int]]) -> np.ndarray:
    """True for the ids in [lo, hi) covered by ``ranges`` ([first, count] pairs)."""
    mask = np.zeros(hi - lo, dtype=bool)
    for first, count in ranges:
        a, b = max(first, lo), min(first + count, hi)
        if a < b:
            mask[a - lo : b - lo] = True
    return mask


def expected_ids(summary: dict[str, Any], stats: dict[str, Any]) -> tuple[np.ndarray, dict[str, int]]:
    """Offered ids minus generator drops, factory lost-in-transit and rejected ranges; and the counts.

    ``summary`` is run_generator's result, ``stats`` the spool's ``Spool.stats()``.
    """
    keep_parts = []
    counts = {"offered": 0, "dropped": 0, "lost": 0, "rejected": 0}
    for s in summary["senders"]:
        lo, hi = int(s["first_tuple_id"]), int(s["next_tuple_id"])
        ids = np.arange(lo, hi, dtype=np.int64)
        dropped = _ranges_mask(lo, hi, s["dropped_ranges"])
        lost = _ranges_mask(lo, hi, stats["lost_in_transit"].get(str(s["id"]), []))
        rejected = _ranges_mask(lo, hi, stats["rejected_ranges"])
        assert not (dropped & lost).any(), "an id counted both as dropped and as lost"
        counts["offered"] += hi - lo
        counts["dropped"] += int(dropped.sum())
        counts["lost"] += int(lost.sum())
        counts["rejected"] += int(rejected.sum())
        keep_parts.append(ids[~(dropped | lost | rejected)])
    assert counts["dropped"] == summary["dropped"]
    return np.sort(np.concatenate(keep_parts)) if keep_parts else np.empty(0, np.int64), counts


def spool_drained(spool: Path | str, summary: dict[str, Any], quiet: float = 0.5) -> bool:
    """True once every sender's end-of-stream arrived and every worker has published all it holds."""
    from cp_source.spool import Spool

    stats = Spool(spool).stats()
    if {str(s["id"]) for s in summary["senders"]} - set(stats["end_of_stream"]):
        return False
    for w in stats["per_worker"].values():
        if w.get("pending_rows") != 0 or w.get("paused"):
            return False
        if time.time() - w.get("updated_wall", 0) > 1.0:  # a dead worker stops updating
            return False
        if w.get("updated_wall", 0) - w.get("last_recv_wall", 0) < quiet:
            return False
    return True


def output_ids(spark: Any, path: Path | str) -> np.ndarray:
    """Tuple ids in a Parquet file sink's committed output (Spark honours its _spark_metadata log)."""
    table = spark.read.parquet(str(path)).select("tuple_id").toArrow()
    return np.sort(table.column("tuple_id").to_numpy())


def assert_exactly_once(got: np.ndarray, want: np.ndarray) -> None:
    """Same ids, each exactly once."""
    dup = int(len(got) - len(np.unique(got)))
    assert dup == 0, f"{dup} duplicate tuple ids in the output"
    missing = np.setdiff1d(want, got)
    extra = np.setdiff1d(got, want)
    assert len(missing) == 0 and len(extra) == 0, (
        f"{len(missing)} expected ids missing (first {missing[:5].tolist()}), "
        f"{len(extra)} unexpected ids (first {extra[:5].tolist()})"
    )
    assert len(got) == len(want)
