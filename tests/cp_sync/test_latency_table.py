"""The one latency table renderer (cp_sync.report): columns, units, and full width in a pipe."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from cp_sync.report import latency_table, print_latency_table, print_table, summarize


def _out() -> pa.Table:
    n = 1000
    lat = np.arange(1, n + 1, dtype=np.float64) * 1e3  # 1 .. 1000 us, in ns
    return pa.table(
        {
            "from_point": ["gen"] * n,
            "to_point": ["sink"] * n,
            "method": ["minrtt"] * n,
            "scenario": ["reference-node"] * n,
            "duration_ns": lat,
            "bound_ns": np.full(n, 2500.0),
        }
    )


def _render(**kw: object) -> str:
    buf = io.StringIO()
    print_latency_table(summarize(_out()), "a title", file=buf, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


def test_columns_and_figures_in_us() -> None:
    t = latency_table(summarize(_out()), "t")
    heads = [str(c.header) for c in t.columns]
    assert heads == [
        "path",
        "method",
        "scenario",
        "count",
        "p50 us",
        "p90 us",
        "p99 us",
        "max us",
        "bound med us",
        "bound max us",
    ]
    text = _render()
    assert "gen -> sink" in text and "minrtt" in text and "1,000" in text
    assert "1,000.000" in text and "2.500" in text  # max latency, bound (us)


def test_ms_scales_every_figure_and_a_label_names_the_path() -> None:
    rows = [r | {"label": "end to end"} for r in summarize(_out())]
    buf = io.StringIO()
    print_table(latency_table(rows, "t", unit="ms"), buf)
    text = buf.getvalue()
    assert "end to end (gen -> sink)" in text
    assert "p50 ms" in text and "1.000" in text and "0.003" in text  # max 1 ms, bound 2.5 us
    with pytest.raises(ValueError, match="unit"):
        latency_table(rows, "t", unit="s")  # type: ignore[arg-type]


def test_printed_whole_into_a_pipe() -> None:
    rows = [r | {"label": "a rather long path label for the table"} for r in summarize(_out())]
    buf = io.StringIO()  # not a terminal: rich would wrap at 80 columns
    print_latency_table(rows, "t", file=buf)
    lines = buf.getvalue().splitlines()
    body = [ln for ln in lines if "a rather long path label" in ln]
    assert len(body) == 1 and len(body[0]) > 80  # one line per row, nothing wrapped or cut
    assert "bound max us" in buf.getvalue()
