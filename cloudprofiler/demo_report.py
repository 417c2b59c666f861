"""What ``cloudprofiler demo`` found: the ingest ledger, the latency table and the plots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from cloudprofiler.errors import CommandError


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


def latencies(records: Path, windows: Path, sync_dir: Path, reference: str) -> tuple[pa.Table, dict]:
    """Every pair of points the demo reports, translated into ``reference``: the table and the facts."""
    from cp_sync.latency_report import DEFAULT_PAIRS, latency_report

    _, facts, out = latency_report(records, sync_dir, DEFAULT_PAIRS, reference=reference)
    _, wfacts, wout = latency_report(windows, sync_dir, (WINDOW_PAIR,), reference=reference)
    missing = facts["missing"] | wfacts["missing"]
    if missing or out is None or wout is None:
        raise CommandError(f"latencies could not be translated: {missing}")
    return pa.concat_tables([out, wout]), facts


def id_ranges(summary: dict[str, Any]) -> list[tuple[int, int]]:
    """The tuple ids a generator run offered: [first, next) per sender."""
    return [(int(s["first_tuple_id"]), int(s["next_tuple_id"])) for s in summary["senders"]]


def in_ranges(lat: pa.Table, ranges: list[tuple[int, int]]) -> pa.Table:
    """The rows of ``lat`` whose tuple id lies in one of ``ranges`` (a window row: its latest tuple's)."""
    import numpy as np

    ids = lat["tuple_id"].to_numpy()
    keep = np.zeros(len(ids), dtype=bool)
    for lo, hi in ranges:
        keep |= (ids >= lo) & (ids < hi)
    return lat.filter(pa.array(keep))


def summary_rows(lat: pa.Table) -> list[dict[str, Any]]:
    """The latency table's rows of ``lat``, one per pair of points, labelled as the demo names them."""
    import pyarrow.compute as pc

    from cp_sync.latency_report import DEFAULT_PAIRS
    from cp_sync.report import summarize

    rows = []
    for a, b, label in (*DEFAULT_PAIRS, WINDOW_PAIR):
        sel = lat.filter(pc.and_(pc.equal(lat["from_point"], a), pc.equal(lat["to_point"], b)))
        rows += [r | {"label": label} for r in summarize(sel)] if sel.num_rows else []
    return rows


def _warmup_totals(warm: dict[str, Any], lat: pa.Table) -> dict[str, Any]:
    """The warm-up's figures: when the factories were ready and the queries had read it, its drops
    per query and its end-to-end latency."""
    import numpy as np
    import pyarrow.compute as pc

    s = warm["summaries"]
    sel = in_ranges(lat, [r for name in s for r in id_ranges(s[name])])
    e2e = sel.filter(pc.and_(pc.equal(sel["from_point"], "gen"), pc.equal(sel["to_point"], "sink")))
    ms = e2e["duration_ns"].to_numpy() / 1e6
    return {
        "seconds": s["windows"]["duration"],
        "emitted": {name: s[name]["emitted"] for name in ("windows", "latency")},
        "dropped": {name: s[name]["dropped"] for name in ("windows", "latency")},
        "factories_ready_s": round(warm["ready_s"], 1),
        "caught_up_s": round(warm["caught_up_s"], 1),
        "end_to_end_p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "end_to_end_max_ms": float(ms.max()) if len(ms) else None,
        "id_ranges": [r for name in s for r in id_ranges(s[name])],
    }


def collect(
    spark: Any,
    demo: DemoLayout,
    summaries: dict[str, dict[str, Any]],
    simulated: list[Any],
    sync_pairs: dict[str, Any],
    rows_read: int,
    warm: dict[str, Any],
) -> tuple[dict[str, Any], pa.Table, list]:
    """The run's totals (both queries' ledgers, window counts, records) and its translated latencies.

    ``summaries``: each query's generator summary of the measured run; ``warm``: the
    warm-up's (``summaries``, ``ready_s``, ``caught_up_s``); ``simulated``: the virtual
    domains of simulated nodes. The latency table's rows cover the measured run only
    (the steady state); the translated table returned holds every record.

    ``consistent``: every emitted tuple (warm-up and measured) was read once by the
    windows query and is in the latency query's sink once, or counted as lost in transit.
    """
    import pyarrow.compute as pc

    import native_tsc
    from cloudprofiler.queries import window_counts
    from cp_sink.records import read_records
    from cp_source.spool import Spool

    stats = Spool(demo.spools["windows"]).stats()
    stats_l = Spool(demo.spools["latency"]).stats()
    n_windows, window_keys, views_counted = window_counts(spark, demo.windows_dir)
    ids = read_records(demo.records)["tuple_id"]
    n_records, n_unique = len(ids), pc.count_distinct(ids).as_py()
    reference = native_tsc.domain_id()
    lat, facts = latencies(demo.records, demo.windows_dir, demo.sync_dir, reference)
    sw, sl = summaries["windows"], summaries["latency"]
    ww, wl = warm["summaries"]["windows"], warm["summaries"]["latency"]
    rows = summary_rows(in_ranges(lat, id_ranges(sw) + id_ranges(sl)))
    totals: dict[str, Any] = {
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
        "latency_query": {
            "emitted": sl["emitted"],
            "dropped": sl["dropped"],
            "lost_in_transit": stats_l.lost_in_transit_total,
            "published": stats_l.rows,
            "records": n_records,
            "unique_records": n_unique,
        },
        "simulated_nodes": [v.spec() for v in simulated],
        "simulated_domains": [v.domain for v in simulated],
        "reference_domain": reference,
        "frequency_hz": facts["frequency_hz"],
        "sync_pairs": dict(sync_pairs),
        "out": str(demo.out),
        "latency": rows,
        "warmup": _warmup_totals(warm, lat),
        "dropped_per_query": {"windows": sw["dropped"], "latency": sl["dropped"]},
    }
    totals["consistent"] = (
        rows_read == stats.rows == ww["emitted"] + sw["emitted"] - stats.lost_in_transit_total
        and n_records
        == n_unique
        == stats_l.rows
        == wl["emitted"] + sl["emitted"] - stats_l.lost_in_transit_total
    )
    totals["sustained"] = not sw["generator_bound"] and sw["dropped"] == 0 and sl["dropped"] == 0
    return totals, lat, rows


def timeline_plot(out: pa.Table, path: Path, warm: list[tuple[int, int]] | None = None) -> None:
    """End-to-end and windowed-output latency of each record over the run: the warm-up's records
    first (shaded), then the measured run's, each in tuple-id order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pyarrow.compute as pc

    from cp_sync.report import time_unit

    fig, ax = plt.subplots(figsize=(9, 4))
    unit, scale = time_unit(out["duration_ns"].to_numpy())
    n_warm = 0
    for a, b in (("gen", "sink"), ("gen", "window")):
        sel = out.filter(pc.and_(pc.equal(out["from_point"], a), pc.equal(out["to_point"], b)))
        early = in_ranges(sel, warm or [])
        ids = set(early["tuple_id"].to_pylist())
        late = sel.filter(pc.invert(pc.is_in(sel["tuple_id"], pa.array(sorted(ids), pa.int64()))))
        lat = np.concatenate([t.sort_by("tuple_id")["duration_ns"].to_numpy() / scale for t in (early, late)])
        ax.plot(range(len(lat)), lat, ".", markersize=2, label=f"{a} -> {b}")
        n_warm = max(n_warm, early.num_rows) if b == "sink" else n_warm
    if n_warm:
        ax.axvspan(0, n_warm, color="0.88", zorder=0, label="warm-up (not in the table)")
    ax.set_xlabel("record (warm-up, then the measured run; each in tuple-id order)")
    ax.set_ylabel(f"latency ({unit})")
    ax.set_title("end-to-end and windowed-output latency over the run")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ingest_table(t: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="cloudprofiler demo: YSB ingest (windows query)")
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("target rate (tuples/s)", f"{t['target_rate']:,.0f}"),
        ("achieved rate (tuples/s)", f"{t['achieved_rate']:,.0f}"),
        ("generator-bound", "yes (invalid run)" if t["generator_bound"] else "no"),
        ("warm-up: emitted (not in the latency table)", f"{t['warmup']['emitted']['windows']:,}"),
        ("emitted", f"{t['emitted']:,}"),
        ("dropped by the generator", f"{t['dropped']:,}"),
        ("lost in transit", f"{t['lost_in_transit']:,}"),
        ("published by the factory (warm-up included)", f"{t['published']:,}"),
        ("rows read by Spark (warm-up included)", f"{t['rows_read']:,}"),
        ("10 s windows", f"{t['windows']:,}"),
        ("window x campaign counts", f"{t['window_campaign_counts']:,}"),
        ("views counted", f"{t['views_counted']:,}"),
        ("latency query: dropped by its generator", f"{t['latency_query']['dropped']:,}"),
        ("latency query: tuple records in the sink (warm-up included)", f"{t['latency_query']['records']:,}"),
        ("every emitted tuple read once", "yes" if t["consistent"] else "NO"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


def warmup_line(t: dict[str, Any]) -> str:
    """The warm-up on one line: when the factories were ready, when both queries had read it, drops."""
    w = t["warmup"]
    drops = ", ".join(f"{n} {d:,}" for n, d in w["dropped"].items())
    p50 = "" if w["end_to_end_p50_ms"] is None else f"; end to end p50 {w['end_to_end_p50_ms']:,.1f} ms"
    return (
        f"warm-up: factories ready {w['factories_ready_s']:g} s after the queries started; "
        f"{w['seconds']:g} s at {t['target_rate']:,.0f} tuples/s into each query, read by both "
        f"{w['caught_up_s']:g} s after the start (dropped: {drops}{p50}); not in the tables below"
    )


def rate_line(t: dict[str, Any]) -> str:
    """Whether the measured run sustained the rate, with each query's drops named (never a silent sum)."""
    rate = t["target_rate"]
    if t["sustained"]:
        return f"sustained {rate:,.0f} tuples/s into each query (windows, latency) with no drop"
    drops = ", ".join(f"the {n} query's generator dropped {d:,}" for n, d in t["dropped_per_query"].items())
    bound = " (generator-bound run)" if t["generator_bound"] else ""
    return f"did NOT sustain {rate:,.0f} tuples/s{bound}: {drops}"


def report(console: Any, totals: dict[str, Any], lat: pa.Table, rows: list, out: Path) -> None:
    """Print the ingest table, the rate verdict and the latency table; write latency.parquet and plots."""
    import pyarrow.parquet as pq

    from cp_sync.report import plot, plot_with_error, print_latency_table

    console.print(warmup_line(totals), soft_wrap=True)  # one line, also into a pipe
    console.print(_ingest_table(totals))
    console.print(rate_line(totals), soft_wrap=True)
    domains = totals["simulated_domains"]
    where = "simulated nodes " + ", ".join(domains) if domains else "one node"
    ref = totals["reference_domain"]
    title = f"steady-state latency (after the warm-up), reference TSC domain {ref} ({where})"
    print_latency_table(rows, title, unit="ms")
    pq.write_table(lat, out / "latency.parquet")
    plot(lat, str(out / "latency.png"))
    plot_with_error(lat, str(out / "latency_error.png"))
    timeline_plot(lat, out / "timeline.png", totals["warmup"]["id_ranges"])
    console.print(f"plots: {out / 'latency.png'}, {out / 'latency_error.png'}, {out / 'timeline.png'}")
    console.print(f"output in {out}  ({totals['seconds']} s)")
