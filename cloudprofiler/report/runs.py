"""Run directories of the jobs that have no latency table of their own: maxrate's trials."""

from __future__ import annotations

import argparse
from typing import Any

from cp_store.location import Location

TRIAL_COLUMNS = ["trial", "offered (tuples/s)", "achieved (tuples/s)", "landed (tuples/s)", "emitted",
                 "dropped", "lost", "received", "verdict"]  # fmt: skip
TRIAL_CAPTION = (
    "each trial's offered rate against what the generator achieved and what landed in the sink per "
    "second of trial: where the landed line falls below the offered one, the query did not keep up"
)


def trial_rows(attempts: list[Any]) -> list[list[Any]]:
    """One row per trial run (retries included), as the page's table and its chart show them."""
    rows = []
    for i, s in enumerate(attempts, 1):
        landed = s.received / s.duration if s.duration else 0.0
        rows.append([i, round(s.rate, 1), round(s.achieved_rate, 1), round(landed, 1), s.emitted, s.dropped,
                     s.lost, s.received, s.verdict])  # fmt: skip
    return rows


def maxrate_doc(result: Any, attempts: list[Any], args: argparse.Namespace, label: str) -> dict[str, Any]:
    """maxrate's run.json: the verdict (the maximum rate and why the search stopped) and every trial."""
    from cp_sync.run_page import new_doc

    doc = new_doc("maxrate", f"maxrate: {label}, {result.method} search, {args.duration:g} s per trial")
    found = result.max_rate is not None
    text = f"maximum sustainable rate: {result.max_rate:,.0f} tuples/s" if found else "no rate sustained"
    doc["verdicts"] = [{"text": f"{text} ({result.stopped_because})", "good": found}]
    if result.generator_cap is not None:
        doc["verdicts"].append(
            {"text": f"the generator could not offer {result.generator_cap:,.0f} tuples/s here: rates "
             "above it were not tested", "good": False}
        )  # fmt: skip
    doc["charts"] = [
        {
            "name": "trials",
            "title": "every trial (retries included)",
            "columns": TRIAL_COLUMNS,
            "rows": trial_rows(attempts),
            "x": "trial",
            "y": TRIAL_COLUMNS[1:4],
            "ylabel": "tuples/s",
            "caption": TRIAL_CAPTION,
        }
    ]
    return doc


def write_maxrate_run(
    run: Location, result: Any, attempts: list[Any], args: argparse.Namespace, label: str
) -> Location:
    """Make ``run`` maxrate's run directory (run.json, report.html); where the report went."""
    from cp_sync.run_page import build, write_doc

    run.make_dirs()
    write_doc(run, maxrate_doc(result, attempts, args, label))
    return build(run)
