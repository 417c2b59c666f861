"""The latency report of a run: generator -> source, source -> sink and end to end, with error bounds.

Given the sink's records and the sync tables of the run (two phases or more),
each pair of stamp points is translated with ``cp_sync.translate`` into the
reference domain, and summarised (count, p50/p90/p99/max, median and max error
bound). Pairs whose stamps the records do not carry are reported as missing,
not guessed. ``latency_table`` (from ``cloudprofiler.report.summary``) renders the rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cloudprofiler.report.summary import (
    DEFAULT_TOP,
    latency_table,
    print_latency_table,
    print_table,
    summarize,
)
from cp_common.faces import deprecated_names
from cp_store.location import Location, resolve
from cp_store.published_run import Published, published
from cp_sync.translate.record_points import read_points
from cp_sync.translate.records import default_reference, translate_records

__all__ = ["DEFAULT_PAIRS", "latency_report", "latency_table", "print_latency_table", "print_table"]

DEFAULT_PAIRS: tuple[tuple[str, str, str], ...] = (
    ("gen", "source", "generator -> source"),
    ("source", "sink", "source -> sink"),
    ("gen", "sink", "end to end"),
)


def latency_report(
    records: str | os.PathLike[str] | Location | Published,
    sync: str | os.PathLike[str] | Location | None,
    pairs: tuple[tuple[str, str, str], ...] = DEFAULT_PAIRS,
    method: str = "minrtt",
    reference: str | None = None,
    by: Sequence[str] = (),
    top: int = DEFAULT_TOP,
) -> tuple[list[dict[str, Any]], dict[str, Any], pa.Table | None]:
    """Summary rows (one per pair and scenario, and per key value with ``by``), facts, and all
    translated rows (for plots).

    ``records`` and ``sync`` are paths or URIs (or Locations; ``records`` may be a ``Published``): each
    resolved once, the records' manifests read once, the records read per pair. Without
    ``sync`` every record's two stamps must share one TSC domain (method ``same-domain``). ``by``:
    record columns (the sink's ``keepColumns``): rows per key value, the ``top`` with the most records
    and the rest as ``other`` (cloudprofiler.report.summary.top_keys); the columns are carried into the rows.

    Facts: reference, frequency, the relations refused and spans found drifting, and
    ``status_counts``: per pair label, the records per status (see cp_sync.translate.relation.STATUSES).

    ``reference`` defaults to the domain of the end-to-end pair's end stamps, so
    every pair is expressed in the same reference domain.
    """
    records = published(records)
    sync = None if sync is None else resolve(sync)
    if reference is None:
        last = pairs[-1]
        reference = default_reference(read_points(records, last[0], last[1]), last[1])
    rows: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"reference": reference, "missing": {}}
    outs = []
    for a, b, label in pairs:
        try:
            out, f = translate_records(records, sync, a, b, reference=reference, methods=(method,), keys=by)
        except ValueError as e:
            facts["missing"][label] = str(e)
            continue
        facts["frequency_hz"], facts["frequency_source"] = f["frequency_hz"], f["frequency_source"]
        if f["refused"]:
            facts.setdefault("refused", {}).update(f["refused"])
        if f["drift"]:
            facts.setdefault("drift", {}).update(f["drift"])
        facts.setdefault("status_counts", {})[label] = next(iter(f["status_counts"].values()))
        outs.append(out)
        rows += [r | {"label": label} for r in summarize(out, by, top)]
    return rows, facts, (pa.concat_tables(outs) if outs else None)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["latency_report", "latency_table"])
