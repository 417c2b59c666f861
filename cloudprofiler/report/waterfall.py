"""Spark's micro-batch phases placed on a run's time axis, for the waterfall on its report.

The phase table (cloudprofiler.spark_phases) holds each phase's start and end on the driver's TSC;
the run's axis is seconds since ``origin_tsc`` in the run's reference domain (run.json's
``waterfall`` entry: ``origin_tsc``, ``frequency_hz``, ``reference``, ``query_id``). Where the driver's
domain is the reference (the demo: the driver stamps the run's clock), a phase's second is
``(tsc - origin_tsc) / frequency_hz``; phases taken in another domain are not placed, and the note
under the plot says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cloudprofiler.spark_phases import PHASE_ORDER, PHASES_FILE, TRIGGER, read_phases
from cp_store.location import Location
from cp_sync.report import format_duration
from cp_sync.waterfall_plot import PhaseBars


def axis_entry(origin_tsc: int, hz: float, reference: str, query_id: str | None) -> dict[str, Any]:
    """run.json's ``waterfall`` entry: the run's axis and the query whose phases go under it."""
    return {
        "origin_tsc": int(origin_tsc),
        "frequency_hz": float(hz),
        "reference": reference,
        "query_id": query_id,
    }


def _of_query(table: pa.Table, query_id: str | None) -> pa.Table:
    if query_id is None:
        return table
    return table.filter(pc.equal(table["query_id"], query_id))


def place(table: pa.Table, axis: Mapping[str, Any]) -> PhaseBars:
    """The phases of ``axis['query_id']`` in ``table`` as bars in seconds on the run's axis (``axis``:
    axis_entry); what could not be placed is counted in the note."""
    table = _of_query(table, axis.get("query_id"))
    if not table.num_rows:
        return PhaseBars(note=f"no Spark phase of query {axis.get('query_id')} collected")
    nodes = set(table["node"].to_pylist())
    if nodes != {axis["reference"]}:
        others = ", ".join(sorted(str(n) for n in nodes - {axis["reference"]}))
        return PhaseBars(note=f"Spark's phases not shown: taken in {others}, not the run's reference "
                         f"{axis['reference']}")  # fmt: skip
    placed = table.filter(pc.is_valid(table["start_tsc"]))
    hz, origin = float(axis["frequency_hz"]), int(axis["origin_tsc"])
    start = (placed["start_tsc"].to_numpy() - origin) / hz
    end = (placed["end_tsc"].to_numpy() - origin) / hz
    names = placed["phase"].to_pylist()
    present = set(names)
    order = [p for p in (TRIGGER, *PHASE_ORDER) if p in present]
    batches = len(set(placed["batch_id"].to_pylist()))
    bound = int(np.max(placed["start_bound_ns"].to_numpy())) if placed.num_rows else 0
    note = f"Spark's phases of {batches:,} micro-batches, each batch's start within {format_duration(bound)}"
    unplaced = table.num_rows - placed.num_rows
    if unplaced:
        note += f"; {unplaced:,} phases with no place in Spark's order not drawn"
    ids = placed["batch_id"].to_pylist()
    return PhaseBars(names, ids, start.tolist(), end.tolist(), note, order)


def phase_bars(run: Location, doc: Mapping[str, Any]) -> PhaseBars:
    """Spark's phases of a run directory (its spark_phases.parquet) on its axis (run.json's
    ``waterfall`` entry), or a note saying why there are none (cp_sync.run_page.build's phases_for)."""
    axis = doc.get("waterfall") or {}
    loc = run.join(PHASES_FILE)
    if not loc.exists():
        return PhaseBars(note=f"no Spark phases in this run directory ({PHASES_FILE})")
    if "origin_tsc" not in axis:
        return PhaseBars(note="Spark's phases not shown: run.json gives no axis to place them on")
    return place(read_phases(loc), axis)
