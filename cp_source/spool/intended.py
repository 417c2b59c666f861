"""The ``intended`` stamp of a segment's rows: kept per bucket run, made into columns on read.

A bucket's intended stamp (when the generator's schedule meant it to leave, see
``cp_source.generate.pacing.Intended``) is one value per bucket, as its ``gen`` stamp is. Rather
than repeat it in every row of the spool, the factory's worker keeps one value per bucket run in
the segment's metadata (``intended``, aligned with its ``buckets`` records, whose rows come in the
same order as the segment's rows), and the reader makes ``cp_tsc_intended`` (one ``np.repeat``
per segment) and ``cp_node_intended`` (the ``cp_node_gen`` column itself: the same sender's TSC)
only for a query that reads them. So the stamp costs no byte per tuple in the spool and no work per
tuple for a query that does not read it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from cp_common.stamp_columns import GEN, INTENDED, node_column, tsc_column

INTENDED_KEY = "intended"  # in a segment's metadata: one int64 per record of its "buckets"
COLUMNS = (tsc_column(INTENDED), node_column(INTENDED))
_COUNT = 4  # a "buckets" record: segment number, sender, seq, first id, count


class IntendedError(RuntimeError):
    """A segment whose metadata cannot give its rows' intended stamps."""


def wanted(columns: list[str] | None) -> bool:
    """True when a read of ``columns`` (None: all) needs the intended columns made."""
    return columns is None or any(c in COLUMNS for c in columns)


def with_intended(table: pa.Table, name: str) -> pa.Table:
    """``table`` (a whole segment, its metadata in its schema) with ``cp_tsc_intended`` and
    ``cp_node_intended`` inserted before ``cp_tsc_gen``; IntendedError names the segment when its
    metadata does not match its rows (an earlier factory's segment, or a damaged one)."""
    from cp_source.spool.segments import segment_meta

    meta = segment_meta(table.schema) or {}
    runs, stamps = meta.get("buckets"), meta.get(INTENDED_KEY)
    if not isinstance(stamps, list):
        raise IntendedError(f"{name} keeps no intended stamps (written by an earlier factory?)")
    counts = _counts(runs, len(stamps), name)
    if counts.sum() != table.num_rows:
        raise IntendedError(f"{name}: its bucket records count {counts.sum()} rows, it has {table.num_rows}")
    try:
        if not all(type(v) is int for v in stamps):  # a float would be truncated without a word
            raise TypeError
        values = np.asarray(stamps, dtype=np.int64)
    except (TypeError, OverflowError):
        raise IntendedError(f"{name}: its intended stamps are not int64 values") from None
    at = table.schema.get_field_index(tsc_column(GEN))
    tsc = pa.array(np.repeat(values, counts), pa.int64())
    table = table.add_column(at, tsc_column(INTENDED), tsc)
    return table.add_column(at + 1, node_column(INTENDED), table.column(node_column(GEN)))


def _counts(runs: Any, n: int, name: str) -> np.ndarray:
    """The rows of each bucket run, checked against the ``n`` intended stamps."""
    if not isinstance(runs, list) or len(runs) != n:
        have = len(runs) if isinstance(runs, list) else "no"
        raise IntendedError(f"{name}: {n} intended stamps for {have} bucket records")
    try:
        counts = np.array([int(r[_COUNT]) for r in runs], dtype=np.int64)
    except (TypeError, ValueError, IndexError, OverflowError):
        raise IntendedError(f"{name}: its bucket records are not [number, sender, seq, id, count]") from None
    if (counts < 0).any():
        raise IntendedError(f"{name}: a bucket record with a negative count")
    return counts
