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


def latencies(records: Path, windows: Path, sync_dir: Path, reference: str) -> tuple[pa.Table, list, dict]:
    """Every pair of points the demo reports, translated into ``reference``: table, summary rows, facts."""
    from cp_sync.latency_report import DEFAULT_PAIRS, latency_report

    rows, facts, out = latency_report(records, sync_dir, DEFAULT_PAIRS, reference=reference)
    wrows, wfacts, wout = latency_report(
        windows, sync_dir, (("gen", "window", "windowed output"),), reference=reference
    )
    missing = facts["missing"] | wfacts["missing"]
    if missing or out is None or wout is None:
        raise CommandError(f"latencies could not be translated: {missing}")
    return pa.concat_tables([out, wout]), rows + wrows, facts


def collect(
    spark: Any,
    demo: DemoLayout,
    summaries: dict[str, dict[str, Any]],
    simulated: list[Any],
    sync_pairs: dict[str, Any],
    rows_read: int,
) -> tuple[dict[str, Any], pa.Table, list]:
    """The run's totals (both queries' ledgers, window counts, records) and its translated latencies.

    ``summaries``: each query's generator summary; ``simulated``: the virtual domains of
    simulated nodes.

    ``consistent``: every emitted tuple was read once by the windows query and is
    in the latency query's sink once, or counted as lost in transit.
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
    lat, rows, facts = latencies(demo.records, demo.windows_dir, demo.sync_dir, reference)
    sw, sl = summaries["windows"], summaries["latency"]
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
    }
    totals["consistent"] = (
        rows_read == stats.rows == sw["emitted"] - stats.lost_in_transit_total
        and n_records == n_unique == stats_l.rows == sl["emitted"] - stats_l.lost_in_transit_total
    )
    totals["sustained"] = not sw["generator_bound"] and sw["dropped"] == 0 and sl["dropped"] == 0
    totals["dropped_both_queries"] = sw["dropped"] + sl["dropped"]
    return totals, lat, rows


def timeline_plot(out: pa.Table, path: Path) -> None:
    """End-to-end and windowed-output latency of each record over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.compute as pc

    fig, ax = plt.subplots(figsize=(9, 4))
    for a, b in (("gen", "sink"), ("gen", "window")):
        sel = out.filter(pc.and_(pc.equal(out["from_point"], a), pc.equal(out["to_point"], b)))
        lat = sel.sort_by("tuple_id")["duration_ns"].to_numpy() / 1e6
        ax.plot(range(len(lat)), lat, ".", markersize=2, label=f"{a} -> {b}")
    ax.set_xlabel("record (in tuple-id order)")
    ax.set_ylabel("latency (ms)")
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
        ("emitted", f"{t['emitted']:,}"),
        ("dropped by the generator", f"{t['dropped']:,}"),
        ("lost in transit", f"{t['lost_in_transit']:,}"),
        ("published by the factory", f"{t['published']:,}"),
        ("rows read by Spark", f"{t['rows_read']:,}"),
        ("10 s windows", f"{t['windows']:,}"),
        ("window x campaign counts", f"{t['window_campaign_counts']:,}"),
        ("views counted", f"{t['views_counted']:,}"),
        ("latency query: tuple records in the sink", f"{t['latency_query']['records']:,}"),
        ("every emitted tuple read once", "yes" if t["consistent"] else "NO"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


def report(console: Any, totals: dict[str, Any], lat: pa.Table, rows: list, out: Path) -> None:
    """Print the ingest table, the rate verdict and the latency table; write latency.parquet and plots."""
    import pyarrow.parquet as pq

    from cp_sync.report import plot, print_latency_table

    console.print(_ingest_table(totals))
    rate = totals["target_rate"]
    if totals["sustained"]:
        console.print(f"sustained {rate:,.0f} tuples/s into each query with no drop")
    else:
        bound = " (generator-bound run)" if totals["generator_bound"] else ""
        console.print(
            f"did NOT sustain {rate:,.0f} tuples/s: dropped {totals['dropped_both_queries']:,} "
            f"over both queries{bound}"
        )
    domains = totals["simulated_domains"]
    where = "simulated nodes " + ", ".join(domains) if domains else "one node"
    title = f"latency, reference TSC domain {totals['reference_domain']} ({where})"
    print_latency_table(rows, title, unit="ms")
    pq.write_table(lat, out / "latency.parquet")
    plot(lat, str(out / "latency.png"))
    timeline_plot(lat, out / "timeline.png")
    console.print(f"plots: {out / 'latency.png'}, {out / 'timeline.png'}")
    console.print(f"output in {out}  ({totals['seconds']} s)")
