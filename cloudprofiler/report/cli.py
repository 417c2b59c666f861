"""``cloudprofiler report RUN``: rebuild a run directory's HTML page from its run.json."""

from __future__ import annotations

import argparse

DESCRIPTION = """Write RUN/report.html: one self-contained page (inline CSS and SVG, no outside
address) with the run's ledger and verdicts, its latency table beside its plots (each plot and its
table drawn from the same records, latency.parquet), the sync quality, and the machine and the
versions. RUN is a run directory (a path or URI) that cloudprofiler demo, maxrate --report or
translate --report wrote: it holds run.json (and latency.parquet where there are latencies).
Prints the page's location.

examples:
  cloudprofiler report cloudprofiler-demo-20261126-061500
  cloudprofiler report s3://bucket/runs/demo1
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler report``."""
    p.add_argument("run", metavar="RUN", help="run directory (path or URI) holding run.json")


def run(args: argparse.Namespace) -> int:
    """Build the page, print where it went."""
    from cloudprofiler.report.run_page import build, read_doc
    from cp_store.tables import resolve_option

    where = resolve_option("RUN", args.run)
    plots_for = None
    if read_doc(where)["kind"] == "demo":
        from cloudprofiler.report.demo_plots import page_plots

        plots_for = page_plots
    from cloudprofiler.report.waterfall import phase_bars

    print(f"report: {build(where, plots_for, phase_bars).uri}")
    return 0
