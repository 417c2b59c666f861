"""The latency table of a run: generator -> source, source -> sink and end to end, with error bounds.

Given the sink's records and the sync tables of the run (before and after),
each pair of stamp points is translated with ``cp_sync.translate`` into the
reference domain, and summarised (count, p50/p90/p99/max, median and max error
bound). Pairs whose stamps the records do not carry are reported as missing,
not guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

DEFAULT_PAIRS: tuple[tuple[str, str, str], ...] = (
    ("gen", "source", "generator -> source"),
    ("source", "sink", "source -> sink"),
    ("gen", "sink", "end to end"),
)


def latency_report(
    records: str | Path,
    sync: str | Path,
    pairs: tuple[tuple[str, str, str], ...] = DEFAULT_PAIRS,
    method: str = "minrtt",
    reference: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any], pa.Table | None]:
    """Summary rows (one per pair and scenario), facts, and all translated rows (for plots).

    ``reference`` defaults to the domain of the end-to-end pair's end stamps, so
    every pair is expressed in the same reference domain.
    """
    from cp_sync.report import summarize
    from cp_sync.translate import default_reference, read_points, translate_records

    if reference is None:
        last = pairs[-1]
        reference = default_reference(read_points(str(records), last[0], last[1]), last[1])
    rows: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"reference": reference, "missing": {}}
    outs = []
    for a, b, label in pairs:
        try:
            out, f = translate_records(str(records), str(sync), a, b, reference=reference, methods=(method,))
        except ValueError as e:
            facts["missing"][label] = str(e)
            continue
        facts["frequency_hz"], facts["frequency_source"] = f["frequency_hz"], f["frequency_source"]
        if f["refused"]:
            facts.setdefault("refused", {}).update(f["refused"])
        outs.append(out)
        rows += [r | {"label": label} for r in summarize(out)]
    return rows, facts, (pa.concat_tables(outs) if outs else None)


def latency_table(
    rows: list[dict[str, Any]], title: str = "latency (us), translated with MinRTT bounds"
) -> Any:
    """A rich table of :func:`latency_report` rows."""
    from rich.table import Table

    t = Table(title=title)
    for c in ("path", "points", "scenario", "count", "p50", "p90", "p99", "max", "bound med", "bound max"):
        t.add_column(c, justify="left" if c in ("path", "points", "scenario") else "right")
    for r in rows:
        t.add_row(
            r["label"],
            f"{r['from_point']}->{r['to_point']}",
            r["scenario"],
            f"{r['count']:,}",
            *(
                f"{r[k]:,.1f}"
                for k in ("p50_us", "p90_us", "p99_us", "max_us", "bound_median_us", "bound_max_us")
            ),
        )
    return t


def plot_latency(out: pa.Table, path: str | Path) -> None:
    """Box plot of every translated pair with its error bounds beside (cp_sync's figure)."""
    from cp_sync.report import plot

    plot(out, str(path))
