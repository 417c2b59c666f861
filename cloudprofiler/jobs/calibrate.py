"""``cloudprofiler calibrate``: what the profiler costs a query, as throughput and as CPU.

The maximum sustainable rate (``cloudprofiler maxrate``'s search and trials) of the same query
twice, one after the other in one SparkSession: into the cloudprofiler sink, and into Spark's
``noop`` sink. Their ratio is the share of the query's capacity the profiler's sink and stamp
points leave; the profiler's own CPU (``cp_common.self_cost``) during the first search is its
share of the run's CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from cloudprofiler.errors import CommandError
from cloudprofiler.jobs import maxrate
from cp_common.printable import redact
from cp_store.location import Location, resolve
from cp_store.tables import output_file

DESCRIPTION = """Calibrate the profiler's cost on a query: its maximum sustainable rate (the search
and trials of 'cloudprofiler maxrate', with the same options) with the profiler's stamps and sink
(the cloudprofiler sink), then with the same source and transformation into Spark's noop sink,
one after the other in one local SparkSession, and their ratio (with / noop). A noop trial has
nothing committed to count: it passes once the query has read every tuple emitted within the
grace period (what it read shows as "filtered" in its table). Both queries read the
cloudprofiler source, whose own stamp is in both: the ratio is the cost of the sink and of the
query's stamp points. During the first search the profiler's CPU (the sink's write and the stamp
points' stages, from the Python workers' thread CPU, per partition) is measured as a share of
the run's CPU (this process and every process below it), with the source's read beside it.

The default query is the YSB join of maxrate. --json writes the result (a path or URI); the
demo's report carries it (cloudprofiler demo --calibration PATH).

examples:
  cloudprofiler calibrate --json calibration.json
  cloudprofiler calibrate --duration 3 --tolerance 0.1 --start 20000 --json s3://bucket/cal.json
  cloudprofiler calibrate --workload file:events.ndjson --schema 'user STRING, price DOUBLE' \\
      --query my_query:transform --json calibration.json
"""

# maxrate's options that describe a query running elsewhere or outputs calibrate does not write
NOT_HERE = ("sink", "spool", "endpoint", "plot", "report", "latency_slope")
VARIANTS = ("cloudprofiler", "noop")
KIND = "calibration"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """maxrate's options (the search, the trials, the built-in query), but those of a running query."""
    maxrate.add_arguments(p)
    for action in p._actions:
        if action.dest in NOT_HERE:
            action.help = argparse.SUPPRESS


def _check(args: argparse.Namespace) -> None:
    for dest in NOT_HERE:
        if getattr(args, dest) is not None:
            flag = "--" + dest.replace("_", "-")
            raise CommandError(
                f"{flag}: not an option of calibrate (it runs and measures its own two queries)"
            )
    maxrate._check(args)


def run(args: argparse.Namespace) -> int:
    """Both searches, their table and the JSON; 0 when both found a rate."""
    _check(args)
    json_loc = output_file("--json", args.json) if args.json else None
    from cloudprofiler.jobs.user_query import query_transform
    from cp_common.console import cli_console

    transform = query_transform(args.query) if args.query else None  # a bad spec costs no session
    console = cli_console(min_width=120)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cloudprofiler-calibrate-"))
    busy = [v for v in VARIANTS if (out / v).exists() and any((out / v).iterdir())]
    if busy:
        raise CommandError(f"{out / busy[0]} already holds a run: give an empty --out directory")
    load_before = os.getloadavg()
    with console.status("starting Spark (local[2])"):
        from pyspark.sql import SparkSession

        from cloudprofiler.spark_local import local_session

        owned = SparkSession.getActiveSession() is None
        spark = local_session("cloudprofiler-calibrate")
    try:
        searches = {v: _search(spark, args, transform, out / v, v, console) for v in VARIANTS}
    finally:
        if owned:
            spark.stop()
    doc = calibration_doc(args, searches, load_before, os.getloadavg())
    console.print(summary_table(doc))
    console.print(cpu_line(doc), soft_wrap=True)
    if json_loc is not None:
        json_loc.write_bytes(json.dumps(finite(doc), indent=2, default=str, allow_nan=False).encode())
        console.print(f"calibration written to {json_loc.uri}", soft_wrap=True)
    return 0 if doc["ratio"] is not None else 1


