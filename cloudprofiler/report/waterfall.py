"""The demo's waterfall, and Spark's micro-batch phases placed on its time axis for the report.

The phase table (cloudprofiler.spark_phases) holds each phase's start and end on the driver's TSC;
the waterfall's ``t_s`` is seconds since ``origin_tsc``, a reading of the reference's counter, at
the reference's ``frequency_hz`` (both in the waterfall table's metadata, cp_sync.translate.waterfall).
Where the driver's domain is the reference (the demo: the driver stamps the run's clock), a phase's
second on that axis is ``(tsc - origin_tsc) / frequency_hz``; phases taken in another domain are not
placed, and the note under the plot says so. run.json's ``waterfall`` entry names the query whose
phases are drawn (``query_id``) and the warm-up's tuple ids (``warmup_ids``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cloudprofiler.report.summary import format_duration
from cloudprofiler.report.waterfall_plot import (
    META_KEY,
    WATERFALL_FILE,
    PhaseBars,
    dominance_line,
    quantile_rows,
    waterfall_of,
)
from cloudprofiler.spark_phases import PHASE_ORDER, PHASES_FILE, TRIGGER, read_phases
from cp_store.location import Location
from cp_store.published_run import Published


def axis_entry(origin_tsc: int, hz: float, reference: str, query_id: str | None) -> dict[str, Any]:
    """The axis phases are placed on: ``origin_tsc`` (t_s = 0) and ``frequency_hz`` in ``reference``,
    and the query whose phases go on it."""
    return {
        "origin_tsc": int(origin_tsc),
        "frequency_hz": float(hz),
        "reference": reference,
        "query_id": query_id,
    }


def waterfall_axis(run: Location) -> dict[str, Any] | None:
    """The axis of a run directory's waterfall.parquet (its metadata), or None without one."""
    import pyarrow.parquet as pq

    loc = run.join(WATERFALL_FILE)
    if not loc.exists():
        return None
    with loc.fs.open_input_file(loc.path) as f:
        meta = (pq.read_schema(f).metadata or {}).get(META_KEY)
    axis = json.loads(meta) if meta else {}
    if not all(k in axis for k in ("origin_tsc", "frequency_hz", "reference")):
        return None
    return axis_entry(axis["origin_tsc"], axis["frequency_hz"], axis["reference"], None)


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
    """Spark's phases of a run directory (its spark_phases.parquet) of run.json's ``waterfall``
    query on the waterfall's axis, or a note saying why there are none (cloudprofiler.report.run_page.build's
    ``phases_for``)."""
    loc = run.join(PHASES_FILE)
    if not loc.exists():
        return PhaseBars(note=f"no Spark phases in this run directory ({PHASES_FILE})")
    axis = waterfall_axis(run)
    if axis is None:
        return PhaseBars(note=f"Spark's phases not shown: {WATERFALL_FILE} gives no origin to place them on")
    return place(read_phases(loc), axis | {"query_id": (doc.get("waterfall") or {}).get("query_id")})


def demo_waterfall(
    records: Path | Published, sync_dir: Path, reference: str, origin_tsc: int
) -> tuple[pa.Table | None, dict[str, Any]]:
    """The demo's waterfall (its records translated into ``reference``, ``t_s`` from ``origin_tsc``,
    the queries' start, as every plot of the demo) and its totals' entry: empty, or the one line
    saying why there is no waterfall (``error``, a verdict on the page)."""
    from cp_sync.translate.waterfall import waterfall

    try:
        return waterfall(records, sync_dir, reference, origin_tsc=origin_tsc), {}
    except ValueError as e:
        return None, {"error": f"no waterfall: {e}"}


def waterfall_line(table: pa.Table, warmup_ids: list[list[int]]) -> str:
    """The report's line on which stage dominates at p50 and p99 and what would shorten it, of the
    waterfall ``table``'s records outside the warm-up (``warmup_ids``: [first, next) ranges)."""
    wf = waterfall_of(table, warmup_ids=warmup_ids)
    return f"waterfall: {dominance_line(wf, quantile_rows(wf))}"
