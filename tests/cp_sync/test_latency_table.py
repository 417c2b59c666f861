"""The one latency table renderer (report.summary): columns, each figure in the unit that suits it
(format_duration), the distinct stamps and what they mean, and full width in a pipe."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from cloudprofiler.report.summary import (
    format_duration,
    latency_table,
    print_latency_table,
    print_table,
    summarize,
)


def _out(stamps: bool = True) -> pa.Table:
    n = 1000
    lat = np.arange(1, n + 1, dtype=np.float64) * 1e3  # 1 .. 1000 us, in ns
    cols = {
        "from_point": ["gen"] * n,
        "to_point": ["sink"] * n,
        "method": ["minrtt"] * n,
        "scenario": ["reference-node"] * n,
        "duration_ns": lat,
        "bound_ns": np.full(n, 2500.0),
    }
    if stamps:  # buckets of 10 records share a gen stamp, 4 batches share the sink stamps
        cols |= {"from_tsc": np.arange(n) // 10 * 7_000, "to_tsc": np.arange(n) // 250 * 3_000_000}
    return pa.table(cols)


def _render(out: pa.Table) -> str:
    buf = io.StringIO()
    print_latency_table(summarize(out), "a title", file=buf)
    return buf.getvalue()


def test_columns_and_each_figure_in_the_unit_of_its_size() -> None:
    t = latency_table(summarize(_out()), "t")
    heads = [str(c.header) for c in t.columns]
    assert heads == [
        "path",
        "method",
        "scenario",
        "count",
        "from stamps",
        "to stamps",
        "p50",
        "p90",
        "p99",
        "max",
        "bound med",
        "bound max",
    ]
    text = _render(_out())
    assert "gen -> sink" in text and "minrtt" in text and "1,000" in text
    assert "1.00 ms" in text and "2.50 us" in text  # max latency, bound
    assert "1,000.000" not in text and "2.500" not in text  # the old fixed 3 decimals of us


def test_distinct_stamps_and_what_they_mean_are_printed_under_the_table() -> None:
    lines = _render(_out()).splitlines()
    body = next(ln for ln in lines if "gen -> sink" in ln)
    cells = [c.strip() for c in body.split("│")[1:-1]]
    assert cells[3:6] == ["1,000", "100", "4"]  # records, distinct gen stamps, distinct sink stamps
    assert lines[-3:] == [
        "gen: 100 distinct stamps over 1,000 records (one per ~10 records)",
        "sink: 4 distinct stamps over 1,000 records (one per ~250 records)",
        "resolution: records that share a stamp (a generator bucket, a micro-batch) share it in every "
        "duration from or to that point, so these durations resolve those groups, not single tuples",
    ]
    # rows without stamps (a table from before they were kept) say so, and claim nothing
    text = _render(_out(stamps=False))
    assert "distinct stamps" not in text and "resolution" not in text
    body = next(ln for ln in text.splitlines() if "gen -> sink" in ln)
    assert [c.strip() for c in body.split("│")[1:-1]][4:6] == ["-", "-"]


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (6_234_567_890.0, "6.23 s"),  # six seconds: not 6,234,567.891 us
        (62_345_678.0, "62.3 ms"),
        (999_700.0, "1.00 ms"),  # rounded before the unit is chosen: not "1,000 us"
        (123_456.0, "123 us"),
        (2_500.0, "2.50 us"),
        (12.345, "12.3 ns"),
        (0.0, "0 ns"),
        (0.000387, "<1 ns"),  # below a TSC cycle: a one-domain bound's rounding margin, not 0.000387 ns
        (-2_500.0, "-2.50 us"),  # a negative duration (a clock's error) keeps its sign
        (12_345e9, "12,300 s"),
        (float("nan"), "n/a"),
    ],
)
def test_format_duration_gives_three_significant_digits_in_the_unit_of_the_size(ns: float, text: str) -> None:
    assert format_duration(ns) == text


def test_a_label_names_the_path() -> None:
    rows = [r | {"label": "end to end"} for r in summarize(_out())]
    buf = io.StringIO()
    print_table(latency_table(rows, "t"), buf)
    assert "end to end (gen -> sink)" in buf.getvalue()


def test_printed_whole_into_a_pipe() -> None:
    rows = [r | {"label": "a rather long path label for the table"} for r in summarize(_out())]
    buf = io.StringIO()  # not a terminal: rich would wrap at 80 columns
    print_latency_table(rows, "t", file=buf)
    lines = buf.getvalue().splitlines()
    body = [ln for ln in lines if "a rather long path label" in ln]
    assert len(body) == 1 and len(body[0]) > 80  # one line per row, nothing wrapped or cut
    assert "bound max" in buf.getvalue()
