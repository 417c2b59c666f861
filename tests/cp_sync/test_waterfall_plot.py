"""The report's waterfall: the records at p50, p90, p99 and max with their stages, the bar drawn from
the same rows, the line on what dominates, and what a bad table is told."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from cloudprofiler.report.waterfall_plot import (
    WaterfallError,
    bar_figure,
    bar_values,
    dominance_line,
    quantile_rows,
    table_note,
    time_figure,
    time_values,
    waterfall_of,
)
from tests.helpers.waterfall_run import STAGES, waterfall_table

COLUMNS = [f"stage_{a}_{b}_ns" for a, b, _ in STAGES]


def test_each_row_is_the_record_at_its_quantile_and_its_stages_add_up() -> None:
    ids = np.arange(1000)
    table = waterfall_table(ids, np.linspace(0.0, 20.0, 1000))
    wf = waterfall_of(table, ids < 100)  # the first 100 records: the warm-up, not in the table
    rows = quantile_rows(wf)
    e2e = table["e2e_ns"].to_numpy()[100:]
    ranked = ids[100:][np.lexsort((ids[100:], e2e))]
    # nearest rank over 900 records: the 450th, 810th, 891st and 900th
    assert [(r.quantile, r.tuple_id) for r in rows] == [
        ("p50", ranked[449]), ("p90", ranked[809]), ("p99", ranked[890]), ("max", ranked[899])
    ]  # fmt: skip
    for r in rows:
        assert sum(r.stage_ns) == r.e2e_ns == table["e2e_ns"][r.tuple_id].as_py()
        assert list(r.stage_ns) == [table[c][r.tuple_id].as_py() for c in COLUMNS]
    drawn = bar_values(bar_figure(wf, rows, "ms"))  # a block's height: its top less its bottom
    assert list(drawn) == [r.quantile for r in rows]
    for r in rows:
        assert drawn[r.quantile] == pytest.approx(dict(zip(COLUMNS, np.array(r.stage_ns) / 1e6, strict=True)))
    assert table_note(wf) == (
        "900 records: each row is the record at that quantile of end to end (nearest rank), its stages add "
        "up to its end to end; 100 warm-up records not in the table"
    )


def _four(stage_ms: list[list[float]]) -> pa.Table:
    """A waterfall of len(stage_ms) records with the given stages (ms)."""
    table = waterfall_table(np.arange(len(stage_ms)), np.arange(len(stage_ms), dtype=np.float64))
    ns = np.array(stage_ms) * 1e6
    for j, c in enumerate(COLUMNS):
        table = table.set_column(table.schema.get_field_index(c), c, pa.array(ns[:, j]))
    e2e = table.schema.get_field_index("e2e_ns")
    return table.set_column(e2e, "e2e_ns", pa.array(ns.sum(axis=1)))


def test_the_line_names_the_stage_that_dominates_and_what_would_shorten_it() -> None:
    # p50 of four records is the 2nd by end to end (the query), p99 and max the 4th (held or behind)
    table = _four([[0, 1, 2, 0, 1, 0], [0, 1, 2, 1, 20, 1], [1, 1, 3, 1, 1, 90], [200, 5, 3, 1, 1, 0]])
    wf = waterfall_of(table)
    assert dominance_line(wf, quantile_rows(wf)) == (
        "at p50 (25.0 ms end to end) the query dominates (20.0 ms, 80%): a cheaper query or more partitions "
        "would shorten it; at p99 (210 ms end to end) held or behind dominates (200 ms, 95%): a spool that "
        "drains faster (a cheaper query, a larger spool) or more senders (the generator was held by a full "
        "spool or ran behind its schedule) would shorten it"
    )
    table = _four([[0, 0, 300, 1, 1, 0], [0, 0, 1, 1, 1, 9], [0, 9, 1, 1, 1, 0], [0, 0, 0, 0, 0, 800]])
    wf = waterfall_of(table)
    line = dominance_line(wf, quantile_rows(wf))
    assert (
        "at p50 (12.0 ms end to end) transport and parse dominates (9.00 ms, 75%): more factory workers"
        in line
    )
    assert "at p99 (800 ms end to end) commit dominates (800 ms, 100%): a faster sink store" in line


def test_records_without_every_stage_are_counted_not_summarised() -> None:
    table = _four([[0, 1, 2, 0, 1, 0], [0, 1, 2, 1, 20, 1], [1, 1, 3, 1, 1, 90], [200, 5, 3, 1, 1, 0]])
    col = table.schema.get_field_index(COLUMNS[2])
    table = table.set_column(col, COLUMNS[2], pa.array([2e6, 2e6, np.nan, 3e6]))  # no relation: NaN
    wf = waterfall_of(table)
    assert [r.tuple_id for r in quantile_rows(wf)] == [1, 3, 3, 3]
    assert table_note(wf).endswith("; 1 records without a figure for every stage left out")
    # the stages over time: their means per bin, drawn over the records' time, Spark's phases said absent
    values = time_values(time_figure(wf, None, "ms"))
    assert values["xlim"][0] == values["xlim"][1] and values["phases"] == {}


def test_a_table_that_is_not_a_waterfall_is_refused_in_one_line() -> None:
    table = waterfall_table(np.arange(3), np.zeros(3))
    with pytest.raises(WaterfallError) as e:
        waterfall_of(table.replace_schema_metadata({}))
    assert str(e.value) == "waterfall table: no cloudprofiler.waterfall metadata (not translate's waterfall)"
    with pytest.raises(WaterfallError) as e:
        waterfall_of(table.drop_columns(["stage_factory_planned_ns"]))
    assert str(e.value).startswith(
        "waterfall table: no column stage_factory_planned_ns (columns: tuple_id, t_s,"
    )
    bad = table.replace_schema_metadata(
        {b"cloudprofiler.waterfall": json.dumps({"stages": [{"from": "gen"}]})}
    )
    with pytest.raises(WaterfallError) as e:
        waterfall_of(bad)
    assert str(e.value) == "waterfall table: its metadata's stages are not readable ('to')"


def test_a_user_point_splits_the_query_from_the_sink_s_write() -> None:
    meta = {"stages": [{"from": "source", "to": "join", "label": "the query"},
                       {"from": "join", "to": "sink", "label": "sink"}]}  # fmt: skip
    ms = np.array([[5.0, 1.0], [1.0, 30.0]])
    table = pa.table({"tuple_id": [1, 2], "t_s": [1.0, 2.0], "e2e_ns": ms.sum(axis=1) * 1e6,
                      "e2e_bound_ns": [0.0, 0.0], "stage_source_join_ns": ms[:, 0] * 1e6,
                      "stage_join_sink_ns": ms[:, 1] * 1e6})  # fmt: skip
    wf = waterfall_of(table.replace_schema_metadata({b"cloudprofiler.waterfall": json.dumps(meta)}))
    assert dominance_line(wf, quantile_rows(wf)) == (
        "at p50 (6.00 ms end to end) the query dominates (5.00 ms, 83%): a cheaper query or more partitions "
        "would shorten it; at p99 (31.0 ms end to end) sink dominates (30.0 ms, 97%): a cheaper sink write "
        "(the records of each batch written to the sink's store) would shorten it"
    )
