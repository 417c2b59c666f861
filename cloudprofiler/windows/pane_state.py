"""Shared sliding windows in a stream through one stateful operator: panes per key, windows from panes.

Spark chains two stateful aggregations (panes, then windows) in append mode only, and each costs a
state store commit per micro-batch. Here the panes live in Spark's per-group state instead
(``applyInPandasWithState``): each micro-batch's rows of a key are reduced to one partial per pane
(Enorm's *compute*), merged into the key's panes, and the windows are made from the panes
(Enorm's *consolidate*) when they are due:

* **append**: a window is emitted once, when the watermark reaches its end (as Spark's window
  aggregation emits it), and a pane is dropped once every window that holds it is out;
* **update**: every window holding a pane that received rows is emitted with its new value (as
  Spark's update mode emits each window a micro-batch changed), and panes are dropped when the
  watermark passes their last window.

Spark drops a row at or behind the watermark before it reaches the state (the whole row, where its
window aggregation drops it per window; docs/windows.md). The arithmetic here is plain NumPy over
one key's panes, so it is tested without Spark against a row-by-row count.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double")
_I64 = np.iinfo(np.int64)


@dataclass(frozen=True)
class PaneLayout:
    """What a key's state holds: panes of ``pane_us``, one partial (value, non-null count) per aggregate."""

    size_us: int
    slide_us: int
    pane_us: int
    funcs: tuple[str, ...]  # count, sum, min, max or mean, one per aggregate
    floats: tuple[bool, ...]  # the partial value is a double (else a bigint)

    def state_ddl(self) -> str:
        """The state's schema: one binary blob (:func:`to_state`). PySpark's group state does not
        take array columns, and a blob of fixed-width words decodes without a copy per element."""
        return "blob binary"


@dataclass
class Panes:
    """One key's panes, sorted by start, with each aggregate's partial value and non-null count."""

    starts: np.ndarray  # int64 microseconds
    values: list[np.ndarray]
    counts: list[np.ndarray]


def _identity(func: str, is_float: bool) -> float | int:
    """The value a partial without values holds, neutral for its reduction."""
    if func == "min":
        return np.inf if is_float else _I64.max
    if func == "max":
        return -np.inf if is_float else _I64.min
    return 0


def reduce_by_pane(
    keys: np.ndarray, values: list[np.ndarray], counts: list[np.ndarray], layout: PaneLayout
) -> Panes:
    """Group items by pane start ``keys`` and reduce each aggregate: counts and sums add, min and max
    take the least and greatest of the items that have values. Rows and partials reduce alike (a
    row is a partial of count 1, or 0 where its value is null)."""
    order = np.argsort(keys, kind="stable")  # stable: a double sum adds in arrival order
    keys = keys[order]
    if len(keys) == 0:
        return Panes(keys.astype(np.int64), [v[:0] for v in values], [c[:0] for c in counts])
    heads = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    out_v, out_c = [], []
    for func, is_float, v, c in zip(layout.funcs, layout.floats, values, counts, strict=True):
        v, c = v[order], c[order]
        empty = _identity(func, is_float)
        v = np.where(c > 0, v, empty)
        if func == "min":
            # Spark orders NaN above every number: a min ignores it unless nothing else is there
            red = np.fmin.reduceat(v, heads) if is_float else np.minimum.reduceat(v, heads)
        elif func == "max":
            red = np.maximum.reduceat(v, heads)
        else:
            red = np.add.reduceat(v, heads)
        n = np.add.reduceat(c, heads)
        out_v.append(np.where(n > 0, red, 0).astype(v.dtype))
        out_c.append(n.astype(np.int64))
    return Panes(keys[heads].astype(np.int64), out_v, out_c)


