"""Run directories of the jobs that have no latency table of their own: maxrate's trials.

Every figure of the page is in one format: tuples and tuples/s as whole numbers (``40,000``),
seconds with three decimals; a value that does not exist (a trial that never landed) is ``-``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from cp_store.location import Location

TRIAL_COLUMNS = ["trial", "offered (tuples/s)", "achieved (tuples/s)", "taken (tuples/s)", "emitted",
                 "dropped", "lost", "received", "filtered", "pending", "landing (s)", "grace (s)",
                 "verdict"]  # fmt: skip
TRIAL_CAPTION = (
    "each trial's offered rate, what the generator achieved, and what the query took (received by the "
    "sink or filtered by the query) within the grace period, per second of trial: where the taken line "
    "falls below the achieved one, tuples were dropped, lost or still pending when the grace ran out"
)
LEDGER_NOTE = "emitted = lost + received + filtered + pending, in every trial"
INGESTION_COLUMNS = ["time (s)", "ingested (tuples/s)", "offered (tuples/s)"]
INGESTION_CAPTION = (
    "the rate at which the sink committed tuples over the search (the paper's Fig. 3) against the rate "
    "each trial offered while it ran (0 between trials); a filtering query's sink commits only what it "
    "kept, so its line sits below the offered one by what it filtered"
)


def _seconds(value: float | None) -> float | str:
    return "-" if value is None else round(float(value), 3)


def trial_rows(attempts: list[Any]) -> list[list[Any]]:
    """One row per trial run (retries included), as the page's table and its chart show them."""
    rows = []
    for i, s in enumerate(attempts, 1):
        taken = (s.received + s.filtered) / s.duration if s.duration else 0.0
        rows.append([i, round(s.rate), round(s.achieved_rate), round(taken), s.emitted, s.dropped, s.lost,
                     s.received, s.filtered, s.pending, _seconds(s.landing), _seconds(s.grace),
                     s.verdict])  # fmt: skip
    return rows


def ledger_rows(attempts: list[Any]) -> list[list[str]]:
    """The totals over every trial run: what the generators emitted and where each tuple went."""
    total = {
        "emitted by the generator": sum(s.emitted for s in attempts),
        "dropped by the generator (not emitted)": sum(s.dropped for s in attempts),
        "lost in transit": sum(s.lost for s in attempts),
        "received by the sink": sum(s.received for s in attempts),
        "filtered by the query": sum(s.filtered for s in attempts),
        "pending when the trial was judged": sum(s.pending for s in attempts),
    }
    return [[what, f"{n:,}"] for what, n in total.items()]


def ingestion_spec(rows: Sequence[Sequence[float]], source: str) -> dict[str, Any]:
    """The charted table of the ingestion rate over the search (``rows``: time, ingested, offered)."""
    return {
        "name": "ingestion",
        "title": f"ingestion rate at the sink ({source})",
        "columns": INGESTION_COLUMNS,
        "rows": [[round(float(t), 3), round(float(y)), round(float(o))] for t, y, o in rows],
        "x": INGESTION_COLUMNS[0],
        "y": INGESTION_COLUMNS[1:],
        "xlabel": "time since the first trial (s)",
        "ylabel": "tuples/s",
        "caption": INGESTION_CAPTION,
    }


def maxrate_latency(sink: str, attempts: list[Any], history: list[dict[str, Any]]) -> Any:
    """The gen -> sink latency of every record the sink kept (one TSC domain: a local run), or None
    when it kept none (handler null or pc). The table summarises the sustained trials' records; the
    others (warm-ups, failed trials) are flagged ``warmup``, which the table leaves out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from cp_sink.records import read_records
    from cp_source.wire.bucket import SEQ_BITS
    from cp_sync.translate.records import translate_records

    if not read_records(sink).num_rows:
        return None
    lat, _ = translate_records(sink, None, "gen", "sink")
    sustained = [
        sender
        for h, step in zip(history, attempts, strict=True)
        if step.verdict == "sustained"
        for sender in h["senders"]
    ]
    sender = pc.shift_right(lat["tuple_id"], SEQ_BITS)
    return lat.append_column("warmup", pc.invert(pc.is_in(sender, pa.array(sustained, pa.int64()))))


def maxrate_doc(
    result: Any,
    attempts: list[Any],
    args: argparse.Namespace,
    label: str,
    ingestion: tuple[Sequence[Sequence[float]], str] | None = None,
) -> dict[str, Any]:
    """maxrate's run.json: the verdict (the maximum rate and why the search stopped), the ledger, every
    trial and, given ``ingestion`` (rows of time, ingested and offered rate, and where they came
    from), the ingestion rate over the search."""
    from cloudprofiler.report.run_page import new_doc

    doc = new_doc("maxrate", f"maxrate: {label}, {result.method} search, {args.duration:g} s per trial")
    found = result.max_rate is not None
    text = f"maximum sustainable rate: {result.max_rate:,.0f} tuples/s" if found else "no rate sustained"
    doc["verdicts"] = [{"text": f"{text} ({result.stopped_because})", "good": found}]
    if result.generator_cap is not None:
        doc["verdicts"].append(
            {"text": f"the generator could not offer {result.generator_cap:,.0f} tuples/s here: rates "
             "above it were not tested", "good": False}
        )  # fmt: skip
    doc["ledger"] = {"title": f"Ledger of every trial ({LEDGER_NOTE})", "rows": ledger_rows(attempts)}
    doc["charts"] = [
        {
            "name": "trials",
            "title": f"every trial (retries included; {LEDGER_NOTE})",
            "columns": TRIAL_COLUMNS,
            "rows": trial_rows(attempts),
            "x": "trial",
            "y": TRIAL_COLUMNS[1:4],
            "ylabel": "tuples/s",
            "caption": TRIAL_CAPTION,
        }
    ]
    if ingestion is not None and ingestion[0]:
        doc["charts"].append(ingestion_spec(*ingestion))
    return doc


def latency_entry(lat: Any) -> dict[str, Any]:
    """run.json's latency entry for maxrate_latency's rows: what the table holds, said in its title."""
    steady = lat.num_rows - sum(lat["warmup"].to_pylist())
    return {
        "title": f"Latency gen -> sink of the sustained trials' records ({steady:,} of {lat.num_rows:,} "
        "records; warm-ups and failed trials left out)",
        "unit": "ms",
        "xlabel": "record",
    }


def write_maxrate_run(
    run: Location,
    result: Any,
    attempts: list[Any],
    args: argparse.Namespace,
    label: str,
    ingestion: tuple[Sequence[Sequence[float]], str] | None = None,
    latency: Any = None,
) -> Location:
    """Make ``run`` maxrate's run directory (run.json, report.html, with ``latency``, maxrate_latency's
    rows, latency.parquet); where the report went."""
    from cloudprofiler.report.run_page import LATENCY_FILE, build, write_doc
    from cp_store.tables import write_parquet

    run.make_dirs()
    doc = maxrate_doc(result, attempts, args, label, ingestion)
    if latency is not None:
        write_parquet(latency, run.join(LATENCY_FILE))
        doc["latency"] = latency_entry(latency)
    write_doc(run, doc)
    return build(run)
