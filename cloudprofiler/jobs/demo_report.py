"""What ``cloudprofiler demo`` found: the ingest ledger, the latency table and the plots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from cloudprofiler.errors import CommandError
from cloudprofiler.report.demo_plots import XLABEL, figures, page_plots
from cloudprofiler.report.waterfall import demo_waterfall, waterfall_line
from cp_store.location import Location
from cp_store.published_run import Published, published

if TYPE_CHECKING:
    from cloudprofiler.report.summary import LatencySeries


@dataclass(frozen=True)
class DemoLayout:
    """Where one demo run keeps its spools, records, windowed output and sync tables."""

    out: Path

    @property
    def spools(self) -> dict[str, Path]:
        return {"windows": self.out / "spool", "latency": self.out / "spool-latency"}

    @property
    def records(self) -> Path:
        return self.out / "records"

    @property
    def windows_dir(self) -> Path:
        return self.out / "windows"

    @property
    def sync_dir(self) -> Path:
        return self.out / "sync"


WINDOW_PAIR = ("gen", "window", "windowed output")


@dataclass(frozen=True)
class RunClock:
    """The run's time axis, in the reference TSC domain: the count when the queries started (time
    zero of every plot), counts per second, and when the measured run began (seconds since zero)."""

    start_tsc: int
    hz: float
    measured_s: float

    def seconds(self, tsc: np.ndarray) -> np.ndarray:
        """Seconds since the start of reference-domain counts ``tsc``."""
        return (np.asarray(tsc, dtype=np.int64) - self.start_tsc).astype(np.float64) / self.hz

    @property
    def warmup(self) -> tuple[float, float]:
        """The warm-up as every plot shades it: from the start to the measured run's."""
        return (0.0, self.measured_s)


def _last_stamps(root: Published, end: str, reference: str) -> tuple[np.ndarray, np.ndarray]:
    """Tuple ids and ``end`` stamps of the rows under ``root`` in read order (as translated), each
    stamp checked to be in ``reference``: it is read as the run's clock, with no translation."""
    import pyarrow.compute as pc

    from cp_common.stamp_columns import node_column, tsc_column
    from cp_sync.translate.record_points import read_points

    pts = read_points(root, "gen", end)
    other = sorted(set(pc.unique(pts[node_column(end)]).to_pylist()) - {reference})
    if other:
        raise CommandError(
            f"{root.root.uri}: {end} stamps taken in {', '.join(other)}, not the reference {reference}"
        )
    return pts["tuple_id"].to_numpy(), pts[tsc_column(end)].to_numpy()


def _end_tsc(out: pa.Table, ids: np.ndarray, tsc: np.ndarray, where: str) -> np.ndarray:
    """Each row of ``out``'s record's last stamp, by tuple id (a tuple has one record)."""
    order = np.argsort(ids, kind="stable")
    ids, tsc = ids[order], tsc[order]
    want = out["tuple_id"].to_numpy()
    pos = np.minimum(np.searchsorted(ids, want), max(0, len(ids) - 1))
    if not len(ids) or not np.array_equal(ids[pos], want):
        raise CommandError(f"{where}: some translated tuples have no sink stamp")
    return tsc[pos]


def latencies(
    records: Path | Published, windows: Path | Published, sync_dir: Path, reference: str
) -> tuple[pa.Table, dict]:
    """Every pair of points the demo reports, translated into ``reference``: the table and the facts.

    Each row also carries ``end_tsc``, its record's last stamp (sink, or window output) in
    ``reference``: when the record was done, on the run's clock. Each location is resolved and its
    manifests read once, however many pairs read it."""
    from cloudprofiler.report.latency import DEFAULT_PAIRS, latency_report

    records, windows = published(records), published(windows)
    _, facts, out = latency_report(records, sync_dir, DEFAULT_PAIRS, reference=reference)
    _, wfacts, wout = latency_report(windows, sync_dir, (WINDOW_PAIR,), reference=reference)
    missing = facts["missing"] | wfacts["missing"]
    if missing or out is None or wout is None:
        raise CommandError(f"latencies could not be translated: {missing}")
    out = out.append_column(
        "end_tsc", pa.array(_end_tsc(out, *_last_stamps(records, "sink", reference), records.root.uri))
    )
    wids, wtsc = _last_stamps(windows, "window", reference)
    if not np.array_equal(wids, wout["tuple_id"].to_numpy()):  # one read, one order: never expected
        raise CommandError(f"{windows.root.uri}: window rows read back in another order than translated")
    wout = wout.append_column("end_tsc", pa.array(wtsc))
    return pa.concat_tables([out, wout]), facts


