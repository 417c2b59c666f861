"""Several (size, slide) windows from one pane computation (cloudprofiler.windows.multi) against Spark's
native window aggregation per spec, on the same tuples, row for row."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudprofiler.windows import multi as M

SCHEMA = "id long, k int, v long, d double, t timestamp"
AGGS = [("count", "*"), ("count", "v"), ("sum", "v"), ("sum", "d"), ("min", "v"), ("max", "d"), ("mean", "v")]


def _frame(spark: Any, drawn: list[tuple[int, int | None, int | None]]) -> Any:
    from datetime import UTC, datetime, timedelta

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    rows = [
        (i, k, v, None if v is None else float(v), None if ms is None else epoch + timedelta(milliseconds=ms))
        for i, (k, v, ms) in enumerate(drawn)
    ]
    return spark.createDataFrame(rows, SCHEMA)


def _assert_same(df: Any, specs: list[tuple[str, str]]) -> Counter[tuple[Any, ...]]:
    shared = M.multi_window_agg(df, "t", specs, ["k"], AGGS)
    native = M.native_multi(df, "t", specs, ["k"], AGGS)
    assert shared.dtypes == native.dtypes
    got, want = Counter(tuple(r) for r in shared.collect()), Counter(tuple(r) for r in native.collect())
    assert got == want, f"{specs}: only shared {got - want}, only native {want - got}"
    return got


def test_specs_are_checked_and_the_pane_is_the_gcd_of_all() -> None:
    assert M.parse_specs([("10 s", "2 s"), (6, 3)]) == [(10_000_000, 2_000_000), (6_000_000, 3_000_000)]
    assert M.pane_of(M.parse_specs([("10 s", "2 s"), (6, 3), ("4 s", "4 s")])) == 1_000_000
    assert M.pane_of(M.parse_specs([("60 s", "10 s"), ("300 s", "30 s")])) == 10_000_000
    for bad, message in [
        ([(5, 10)], "slide must not exceed size"),
        ([(10, 2), (10, 2)], "is given twice"),
        ([], "give 1 to 64 windows"),
        (["10 s"], r"a window is \(size, slide\)"),
        ([("10 parsecs", 1)], "is not '<n> <unit>'"),
    ]:
        with pytest.raises(ValueError, match=message):
            M.parse_specs(bad)


@pytest.mark.long  # a real Spark job: the fast tier keeps its 10 minutes
def test_three_specs_by_hand_and_one_pane_aggregation(spark: Any) -> None:
    """Rows at 0.5, 1.5, 2.5 and 3.5 s: 2 s tumbling, 4 s every 2 s, 3 s every 1 s; the panes (1 s)
    are aggregated once, and every spec's windows are merged in one second aggregation."""
    df = _frame(spark, [(0, 1, 500), (0, 2, 1500), (0, 4, 2500), (0, 8, 3500)])
    specs = [("2 s", "2 s"), ("4 s", "2 s"), ("3 s", "1 s")]
    out = _assert_same(df, specs)
    sums = {(r[1], round(r[0]["start"].timestamp()), round(r[0]["end"].timestamp())): r[5] for r in out}
    assert sums == {
        (2_000_000, 0, 2): 3,
        (2_000_000, 2, 4): 12,
        (2_000_000, -2, 2): 3,
        (2_000_000, 0, 4): 15,
        (2_000_000, 2, 6): 12,
        (1_000_000, -2, 1): 1,
        (1_000_000, -1, 2): 3,
        (1_000_000, 0, 3): 7,
        (1_000_000, 1, 4): 14,
        (1_000_000, 2, 5): 12,
        (1_000_000, 3, 6): 8,
    }
    plan = M.multi_window_agg(df, "t", specs, ["k"], AGGS)._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("Aggregate") == 2  # panes once, windows once, for the three specs


def test_a_stream_and_a_clashing_name_are_refused(spark: Any, tmp_path: Any) -> None:
    df = _frame(spark, [(0, 1, 500)])
    with pytest.raises(ValueError, match="'slide_us' names the spec"):
        M.multi_window_agg(df.withColumnRenamed("k", "slide_us"), "t", [(4, 2)], ["slide_us"])
    stream = spark.readStream.schema(SCHEMA).parquet(str(tmp_path))
    with pytest.raises(ValueError, match="takes a batch DataFrame"):
        M.multi_window_agg(stream, "t", [(4, 2)], ["k"])


rows_st = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.one_of(st.none(), st.integers(-50, 50)),
        st.one_of(st.none(), st.integers(-20_000, 120_000)),
    ),
    max_size=50,
)
spec_st = st.integers(1, 6).flatmap(lambda slide: st.tuples(st.integers(slide, 5 * slide), st.just(slide)))


@pytest.mark.long  # four examples of two aggregations each: about 20 s under load
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=rows_st,
    specs=st.lists(spec_st, min_size=1, max_size=4, unique=True),
    unit=st.sampled_from([250, 1000]),
)
def test_equals_native_per_spec_on_random_data(
    spark: Any, drawn: list[tuple[int, int | None, int | None]], specs: list[tuple[int, int]], unit: int
) -> None:
    _assert_same(_frame(spark, drawn), [(f"{a * unit} ms", f"{b * unit} ms") for a, b in specs])
