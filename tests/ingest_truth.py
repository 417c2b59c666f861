"""Ground truth for exactly-once checks: which tuple ids must reach the output after a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cp_source.spool import Spool
from cp_source.spool_ledger import SpoolStats


def spool_drained(spool: Path | str, summary: dict[str, Any]) -> bool:
    """Every sender of a generator run has ended its stream and the factory has published everything."""
    return Spool(spool).drained({int(s["id"]) for s in summary["senders"]})


def _ranges_mask(lo: int, hi: int, ranges: list[list[int]]) -> np.ndarray:
    """True for the ids in [lo, hi) covered by ``ranges`` ([first, count] pairs)."""
    mask = np.zeros(hi - lo, dtype=bool)
    for first, count in ranges:
        a, b = max(first, lo), min(first + count, hi)
        if a < b:
            mask[a - lo : b - lo] = True
    return mask


def expected_ids(
    summary: dict[str, Any], stats: SpoolStats | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Offered ids minus generator drops, factory lost-in-transit and rejected ranges; and the counts.

    ``summary`` is run_generator's result, ``stats`` the spool's ``Spool.stats()`` (None: no loss
    or rejection counted).
    """
    keep_parts = []
    counts = {"offered": 0, "dropped": 0, "lost": 0, "rejected": 0}
    for s in summary["senders"]:
        lo, hi = int(s["first_tuple_id"]), int(s["next_tuple_id"])
        ids = np.arange(lo, hi, dtype=np.int64)
        dropped = _ranges_mask(lo, hi, s["dropped_ranges"])
        lost = _ranges_mask(lo, hi, stats.lost_in_transit.get(int(s["id"]), []) if stats else [])
        rejected = _ranges_mask(lo, hi, stats.rejected_ranges if stats else [])
        assert not (dropped & lost).any(), "an id counted both as dropped and as lost"
        counts["offered"] += hi - lo
        counts["dropped"] += int(dropped.sum())
        counts["lost"] += int(lost.sum())
        counts["rejected"] += int(rejected.sum())
        keep_parts.append(ids[~(dropped | lost | rejected)])
    assert counts["dropped"] == summary["dropped"]
    return np.sort(np.concatenate(keep_parts)) if keep_parts else np.empty(0, np.int64), counts


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