def id_ranges(summary: dict[str, Any]) -> list[tuple[int, int]]:
    """The tuple ids a generator run offered: [first, next) per sender."""
    return [(int(s["first_tuple_id"]), int(s["next_tuple_id"])) for s in summary["senders"]]


def in_ranges(ids: np.ndarray, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Which of ``ids`` lie in one of ``ranges`` (a window row's id: its latest tuple's)."""
    keep = np.zeros(len(ids), dtype=bool)
    for lo, hi in ranges:
        keep |= (ids >= lo) & (ids < hi)
    return keep


def with_run_time(lat: pa.Table, warmup_ids: list[tuple[int, int]], clock: RunClock) -> pa.Table:
    """``lat`` with ``t_s`` (seconds since the start at the record's last stamp) and ``warmup`` (the
    record belongs to the warm-up: ``warmup_ids``), the columns the table and the plots select by."""
    t_s = clock.seconds(lat["end_tsc"].to_numpy())
    warm = in_ranges(lat["tuple_id"].to_numpy(), warmup_ids)
    return lat.append_column("t_s", pa.array(t_s)).append_column("warmup", pa.array(warm))


def demo_series(lat: pa.Table) -> list[LatencySeries]:
    """The demo's pairs of points as LatencySeries, in the table's order: the one source of the
    table's figures and of every plot (``lat`` as ``with_run_time`` gives it)."""
    from cloudprofiler.report.latency import DEFAULT_PAIRS
    from cloudprofiler.report.summary import latency_series

    return latency_series(lat, (*DEFAULT_PAIRS, WINDOW_PAIR))


def table_rows(series: list[LatencySeries]) -> list[dict[str, Any]]:
    """The steady-state latency table's rows: each series without its warm-up (if any record is left)."""
    steady = [s.steady() for s in series]
    return [s.row() for s in steady if len(s.duration_ns)]


def latency_totals(series: list[LatencySeries]) -> dict[str, Any]:
    """The summary's latency: the table's rows and the lines saying what their distinct stamps mean."""
    from cloudprofiler.report.summary import stamp_notes

    rows = table_rows(series)
    return {"latency": rows, "resolution": stamp_notes(rows)}


def _warmup_totals(warm: dict[str, Any], series: list[LatencySeries], clock: RunClock) -> dict[str, Any]:
    """The warm-up's figures: when the factories were ready and the queries had read it, its drops
    per query, its end-to-end latency (from the same series as the table) and the measured run's start."""
    s = warm["summaries"]
    e2e = [x for x in series if (x.key["from_point"], x.key["to_point"]) == ("gen", "sink")]
    warm_e2e = [x.select(x.warmup).figured().duration_ns for x in e2e if x.warmup is not None]
    ms = np.concatenate(warm_e2e) / 1e6 if warm_e2e else np.zeros(0)
    return {
        "seconds": s["windows"]["duration"],
        "emitted": {name: s[name]["emitted"] for name in ("windows", "latency")},
        "dropped": {name: s[name]["dropped"] for name in ("windows", "latency")},
        "factories_ready_s": round(warm["ready_s"], 1),
        "caught_up_s": round(warm["caught_up_s"], 1),
        # from the warm-up's last tuple sent to its last micro-batch done
        "catch_up_s": round(warm["caught_up_s"] - warm["load_end_s"], 1),
        "measured_start_s": clock.measured_s,
        "end_to_end_p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "end_to_end_max_ms": float(ms.max()) if len(ms) else None,
        "id_ranges": [r for name in s for r in id_ranges(s[name])],
    }


def batch_ends(records: Path | Published, clock: RunClock) -> list[float]:
    """When each of the latency query's micro-batches ended (its last sink stamp, seconds since the
    start, rounded to the microsecond), in order: the boundaries every plot over the run marks."""
    from cp_sink.records import read_counts

    c = read_counts(records)
    if not c.num_rows:
        return []
    g = c.group_by(["batch_id"]).aggregate([("last_tsc_sink", "max")])
    tsc = np.sort(g["last_tsc_sink_max"].to_numpy())
    return [round(float(x), 6) for x in clock.seconds(tsc[tsc > 0])]


def record_counts(records: Path | Published) -> tuple[int, int]:
    """How many records the latency query's sink holds, and how many distinct tuple ids."""
    import pyarrow.compute as pc

    from cp_sink.records import read_records

    ids = read_records(records)["tuple_id"]
    return len(ids), int(pc.count_distinct(ids).as_py())


def _latency_query(summary: dict[str, Any], stats: Any, n_records: int, n_unique: int) -> dict[str, Any]:
    """The latency query's ledger: emitted, dropped, lost, published, and what its sink holds."""
    return {
        "emitted": summary["emitted"],
        "dropped": summary["dropped"],
        "lost_in_transit": stats.lost_in_transit_total,
        "published": stats.rows,
        "records": n_records,
        "unique_records": n_unique,
    }


def collect(
    spark: Any,
    demo: DemoLayout,
    summaries: dict[str, dict[str, Any]],
    simulated: list[Any],
    sync_pairs: dict[str, Any],
    rows_read: int,
    warm: dict[str, Any],
) -> tuple[dict[str, Any], pa.Table, list[LatencySeries], pa.Table | None]:
    """The run's totals (both queries' ledgers, window counts, records), its translated latencies (with
    ``t_s`` and ``warmup``), their LatencySeries and its waterfall (None: the totals' ``waterfall`` says why).

    ``summaries``: each query's generator summary of the measured run; ``warm``: the
    warm-up's (``summaries``, ``ready_s``, ``caught_up_s``, ``start_tsc``, ``measured_tsc``);
    ``simulated``: the virtual domains of simulated nodes. The latency table's rows cover
    the measured run only (the steady state); the translated table returned holds every record.

    ``consistent``: every emitted tuple (warm-up and measured) was read once by the
    windows query and is in the latency query's sink once, or counted as lost in transit.
    """
    import native_tsc
    from cloudprofiler.jobs.demo_verdict import end_to_end_trend
    from cloudprofiler.jobs.queries import window_counts
    from cp_source.spool.segments import Spool

    stats = Spool(demo.spools["windows"]).stats()
    stats_l = Spool(demo.spools["latency"]).stats()
    n_windows, window_keys, views_counted = window_counts(spark, demo.windows_dir)
    # each result location resolved once and its manifests read once, for every reader below
    records, windows = published(demo.records), published(demo.windows_dir)
    n_records, n_unique = record_counts(records)
    reference = native_tsc.domain_id()
    lat, facts = latencies(records, windows, demo.sync_dir, reference)
    hz = float(facts["frequency_hz"])
    clock = RunClock(warm["start_tsc"], hz, (warm["measured_tsc"] - warm["start_tsc"]) / hz)
    sw, sl = summaries["windows"], summaries["latency"]
    ww, wl = warm["summaries"]["windows"], warm["summaries"]["latency"]
    lat = with_run_time(lat, [r for s in warm["summaries"].values() for r in id_ranges(s)], clock)
    series = demo_series(lat)
    totals: dict[str, Any] = {
        "batch_ends_s": batch_ends(records, clock),
        **{k: sw[k] for k in ("target_rate", "achieved_rate", "generator_bound", "offered", "emitted")},
        "dropped": sw["dropped"],
        "lost_in_transit": stats.lost_in_transit_total,
        "rejected_buckets": stats.rejected_buckets,
        "dead_letters": stats.deadletters_total,
        "published": stats.rows,
        "rows_read": rows_read,
        "windows": n_windows,
        "window_campaign_counts": window_keys,
        "views_counted": views_counted,
        "latency_query": _latency_query(sl, stats_l, n_records, n_unique),
        "simulated_nodes": [v.spec() for v in simulated],
        "simulated_domains": [v.domain for v in simulated],
        "reference_domain": reference,
        "frequency_hz": facts["frequency_hz"],
        "sync_pairs": dict(sync_pairs),
        "out": str(demo.out),
        **latency_totals(series),
        "warmup": _warmup_totals(warm, series, clock),
        "dropped_per_query": {"windows": sw["dropped"], "latency": sl["dropped"]},
    }
    totals["consistent"] = (
        rows_read == stats.rows == ww["emitted"] + sw["emitted"] - stats.lost_in_transit_total
        and n_records
        == n_unique
        == stats_l.rows
        == wl["emitted"] + sl["emitted"] - stats_l.lost_in_transit_total
    )
    # what the verdict (demo_verdict.judge) weighs beside the drops
    lost = {"windows": stats.lost_in_transit_total, "latency": stats_l.lost_in_transit_total}
    totals["lost_per_query"] = lost
    totals["latency_trend"] = end_to_end_trend(series)
    waterfall, totals["waterfall"] = demo_waterfall(records, demo.sync_dir, reference, warm["start_tsc"])
    return totals, lat, series, waterfall


WINDOWS_TITLE = "windows query: YSB views per campaign, 10 s windows"
LATENCY_TITLE = "latency query: one record per tuple in the sink"
LEDGER_TITLE = "cloudprofiler demo: ingest of the windows query and the latency query"


def ledger_tables(t: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The ingest ledger as printed: one (title, rows) per query, each row labelled with what it
    counts (the measured run, or the warm-up included)."""
    lq = t["latency_query"]
    windows = [
        ("target rate (tuples/s)", f"{t['target_rate']:,.0f}"),
        ("achieved rate (tuples/s)", f"{t['achieved_rate']:,.0f}"),
        ("generator-bound", "yes (invalid run)" if t["generator_bound"] else "no"),
        ("warm-up: emitted (not in the latency table)", f"{t['warmup']['emitted']['windows']:,}"),
        ("emitted", f"{t['emitted']:,}"),
        ("dropped by the generator", f"{t['dropped']:,}"),
        ("lost in transit", f"{t['lost_in_transit']:,}"),
        ("published by the factory (warm-up included)", f"{t['published']:,}"),
        ("rows read by Spark (warm-up included)", f"{t['rows_read']:,}"),
        ("10 s windows (warm-up included)", f"{t['windows']:,}"),
        ("window x campaign counts, final (warm-up included)", f"{t['window_campaign_counts']:,}"),
        ("views counted", f"{t['views_counted']:,}"),
    ]
    latency = [
        ("warm-up: emitted (not in the latency table)", f"{t['warmup']['emitted']['latency']:,}"),
        ("emitted", f"{lq['emitted']:,}"),
        ("dropped by the generator", f"{lq['dropped']:,}"),
        ("lost in transit", f"{lq['lost_in_transit']:,}"),
        ("tuple records in the sink (warm-up included)", f"{lq['records']:,}"),
        ("both queries: every emitted tuple read once", "yes" if t["consistent"] else "NO"),
    ]
    return [(WINDOWS_TITLE, windows), (LATENCY_TITLE, latency)]


def ledger_rows(t: dict[str, Any]) -> list[tuple[str, str]]:
    """The ingest ledger in one list, each row named after its query (as the HTML page shows it)."""
    return [(f"{title.split(':')[0]}: {k}", v) for title, rows in ledger_tables(t) for k, v in rows]


def _ingest_tables(t: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    tables = []
    for title, rows in ledger_tables(t):
        table = Table(title=title)
        table.add_column("what")
        table.add_column("value", justify="right")
        for k, v in rows:
            table.add_row(k, v)
        tables.append(table)
    return tables


# The latency table's counts beside the ledger's: not the same things, said where both are seen.
COUNT_NOTE = (
    "count: records of the measured run; for windowed output, window rows output for it (a window x "
    "campaign count is output again at each update, so this is not the ledger's final counts)"
)


def warmup_line(t: dict[str, Any]) -> str:
    """The warm-up on one line: when the factories were ready, when both queries had caught up with
    it, its drops and its end-to-end latency; it is not judged (the verdict is the steady state's)."""
    from cloudprofiler.report.summary import format_duration

    w = t["warmup"]
    drops = ", ".join(f"{n} {d:,}" for n, d in w["dropped"].items())
    p50 = (
        ""
        if w["end_to_end_p50_ms"] is None
        else f"; end to end p50 {format_duration(w['end_to_end_p50_ms'] * 1e6)}, "
        f"peak {format_duration(w['end_to_end_max_ms'] * 1e6)}"
    )
    return (
        f"warm-up: factories ready {w['factories_ready_s']:g} s after the queries started; "
        f"{w['seconds']:g} s at {t['target_rate']:,.0f} tuples/s into each query, caught up (read by "
        f"both, no backlog) {w['caught_up_s']:g} s after the start, {w['catch_up_s']:g} s after its "
        f"load ended (dropped: {drops}{p50}); not judged, not in the tables below"
    )


def rate_line(t: dict[str, Any]) -> str:
    """Whether the measured run sustained the rate: no drop, no loss, no climbing latency, or which
    of them failed (``demo_verdict.judge`` wrote it)."""
    return str(t["verdict"])


def sync_facts(t: dict[str, Any], series: list[LatencySeries]) -> dict[str, Any]:
    """The sync quality on the page: the reference, its frequency, the phases, each pair's probes,
    losses and best round trip, and how many records have a guaranteed bound."""
    from cloudprofiler.report.summary import format_duration

    hz = float(t["frequency_hz"])
    facts: dict[str, Any] = {
        "reference TSC domain": t["reference_domain"],
        "reference frequency (MHz)": round(hz / 1e6, 3),
        "simulated nodes": ", ".join(t["simulated_domains"]) or "none (one TSC domain)",
        "sync phases": len(t["sync_pairs"]),
    }
    pairs: dict[str, list[dict[str, Any]]] = {}
    for phase in t["sync_pairs"].values():
        for p in phase:
            pairs.setdefault(f"{p['initiator']} -> {p['responder']}", []).append(p)
    for name, ps in sorted(pairs.items()):
        rtt = [p["min_rtt_cycles"] for p in ps if p.get("min_rtt_cycles") is not None]
        best = f", best round trip {format_duration(min(rtt) / hz * 1e9)}" if rtt else ""
        facts[f"probes {name}"] = f"{sum(p['probes'] for p in ps):,} in {len(ps)} phases, " + (
            f"{sum(int(p.get('lost') or 0) for p in ps):,} lost{best}"
        )
    for s in series:
        facts[f"status ok: {s.path}"] = f"{int(s.ok.sum()):,} of {len(s.ok):,} records"
    return facts


def run_doc(t: dict[str, Any], series: list[LatencySeries]) -> dict[str, Any]:
    """The demo's run.json: its ledger, verdicts, how its latencies are drawn, its sync quality."""
    from cloudprofiler.jobs.demo_cost import cost_verdicts
    from cloudprofiler.report.latency import DEFAULT_PAIRS
    from cloudprofiler.report.run_page import new_doc

    doc = new_doc("demo", f"cloudprofiler demo: YSB at {t['target_rate']:,.0f} tuples/s into each query")
    doc["verdicts"] = [
        {"text": rate_line(t), "good": bool(t["sustained"])},
        {"text": "every emitted tuple read once" if t["consistent"] else "NOT every emitted tuple read "
         "once (see the ledger)", "good": bool(t["consistent"])},
        {"text": warmup_line(t)},
    ]  # fmt: skip
    doc["verdicts"] += cost_verdicts(t)  # the profiler's own CPU and its last calibration
    doc["ledger"] = {"title": LEDGER_TITLE, "rows": ledger_rows(t)}
    doc["latency"] = {
        "title": f"steady-state latency (after the warm-up), reference TSC domain {t['reference_domain']}",
        "unit": "ms",
        "pairs": [list(p) for p in (*DEFAULT_PAIRS, WINDOW_PAIR)],
        "warmup_s": [0.0, t["warmup"]["measured_start_s"]],
        "batches_s": t.get("batch_ends_s") or None,
        "xlabel": XLABEL,
    }
    if "waterfall" in t:  # the latency query, whose phases go under the waterfall, and the warm-up's ids
        query = (t.get("spark_phases") or {}).get("query_ids", {}).get("latency")
        doc["waterfall"] = t["waterfall"] | {"query_id": query, "warmup_ids": t["warmup"]["id_ranges"]}
        doc["verdicts"] += (
            [{"text": t["waterfall"]["error"], "good": False}] if "error" in t["waterfall"] else []
        )
    doc["sync"] = sync_facts(t, series)
    doc["totals"] = {k: v for k, v in t.items() if k not in ("latency", "sync_pairs", "batch_ends_s")}
    return doc


def write_results(
    out: Location,
    lat: pa.Table,
    series: list[LatencySeries],
    warmup: tuple[float, float],
    doc: dict[str, Any] | None = None,
    waterfall: pa.Table | None = None,
) -> list[Location]:
    """Write latency.parquet, the waterfall (waterfall.parquet, if given) and the plots (PNG) under
    ``out`` (a directory or URI), each whole or not at all, and with ``doc`` (run_doc) run.json and
    report.html (Spark's phases under the waterfall from the spark_phases.parquet already there);
    where they went, the report last."""
    from cloudprofiler.report.run_page import LATENCY_FILE, build, write_doc
    from cloudprofiler.report.waterfall import phase_bars
    from cloudprofiler.report.waterfall_plot import WATERFALL_FILE
    from cp_store.tables import write_figure, write_parquet

    written = [out.join(LATENCY_FILE)]
    write_parquet(lat, written[0])
    if waterfall is not None:
        written.append(out.join(WATERFALL_FILE))
        write_parquet(waterfall, written[-1])
    batches = None if doc is None else doc["latency"]["batches_s"]
    figs = figures(series, warmup, batches=batches)
    plots = [] if doc is None else page_plots(series, doc["latency"], figs)  # drawn once: SVG, then PNG
    for name, fig in figs.items():
        written.append(out.join(name))
        write_figure(written[-1], fig)
    if doc is not None:
        written.append(write_doc(out, doc))
        written.append(build(out, lambda _series, _lat: plots, phase_bars))
    return written


def report(
    console: Any,
    totals: dict[str, Any],
    lat: pa.Table,
    series: list[LatencySeries],
    out: Location,
    waterfall: pa.Table | None = None,
) -> None:
    """Print the ingest table, the rate verdict and the latency table; write latency.parquet and plots.

    The table and every plot come from ``series``: the plots are in the table's unit (ms), the box
    plot shows the table's records alone, the others shade the warm-up the table leaves out."""
    from cloudprofiler.report.summary import print_latency_table

    console.print(warmup_line(totals), soft_wrap=True)  # one line, also into a pipe
    for table in _ingest_tables(totals):
        console.print(table)
    console.print(rate_line(totals), soft_wrap=True)
    domains = totals["simulated_domains"]
    where = "simulated nodes " + ", ".join(domains) if domains else "one node"
    ref = totals["reference_domain"]
    title = f"steady-state latency (after the warm-up), reference TSC domain {ref} ({where})"
    print_latency_table(table_rows(series), title)  # and what its distinct stamps mean
    console.print(COUNT_NOTE, soft_wrap=True)
    if waterfall is not None:  # which stage dominates (the report's first section)
        console.print(waterfall_line(waterfall, totals["warmup"]["id_ranges"]), soft_wrap=True)
    warmup = (0.0, totals["warmup"]["measured_start_s"])
    written = write_results(out, lat, series, warmup, run_doc(totals, series), waterfall)
    console.print("plots: " + ", ".join(w.uri for w in written if w.uri.endswith(".png")), soft_wrap=True)
    console.print(f"output in {out.uri}  ({totals['seconds']} s)")
    console.print(f"report: {written[-1].uri}", soft_wrap=True)
