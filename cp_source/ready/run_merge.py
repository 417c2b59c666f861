"""A ready slice in merged order: the senders' sorted runs merged block by block, not sorted row by row.

A segment holds whole buckets, and the factory gives every row of a bucket the bucket's event
time and sender id and numbers its tuple ids upwards from the bucket's first id. So the rows of a
slice's segments, in plan order, fall into *blocks*: maximal stretches of one event time and one
sender with consecutive tuple ids, each already in (event time, sender id, tuple id) order. A
sender's blocks in a segment are its sorted run (its event times never decrease with its seq),
and merging the k runs of a slice comes down to ordering the blocks by their first key: a sort
of the B block heads (B = rows / bucket size: 1,000 times fewer than the rows with the
generator's buckets), the blocks outside the slice's event times dropped whole, then one copy of
the kept blocks in that order (slices of the segments joined, no per-row gather).

The order is the one Arrow's stable sort gives (``batch_plan.merge_sorted``, the reference and the
fallback), ties included: (event time, sender id, tuple id), then the position in the slice's
segments in plan order. A run that breaks the contract (a sender whose event times go back) needs
nothing special: its blocks are ordered like any other. Blocks cannot be ordered by their heads
only when two blocks of one event time and one sender overlap in tuple ids (a tuple id sent
twice): that slice is sorted as before, as is one with a null in a key column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cp_source.ready.batch_plan import _US_FLOOR, merge_sorted, select_rows

KEY_COLUMNS = ("event_time", "sender_id", "tuple_id")


def merge_slice(tables: list[Any], lo: int, hi: int) -> Any:
    """The rows of ``tables`` (whole segments, in plan order) with event time in ``(lo, hi]`` ms, in
    (event time, sender id, tuple id) order; None when there are no tables."""
    if not tables:
        return None
    keys = slice_keys(tables)
    if keys is not None:
        blocks = block_order(*keys, lo, hi)
        if blocks is not None:
            return copy_blocks(tables, keys[3], *blocks)
    return merge_sorted([select_rows(t, lo, hi) for t in tables])


def slice_keys(tables: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The key columns of ``tables`` end to end (event time in us, sender id, tuple id) and each
    table's first row in them; None when a key column holds a null (only the sort orders those)."""
    import pyarrow as pa

    cols: list[list[np.ndarray]] = [[], [], []]
    for t in tables:
        for out, name in zip(cols, KEY_COLUMNS, strict=True):
            col = t.column(name)
            if col.null_count:
                return None
            # chunk by chunk, the timestamp viewed as int64: no copy, no timezone conversion
            out += [(c.view(pa.int64()) if name == "event_time" else c).to_numpy() for c in col.chunks]
    ev, sid, tid = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols)
    starts = np.cumsum([0] + [t.num_rows for t in tables[:-1]])
    return ev.astype(np.int64, copy=False), sid, tid.astype(np.int64, copy=False), starts


def block_order(
    ev: np.ndarray, sid: np.ndarray, tid: np.ndarray, starts: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The blocks of event time in ``(lo, hi]`` ms as (first row, rows) in merged order, or None when
    two blocks of one event time and sender overlap in tuple ids (only a row sort orders those)."""
    n = len(ev)
    cut = np.ones(n, dtype=bool)
    if n > 1:
        # a new block where the event time or the sender changes or the tuple ids skip: a sender's
        # buckets of one millisecond are dealt to several workers, so its next ids may be elsewhere
        np.not_equal(ev[1:], ev[:-1], out=cut[1:])
        cut[1:] |= sid[1:] != sid[:-1]
        cut[1:] |= tid[1:] != tid[:-1] + 1
    cut[starts[starts < n]] = True  # a block never spans two segments: it is copied as one slice
    first = np.flatnonzero(cut)
    count = np.diff(np.append(first, n))
    head = ev[first]
    keep = head <= min(hi, -_US_FLOOR) * 1000
    if lo > _US_FLOOR:
        keep &= head > lo * 1000
    first, count, head = first[keep], count[keep], head[keep]
    t0, by = tid[first], sid[first]
    order = np.lexsort((t0, by, head))  # stable: equal heads keep their plan order
    first, count, head, by, t0 = first[order], count[order], head[order], by[order], t0[order]
    t1 = tid[first + count - 1]
    same = (head[1:] == head[:-1]) & (by[1:] == by[:-1])
    if np.any(same & (t0[1:] <= t1[:-1])):
        return None
    return first, count


def copy_blocks(tables: list[Any], starts: np.ndarray, first: np.ndarray, count: np.ndarray) -> Any:
    """The blocks (first row, rows: positions in ``tables`` end to end) as one table of one chunk, in
    that order. Blocks that follow each other in the same segment make one slice, and the slices
    are joined in one copy (column by column, buffer by buffer): cheaper than a row gather (a
    ``take``), and a single large batch that the reader's ``coalesce`` passes on as it is."""
    import pyarrow as pa

    if not len(first):
        return tables[0].slice(0, 0)
    seg = np.searchsorted(starts, first, side="right") - 1
    # join a block to the one before when it starts where that one ends, in the same segment
    joined = (first[1:] == first[:-1] + count[:-1]) & (seg[1:] == seg[:-1])
    heads = np.flatnonzero(np.concatenate([[True], ~joined]))
    lengths = np.add.reduceat(count, heads)
    pieces = [
        tables[s].slice(o, c)
        for s, o, c in zip(
            seg[heads].tolist(), (first[heads] - starts[seg[heads]]).tolist(), lengths.tolist(), strict=True
        )
    ]
    if len(pieces) == 1:
        return pieces[0]
    return pa.concat_tables(pieces).combine_chunks()
