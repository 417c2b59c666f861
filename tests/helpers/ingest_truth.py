"""Ground truth for exactly-once checks: which tuple ids must reach the output after a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cp_source.spool.ledger import SpoolStats
from cp_source.spool.segments import Spool


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


def published_ids(spool: Path | str) -> np.ndarray:
    """Every tuple id in the spool's published segments (sorted; duplicates kept, so they can be found)."""
    from cp_source.spool.segments import read_segment

    sp = Spool(spool)
    parts = [
        read_segment(seg.path).column("tuple_id").to_numpy()
        for w, upto in sp.latest().items()
        for seg in sp.segments(w, -1, upto)
    ]
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def assert_ledger_balances(summary: dict[str, Any], stats: SpoolStats, got: np.ndarray) -> dict[str, int]:
    """Per sender: every id the generator assigned is in ``got`` exactly once, or dropped by the
    generator, or counted by the factory's ledger (lost with a reason, or rejected); none twice.

    Every sender appears in the ledger, closed (its end-of-stream arrived). Returns the totals.
    """
    dup = len(got) - len(np.unique(got))
    assert dup == 0, f"{dup} tuple ids delivered twice"
    totals = {"offered": 0, "delivered": 0, "dropped": 0, "lost": 0, "rejected": 0}
    for s in summary["senders"]:
        sid = int(s["id"])
        assert sid in stats.end_of_stream, f"sender {sid} is missing from the ledger's end-of-streams"
        lo, hi = int(s["first_tuple_id"]), int(s["next_tuple_id"])
        mine = got[(got >= lo) & (got < hi)]
        delivered = np.zeros(hi - lo, dtype=bool)
        delivered[mine - lo] = True
        lost_ranges = stats.lost_in_transit.get(sid, [])
        reasons = stats.lost_reasons.get(sid, {})
        assert bk_total(lost_ranges) == sum(bk_total(r) for r in reasons.values()), "reasons do not sum up"
        parts = {
            "dropped": _ranges_mask(lo, hi, s["dropped_ranges"]),
            "lost": _ranges_mask(lo, hi, lost_ranges),
            "rejected": _ranges_mask(lo, hi, stats.rejected_ranges),
        }
        covered = delivered.astype(np.int64) + sum(m.astype(np.int64) for m in parts.values())
        assert (covered == 1).all(), (
            f"sender {sid}: {int((covered == 0).sum())} ids unaccounted for, "
            f"{int((covered > 1).sum())} counted twice"
        )
        totals["offered"] += hi - lo
        totals["delivered"] += int(delivered.sum())
        for k, m in parts.items():
            totals[k] += int(m.sum())
    return totals


def bk_total(ranges: list[list[int]]) -> int:
    return sum(int(c) for _, c in ranges)
