"""Spark's phases placed on a run's axis for the waterfall: one query's, in seconds since the run's
start, and what is not placed said in the note."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cloudprofiler.report.waterfall import axis_entry, phase_bars, place
from cloudprofiler.spark_phases import write_phases
from cp_store.location import resolve
from tests.helpers.waterfall_run import phase_table, waterfall_table

HZ, ORIGIN = 2.5e9, 7 * 10**12


def test_the_query_s_phases_are_placed_in_seconds_since_the_run_s_start() -> None:
    table = phase_table(ORIGIN, HZ, "driver@1", [1.0, 1.5, 2.25])
    bars = place(table, axis_entry(ORIGIN, HZ, "driver@1", "q-latency"))
    assert bars.order == ["triggerExecution", "latestOffset", "walCommit", "getBatch", "queryPlanning",
                          "addBatch", "commitOffsets"]  # fmt: skip
    trig = [(round(a, 6), round(b, 6)) for p, a, b in zip(bars.phase, bars.start_s, bars.end_s, strict=True)
            if p == "triggerExecution"]  # fmt: skip
    assert trig == [(1.0, 1.4), (1.5, 1.9), (2.25, 2.65)]  # the other query's batch at 1.2 s is not here
    assert sorted(set(bars.batch_id)) == [0, 1, 2] and len(bars.phase) == 3 * 7
    assert bars.note.startswith("Spark's phases of 3 micro-batches, each batch's start within 1.")


def test_phases_of_another_domain_or_an_unknown_phase_are_said_not_drawn(tmp_path: Path) -> None:
    table = phase_table(ORIGIN, HZ, "driver@1", [1.0])
    other = place(table, axis_entry(ORIGIN, HZ, "ref@2", "q-latency"))
    assert list(other.phase) == []
    assert other.note == "Spark's phases not shown: taken in driver@1, not the run's reference ref@2"
    extra = pa.Table.from_pylist([table.to_pylist()[0] | {"phase": "durationOfSomething", "start_tsc": None,
                                                          "end_tsc": None}], schema=table.schema)  # fmt: skip
    bars = place(pa.concat_tables([table, extra]), axis_entry(ORIGIN, HZ, "driver@1", "q-latency"))
    assert bars.note.endswith("; 1 phases with no place in Spark's order not drawn") and len(bars.phase) == 7
    run = resolve(tmp_path)
    assert phase_bars(run, {}).note == "no Spark phases in this run directory (spark_phases.parquet)"
    write_phases(table, run.join("spark_phases.parquet"))
    assert (
        phase_bars(run, {}).note
        == "Spark's phases not shown: waterfall.parquet gives no origin to place them on"
    )
    wf = waterfall_table(np.arange(3), np.zeros(3), origin_tsc=ORIGIN, hz=HZ, reference="driver@1")
    pq.write_table(wf, tmp_path / "waterfall.parquet")
    assert (
        phase_bars(run, {"waterfall": {"query_id": "q-none"}}).note
        == "no Spark phase of query q-none collected"
    )
    bars = phase_bars(run, {"waterfall": {"query_id": "q-latency"}})  # the waterfall's own axis
    assert [round(a, 6) for p, a in zip(bars.phase, bars.start_s, strict=True) if p == "addBatch"] == [1.07]


def test_the_demo_s_line_leaves_the_warm_up_out() -> None:
    from cloudprofiler.report.waterfall import waterfall_line
    from cloudprofiler.report.waterfall_plot import dominance_line, quantile_rows, waterfall_of

    table = waterfall_table(np.arange(1000), np.linspace(0.0, 9.0, 1000))
    measured = waterfall_of(table.slice(300))
    line = waterfall_line(table, [[0, 300]])
    assert line == f"waterfall: {dominance_line(measured, quantile_rows(measured))}"
    assert line != f"waterfall: {dominance_line(waterfall_of(table), quantile_rows(waterfall_of(table)))}"
