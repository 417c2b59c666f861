"""Panes per key (cloudprofiler.windows.pane_state) against a row-by-row count, without Spark.

Random rows of one key arrive in micro-batches under a rising watermark (rows at or behind the
previous watermark are dropped, as Spark drops them before the state); every step goes through the
state blob. Append must emit every window the final watermark closes exactly once, in the step
whose watermark reached it, with the aggregates of all its rows; update must emit, per step, every
window a row of that step fell in, with the aggregates of all rows so far.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudprofiler.windows import pane_state as P

FUNCS = ("count", "count", "sum", "sum", "min", "max", "mean", "min", "max")
COLS = (None, "i", "i", "f", "i", "i", "i", "f", "f")  # None: count(*)


def _layout(size: int, slide: int) -> P.PaneLayout:
    floats = tuple(f == "mean" or (f != "count" and c == "f") for f, c in zip(FUNCS, COLS, strict=True))
    return P.PaneLayout(size, slide, math.gcd(size, slide), FUNCS, floats)


def _truth(rows: list[tuple[int, int | None]], end: int, size: int) -> tuple[Any, ...]:
    """The aggregates of the window ending at ``end`` over ``rows`` (t, value or None), one by one."""
    inside = [v for t, v in rows if end - size <= t < end]
    vals = [v for v in inside if v is not None]
    out: list[Any] = []
    for func, col in zip(FUNCS, COLS, strict=True):
        if func == "count":
            out.append(len(inside) if col is None else len(vals))
        elif not vals:
            out.append(None)
        elif func == "sum":
            out.append(sum(vals) if col == "i" else float(sum(vals)))
        elif func == "min":
            out.append(min(vals) if col == "i" else float(min(vals)))
        elif func == "max":
            out.append(max(vals) if col == "i" else float(max(vals)))
        else:
            out.append(sum(vals) / len(vals))
    return tuple(out)


def _ends(rows: list[tuple[int, int | None]], size: int, slide: int) -> set[int]:
    ends = set()
    for t, _ in rows:
        s = (t // slide) * slide
        while s > t - size:
            ends.add(s + size)
            s -= slide
    return ends


def _batch(layout: P.PaneLayout, rows: list[tuple[int, int | None]]) -> P.Panes:
    t = np.array([r[0] for r in rows], np.int64)
    null = np.array([r[1] is None for r in rows], bool)
    x = np.array([0 if r[1] is None else r[1] for r in rows], np.int64)
    cols = [None if c is None else (x if c == "i" else x.astype(np.float64)) for c in COLS]
    nulls = [None if c is None else null for c in COLS]
    return P.rows_to_panes(t, cols, nulls, layout)


def _emitted(layout: P.PaneLayout, ends: Any, values: Any, counts: Any) -> dict[int, tuple[Any, ...]]:
    cols = [P.finish(f, v, c) for f, v, c in zip(layout.funcs, values, counts, strict=True)]
    return {int(e): tuple(col[i] for col in cols) for i, e in enumerate(ends)}


def _run(
    batches: list[list[tuple[int, int | None]]], marks: list[int], size: int, slide: int, mode: str
) -> tuple[list[dict[int, tuple[Any, ...]]], list[tuple[int, int | None]]]:
    """Every step through the state blob; the rows Spark would keep (after the previous watermark)."""
    layout = _layout(size, slide)
    state: tuple[Any, ...] | None = None
    out, kept, previous = [], [], -(2**63)
    for rows, mark in zip(batches, marks, strict=True):
        rows = [r for r in rows if r[0] > previous]
        kept += rows
        panes, done = P.from_state(state, layout) if state else (P.empty_panes(layout), -(2**63))
        batch = _batch(layout, rows) if rows else None
        ends, values, counts, panes, done = P.step(panes, done, batch, mark, mode, layout)
        out.append(_emitted(layout, ends, values, counts))
        state = P.to_state(panes, done, layout) if len(panes.starts) else None
        previous = mark
    return out, kept


rows_st = st.lists(st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(-50, 50))), max_size=12)


@st.composite
def runs(draw: Any) -> tuple[list[list[tuple[int, int | None]]], list[int], int, int]:
    slide = draw(st.integers(1, 6)) * 1000
    size = draw(st.integers(1, 5)) * slide + draw(st.sampled_from([0, slide // 2, slide // 3]))
    size = max(size, slide)
    batches, marks, mark = [], [], 0
    for _ in range(draw(st.integers(1, 6))):
        rows = [(mark + dt * 500 - 5000, v) for dt, v in draw(rows_st)]
        batches.append([(max(t, 0), v) for t, v in rows])
        mark += draw(st.integers(0, 8)) * 1000
        marks.append(mark)
    return batches, marks, size, slide


@settings(max_examples=300, deadline=None)
@given(runs())
def test_append_emits_each_closed_window_once_with_all_its_rows(run: Any) -> None:
    batches, marks, size, slide = run
    out, kept = _run(batches, marks, size, slide, "append")
    seen: dict[int, tuple[Any, ...]] = {}
    previous = -(2**63)
    for step_out, mark in zip(out, marks, strict=True):
        for end, value in step_out.items():
            assert previous < end <= mark, "a window came out before its end or twice"
            assert end not in seen
            seen[end] = value
        previous = max(previous, mark)
    due = {e for e in _ends(kept, size, slide) if e <= marks[-1]}
    assert set(seen) == due
    for end, value in seen.items():
        assert value == _truth(kept, end, size)


@settings(max_examples=300, deadline=None)
@given(runs())
def test_update_emits_every_touched_window_with_all_rows_so_far(run: Any) -> None:
    batches, marks, size, slide = run
    out, _ = _run(batches, marks, size, slide, "update")
    so_far: list[tuple[int, int | None]] = []
    previous = -(2**63)
    for rows, step_out, mark in zip(batches, out, marks, strict=True):
        rows = [r for r in rows if r[0] > previous]
        so_far += rows
        assert set(step_out) == _ends(rows, size, slide)
        for end, value in step_out.items():
            assert value == _truth(so_far, end, size)
        previous = mark


def test_a_pane_goes_once_its_last_window_is_out_and_the_timeout_precedes_the_next_end() -> None:
    layout = _layout(4000, 1000)
    panes = _batch(layout, [(500, 1), (2500, 2), (9000, 3)])
    ends, _, _, kept, done = P.step(P.empty_panes(layout), -(2**63), panes, 4000, "append", layout)
    assert ends.tolist() == [1000, 2000, 3000, 4000]
    assert kept.starts.tolist() == [2000, 9000]  # pane 0 is in windows ending up to 4 ms only
    assert done == 4000
    # (times in us) the next window ends at 5 ms: Spark calls back once the watermark passes 4 ms
    assert P.next_due_ms(kept, done, "append", layout) == 4
    ends, _, _, kept, _ = P.step(kept, done, None, 6000, "append", layout)
    assert ends.tolist() == [5000, 6000]
    assert kept.starts.tolist() == [9000]
    assert P.next_due_ms(kept, 6000, "update", layout) == 12  # its last window ends at 13 ms


def test_a_blob_of_the_wrong_size_or_layout_is_refused() -> None:
    layout = _layout(4000, 1000)
    blob = P.to_state(_batch(layout, [(500, 1)]), 0, layout)[0]
    assert P.from_state((blob,), layout)[0].starts.tolist() == [0]
    for bad in (blob[:-8], blob + b"\0" * 8, blob[:5], b""):
        with pytest.raises(ValueError, match="does not fit 9 aggregates"):
            P.from_state((bad,), layout)
    # the same number of aggregates, another type or window: named, never misread
    for other in (_layout(5000, 1000), P.PaneLayout(4000, 1000, 1000, FUNCS, (True,) * 9)):
        with pytest.raises(ValueError, match="start this query on a new checkpoint"):
            P.from_state((blob,), other)


def test_nan_is_above_every_number_as_in_spark() -> None:
    layout = P.PaneLayout(1000, 1000, 1000, ("min", "max"), (True, True))
    t = np.array([0, 1, 2], np.int64)
    x = np.array([np.nan, 2.0, 1.0])
    panes = P.rows_to_panes(t, [x, x], [None, None], layout)
    assert panes.values[0].tolist() == [1.0]
    assert math.isnan(panes.values[1][0])