def _search(
    spark: Any, args: argparse.Namespace, transform: Any, work: Path, variant: str, console: Any
) -> dict[str, Any]:
    """maxrate's search on the query into ``variant``'s sink; its result document (and CPU)."""
    from cloudprofiler.jobs.queries import start_source_query
    from cp_common.cli_options import options_of
    from cp_common.self_cost import TreeCpu, cost_doc, query_cost

    tree = TreeCpu().start()
    target, query = start_source_query(
        spark,
        work,
        transform=transform,
        may_filter=transform is not None,
        sink_format=variant,
        **options_of(
            args, "workers", "max_spool_bytes", "handler", "bucket", "senders", "workload", "schema"
        ),
    )
    console.print(f"{variant}: {maxrate._built_in_label(args)} -> {variant} sink, in {work}", soft_wrap=True)
    try:
        opts = options_of(
            args, "method", "start", "increment", "max_rate", "tolerance", "max_steps", "duration", "grace"
        )
        progress = maxrate.progress_printer(console)
        result, trial, attempts = maxrate.find_max_rate(
            target, retries=args.retries, progress=progress, **opts
        )
    finally:
        query.stop()
    cpu_s = tree.stop()
    console.print(maxrate.step_table(attempts, f"calibrate: {variant} sink, {args.duration:g} s per trial"))
    doc = maxrate.result_doc(result, attempts, trial, args)
    doc["query_id"] = str(query.id)
    doc["cpu"] = cost_doc(query_cost(str(query.id), remove=True), cpu_s)
    return doc


def finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float as None: strict JSON (maxrate's default
    ``--max-rate`` is infinite), which every JSON reader takes."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def calibration_doc(
    args: argparse.Namespace,
    searches: dict[str, dict[str, Any]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    """The --json document: both rates, their ratio, the profiler's CPU share, the machine's load."""
    with_, noop = (searches[v]["max_rate"] for v in VARIANTS)
    return {
        "kind": KIND,
        "query": maxrate._built_in_label(args),
        "workload": args.workload,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rate_with_profiler": with_,
        "rate_noop": noop,
        "ratio": with_ / noop if with_ and noop else None,
        # a search the generator capped found at most that rate: the ratio is then a bound
        "generator_caps": {v: searches[v]["generator_cap"] for v in VARIANTS},
        "profiler_cpu": searches["cloudprofiler"]["cpu"],
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "cpus": os.cpu_count(),
        "searches": searches,
    }


def summary_table(doc: dict[str, Any]) -> Any:
    """The two rates and their ratio as a rich table."""
    from rich.table import Table

    t = Table(title=f"calibration: {doc['query']}")
    for col in ("sink", "max sustainable rate", "trials", "stopped because"):
        t.add_column(col, justify="left" if col in ("sink", "stopped because") else "right")
    for v, rate in zip(VARIANTS, (doc["rate_with_profiler"], doc["rate_noop"]), strict=True):
        s = doc["searches"][v]
        t.add_row(v, _rate(rate), str(len(s["attempts"])), s["stopped_because"])
    t.add_row("ratio", "-" if doc["ratio"] is None else f"{doc['ratio']:.2f}", "", "with / noop")
    return t


def _rate(rate: float | None) -> str:
    return "none" if rate is None else f"{rate:,.0f} tuples/s"


def cpu_line(doc: dict[str, Any]) -> str:
    """The profiler's CPU share during the search with its sink, and the load around both."""
    from cp_common.self_cost import share_line

    load = doc["load_average"]
    return (
        f"{share_line(doc['profiler_cpu'])} (the search with the profiler's sink); load average "
        f"{load['before'][0]:.2f} before, {load['after'][0]:.2f} after, {doc['cpus']} CPUs"
    )


def calibration_line(doc: dict[str, Any] | None) -> str:
    """One line for a report: the last calibration of the query, or that none was run."""
    if doc is None:
        return (
            "no calibration of this query was run for this report "
            "(cloudprofiler calibrate --json PATH, then --calibration PATH)"
        )
    caps = [v for v, cap in doc["generator_caps"].items() if cap is not None]
    capped = f"; the generator capped the {' and '.join(caps)} search" if caps else ""
    ratio = "-" if doc["ratio"] is None else f"{doc['ratio']:.2f}"
    return (
        f"calibration ({doc['created']}, {doc['query']}): {_rate(doc['rate_with_profiler'])} with the "
        f"profiler's sink, {_rate(doc['rate_noop'])} into noop, ratio {ratio}{capped}"
    )


def load_calibration(where: str | Location) -> dict[str, Any]:
    """A calibration document (``--json`` of calibrate) from a path or URI; one line if it is not one."""
    loc = resolve(where) if isinstance(where, str) else where
    try:
        doc = json.loads(loc.read_bytes())
    except (OSError, ValueError) as e:
        raise CommandError(f"--calibration {redact(str(where))}: cannot read a calibration ({e})") from e
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise CommandError(f"--calibration {loc.uri}: not the JSON of cloudprofiler calibrate")
    return doc