def rows_to_panes(
    t_us: np.ndarray,
    columns: Sequence[np.ndarray | None],
    nulls: Sequence[np.ndarray | None],
    layout: PaneLayout,
) -> Panes:
    """One micro-batch's rows of one key as pane partials (``None`` column: ``count(*)``)."""
    keys = (t_us // layout.pane_us) * layout.pane_us
    values, counts = [], []
    for func, is_float, col, null in zip(layout.funcs, layout.floats, columns, nulls, strict=True):
        dtype = np.float64 if is_float else np.int64
        if col is None:
            values.append(np.zeros(len(t_us), dtype))
            counts.append(np.ones(len(t_us), np.int64))
            continue
        ok = np.ones(len(t_us), bool) if null is None else ~null
        x = np.where(ok, col, 0).astype(dtype) if func != "count" else np.zeros(len(t_us), dtype)
        values.append(x)
        counts.append(ok.astype(np.int64))
    return reduce_by_pane(keys, values, counts, layout)


def merge(a: Panes, b: Panes, layout: PaneLayout) -> Panes:
    """The panes of ``a`` and ``b`` together, partials of the same pane reduced into one."""
    return reduce_by_pane(
        np.concatenate([a.starts, b.starts]),
        [np.concatenate([x, y]) for x, y in zip(a.values, b.values, strict=True)],
        [np.concatenate([x, y]) for x, y in zip(a.counts, b.counts, strict=True)],
        layout,
    )


def window_ends(starts: np.ndarray, layout: PaneLayout) -> np.ndarray:
    """The sorted ends of every window holding at least one of the panes ``starts``.

    Window starts are multiples of the slide; a pane at ``p`` lies in the windows starting in
    ``(p - size, p]``, ``ceil(size / slide)`` of them at most.
    """
    if len(starts) == 0:
        return np.zeros(0, np.int64)
    last = (starts // layout.slide_us) * layout.slide_us  # the latest window start holding the pane
    overlap = -(-layout.size_us // layout.slide_us)
    cand = last[:, None] - np.arange(overlap, dtype=np.int64)[None, :] * layout.slide_us
    cand = cand[cand > starts[:, None] - layout.size_us]
    return np.unique(cand) + layout.size_us


def last_window_end(starts: np.ndarray, layout: PaneLayout) -> np.ndarray:
    """Per pane, the end of the last window holding it: the pane is needed until the watermark gets there."""
    return (starts // layout.slide_us) * layout.slide_us + layout.size_us


def windows(panes: Panes, ends: np.ndarray, layout: PaneLayout) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each aggregate's (value, non-null count) over the windows ending at ``ends`` (each holding a pane)."""
    lo = np.searchsorted(panes.starts, ends - layout.size_us, "left")
    hi = np.searchsorted(panes.starts, ends, "left")
    sizes = hi - lo
    if len(ends) == 0:
        return [v[:0] for v in panes.values], [c[:0] for c in panes.counts]
    # every window's pane indexes one after another, then one reduction per window (segments overlap)
    heads = np.r_[0, np.cumsum(sizes)[:-1]]
    idx = np.repeat(lo - heads, sizes) + np.arange(sizes.sum())
    window_of = np.repeat(np.arange(len(ends), dtype=np.int64), sizes)
    red = reduce_by_pane(window_of, [v[idx] for v in panes.values], [c[idx] for c in panes.counts], layout)
    return red.values, red.counts


def empty_panes(layout: PaneLayout) -> Panes:
    return Panes(
        np.zeros(0, np.int64),
        [np.zeros(0, np.float64 if f else np.int64) for f in layout.floats],
        [np.zeros(0, np.int64) for _ in layout.floats],
    )


def layout_tag(layout: PaneLayout) -> int:
    """A number naming the layout, kept in every state blob: a checkpoint written by another window
    size, slide or list of aggregates is refused rather than misread."""
    text = f"{layout.size_us}/{layout.slide_us}/{layout.pane_us}/{','.join(layout.funcs)}/{layout.floats}"
    return zlib.crc32(text.encode())


def from_state(state: tuple[Any, ...], layout: PaneLayout) -> tuple[Panes, int]:
    """The panes and the ``done`` end kept by :func:`to_state`; a blob of another layout is refused."""
    blob = bytes(state[0])
    words = len(blob) // 8
    k = len(layout.funcs)
    n = (words - 3) // (1 + 2 * k) if words >= 3 else -1
    if len(blob) % 8 or n < 0 or words != 3 + n * (1 + 2 * k):
        raise ValueError(f"shared-window state of {len(blob)} bytes does not fit {k} aggregates")
    ints = np.frombuffer(blob, np.int64)
    if int(ints[0]) != layout_tag(layout):
        raise ValueError(
            "shared-window state was written for another window size, slide or list of aggregates: "
            "start this query on a new checkpoint"
        )
    done = int(ints[1])
    starts = ints[3 : 3 + n].copy()
    values, counts = [], []
    at = 3 + n
    for fl in layout.floats:
        v = np.frombuffer(blob, np.float64 if fl else np.int64, n, at * 8).copy()
        values.append(v)
        counts.append(ints[at + n : at + 2 * n].copy())
        at += 2 * n
    return Panes(starts, values, counts), done


def to_state(panes: Panes, done: int, layout: PaneLayout) -> tuple[Any, ...]:
    """One blob of 8-byte words: the layout's tag, done, the pane count, the starts, then each
    aggregate's values and counts."""
    parts = [np.array([layout_tag(layout), done, len(panes.starts)], np.int64), panes.starts.astype(np.int64)]
    for v, c in zip(panes.values, panes.counts, strict=True):
        parts += [v, c.astype(np.int64)]
    return (b"".join(p.tobytes() for p in parts),)


def keep(panes: Panes, mask: np.ndarray) -> Panes:
    return Panes(panes.starts[mask], [v[mask] for v in panes.values], [c[mask] for c in panes.counts])


def finish(func: str, values: np.ndarray, counts: np.ndarray) -> list[Any]:
    """A window's aggregate from its merged partial: count is the count; sum, min and max are null
    without values; a mean is the double sum over the count, null without values."""
    if func == "count":
        return counts.tolist()
    if func == "mean":
        return [
            float(v) / float(n) if n else None for v, n in zip(values.tolist(), counts.tolist(), strict=True)
        ]
    return [v if n else None for v, n in zip(values.tolist(), counts.tolist(), strict=True)]


def step(
    panes: Panes,
    done: int,
    batch: Panes | None,
    watermark_us: int,
    mode: str,
    layout: PaneLayout,
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], Panes, int]:
    """One invocation for one key: merge the batch's panes, then (window ends out, values, counts,
    panes kept, new ``done``). ``watermark_us`` is the watermark of this micro-batch (microseconds)."""
    if batch is not None and len(batch.starts):
        panes = merge(panes, batch, layout)
    if mode == "append":
        ends = window_ends(panes.starts, layout)
        ends = ends[(ends > done) & (ends <= watermark_us)]
        done = max(done, watermark_us)
    else:
        ends = window_ends(batch.starts, layout) if batch is not None else np.zeros(0, np.int64)
    values, counts = windows(panes, ends, layout)
    panes = keep(panes, last_window_end(panes.starts, layout) > watermark_us)
    return ends, values, counts, panes, done


def next_due_ms(panes: Panes, done: int, mode: str, layout: PaneLayout) -> int | None:
    """The event-time timeout for a key: in append, just before its next window is due; in update,
    just before its first pane can go. None when nothing is pending."""
    if not len(panes.starts):
        return None
    if mode == "append":
        ends = window_ends(panes.starts, layout)
        ends = ends[ends > done]
        if not len(ends):
            return None
        due = int(ends[0])
    else:
        due = int(last_window_end(panes.starts, layout).min())
    # Spark times a key out once the watermark passes the timestamp; a window is due at its end
    return -(-due // 1000) - 1


def make_state_func(
    layout: PaneLayout,
    by: Sequence[str],
    time_col: str,
    agg_cols: Sequence[str | None],
    out_names: Sequence[str],
    mode: str,
    watermarked: bool = True,
) -> Any:
    """The function for ``applyInPandasWithState``: rows of one key in, that key's due windows out."""
    import pandas as pd  # type: ignore[import-untyped]

    def func(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        panes, done = from_state(state.get, layout) if state.exists else (empty_panes(layout), _I64.min)
        batch = None
        if not state.hasTimedOut:
            frames = [p for p in pdfs if len(p)]
            if frames:
                pdf = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
                t_us = pdf[time_col].to_numpy(np.int64)
                cols: list[np.ndarray | None] = []
                nulls: list[np.ndarray | None] = []
                for name in agg_cols:
                    if name is None:
                        cols.append(None)
                        nulls.append(None)
                        continue
                    s = pdf[name]
                    null = s.isna().to_numpy()
                    cols.append(s.fillna(0).to_numpy())
                    nulls.append(null if null.any() else None)
                batch = rows_to_panes(t_us, cols, nulls, layout)
        # without a watermark nothing is ever due in append, and no pane goes in update
        watermark_us = int(state.getCurrentWatermarkMs()) * 1000 if watermarked else int(_I64.min)
        ends, values, counts, panes, done = step(panes, done, batch, watermark_us, mode, layout)
        if len(panes.starts):
            state.update(to_state(panes, done, layout))
            due = next_due_ms(panes, done, mode, layout)
            if due is not None and watermarked:
                state.setTimeoutTimestamp(max(due, int(state.getCurrentWatermarkMs())))
        else:
            state.remove()
        if len(ends):
            n = len(ends)
            out: dict[str, Any] = {"_ws": ends - layout.size_us, "_we": ends}
            for name, value in zip(by, key, strict=True):
                out[name] = [value.item() if hasattr(value, "item") else value] * n
            for name, func_name, v, c in zip(out_names, layout.funcs, values, counts, strict=True):
                out[name] = pd.Series(finish(func_name, v, c), dtype=object)
            yield pd.DataFrame(out)

    return func
