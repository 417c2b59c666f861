"""The ready slice's k-way merge of sorted runs gives exactly the rows, in exactly the order, of the
full (event time, sender id, tuple id) sort it replaces, ties included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cp_source.ready.batch_plan import merge_sorted, select_rows
from cp_source.ready.frontier import NO_FRONTIER
from cp_source.ready.run_merge import block_order, merge_slice, slice_keys

SCHEMA = pa.schema(
    [
        ("payload", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("tuple_id", pa.int64()),
        ("sender_id", pa.int32()),
    ]
)
Bucket = tuple[int, int, int, int]  # sender, event time ms, first tuple id, rows


def segment(buckets: list[Bucket]) -> pa.Table:
    """A segment as the factory writes it: whole buckets in arrival order, a bucket's rows sharing its
    event time and sender, tuple ids counting up from its first; the payload names each row."""
    ev, tid, sid, payload = [], [], [], []
    for s, ms, first, n in buckets:
        for i in range(n):
            ev.append(ms * 1000)
            tid.append(first + i)
            sid.append(s)
            payload.append(f"{s}:{first + i}:{len(payload)}")
    return pa.table(
        [
            pa.array(payload, pa.string()),
            pa.array(ev, pa.int64()).cast(SCHEMA.field("event_time").type),
            pa.array(tid, pa.int64()),
            pa.array(sid, pa.int32()),
        ],
        schema=SCHEMA,
    )


def reference(tables: list[pa.Table], lo: int, hi: int) -> pa.Table | None:
    """The full sort the merge replaces (Arrow's stable sort)."""
    return merge_sorted([select_rows(t, lo, hi) for t in tables])


def assert_same(tables: list[pa.Table], lo: int, hi: int) -> pa.Table:
    got, want = merge_slice(tables, lo, hi), reference(tables, lo, hi)
    assert want is not None and got is not None
    assert got.schema == want.schema
    assert got.to_pydict() == want.to_pydict()
    return got


@st.composite
def spools(draw: st.DrawFn, keep_contract: bool) -> list[pa.Table]:
    """Senders' buckets (event times never going back when ``keep_contract``) dealt out to segments
    in arrival order, as a factory's workers would receive them."""
    n_senders = draw(st.integers(1, 4))
    n_segments = draw(st.integers(1, 5))
    segments: list[list[Bucket]] = [[] for _ in range(n_segments)]
    for s in range(n_senders):
        ms, seq = 1000, 0
        for _ in range(draw(st.integers(0, 8))):
            ms = ms + draw(st.integers(0, 3)) if keep_contract else draw(st.integers(1000, 1010))
            n = draw(st.integers(1, 4))
            segments[draw(st.integers(0, n_segments - 1))].append((s, ms, (s << 39) | seq, n))
            seq += n
    # buckets of several senders interleave in a segment; a sender's own stay in seq order
    for buckets in segments:
        order = draw(st.permutations(range(len(buckets))))
        by_sender: dict[int, list[Bucket]] = {}
        for b in buckets:
            by_sender.setdefault(b[0], []).append(b)
        buckets[:] = [by_sender[buckets[i][0]].pop(0) for i in order]
    return [segment(b) for b in segments]


@settings(max_examples=100, deadline=None)
@given(spools(keep_contract=True), st.integers(998, 1012), st.integers(0, 12))
def test_random_sorted_runs_merge_to_exactly_the_sorted_order(tables: list, lo: int, width: int) -> None:
    keys = slice_keys(tables)
    assert keys is not None and block_order(*keys, lo, lo + width) is not None  # merged, not sorted
    assert_same(tables, lo, lo + width)
    assert_same(tables, NO_FRONTIER, lo + width)


@settings(max_examples=50, deadline=None)
@given(spools(keep_contract=False), st.integers(998, 1012))
def test_runs_that_break_the_contract_still_come_out_in_sorted_order(tables: list, hi: int) -> None:
    assert_same(tables, NO_FRONTIER, hi)


def test_ties_go_by_sender_then_tuple_id_then_plan_order() -> None:
    # one event time everywhere: sender 2 before sender 1 in the segments, and sender 1's ids
    # split across two segments with the higher ones first
    a = segment([(2, 5, 200, 2), (1, 5, 13, 2)])
    b = segment([(1, 5, 10, 3)])
    keys = slice_keys([a, b])
    assert keys is not None
    first, count = block_order(*keys, 0, 5)  # type: ignore[misc]
    assert first.tolist() == [4, 2, 0] and count.tolist() == [3, 2, 2]
    got = assert_same([a, b], 0, 5)
    assert got.column("tuple_id").to_pylist() == [10, 11, 12, 13, 14, 200, 201]
    # a tuple id sent twice: blocks cannot order it, the sort does, the earlier segment's row first
    c, d = segment([(1, 5, 10, 2)]), segment([(1, 5, 11, 2)])
    keys = slice_keys([c, d])
    assert keys is not None and block_order(*keys, 0, 5) is None
    got = assert_same([c, d], 0, 5)
    assert got.column("payload").to_pylist() == ["1:10:0", "1:11:1", "1:11:0", "1:12:1"]


def test_one_sorted_run_is_handed_out_without_a_copy() -> None:
    t = segment([(1, 5, 10, 3), (1, 6, 13, 2), (1, 9, 15, 4)])
    got = assert_same([t], 5, 6)  # (5, 6]: the middle bucket alone
    assert got.column("tuple_id").to_pylist() == [13, 14]
    src = t.column("payload").chunk(0).buffers()[2]
    assert got.column("payload").chunk(0).buffers()[2].address == src.address


def test_empty_runs_and_empty_ranges() -> None:
    assert merge_slice([], 0, 10) is None
    empty = segment([])
    assert merge_slice([empty, empty], 0, 10).num_rows == 0
    t = segment([(1, 5, 10, 3)])
    got = assert_same([empty, t, empty], 0, 10)
    assert got.num_rows == 3
    assert merge_slice([t], 5, 10).num_rows == 0  # (5, 10] leaves the bucket at 5 out
    assert merge_slice([t], NO_FRONTIER, 4).num_rows == 0


def test_a_null_key_falls_back_to_the_sort() -> None:
    t = segment([(1, 5, 10, 2), (2, 4, 20, 1)])
    ids = pa.array([None, 11, 20], pa.int64())
    t = t.set_column(t.schema.get_field_index("tuple_id"), "tuple_id", ids)
    assert slice_keys([t]) is None
    assert_same([t], 0, 10)


def test_blocks_are_cut_where_the_event_time_sender_or_id_order_changes() -> None:
    t = segment([(1, 5, 10, 2), (1, 5, 12, 2), (2, 5, 20, 1), (1, 5, 30, 1), (1, 4, 5, 2), (1, 4, 8, 1)])
    keys = slice_keys([t])
    assert keys is not None
    first, count = block_order(*keys, 0, 10)  # type: ignore[misc]
    # the first two buckets join (one time and sender, consecutive ids); the others stand alone,
    # the last two because id 7 is elsewhere (another worker's segment)
    blocks = list(zip(first.tolist(), count.tolist(), strict=True))
    assert blocks == [(6, 2), (8, 1), (0, 4), (5, 1), (4, 1)]
    assert np.array_equal(keys[3], [0])
