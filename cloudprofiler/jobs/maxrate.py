"""``cloudprofiler maxrate``: the maximum rate a streaming query sustains without loss.

The paper's method applied to Spark: offer a constant rate for a fixed
duration from fresh sender ids, compare what the generator emitted with what
the query's cloudprofiler sink committed for those ids, and raise the rate
until a trial fails. Linear steps (the paper) or a bisection (far fewer
trials). A trial where the generator fell behind is invalid, not a drop.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudprofiler.errors import CommandError
from cloudprofiler.jobs.pipeline_trial import PipelineTrial
from cloudprofiler.jobs.queries import Target
from cloudprofiler.jobs.rate_search import SearchResult, Step, Trial, bisect_search, linear_search
from cloudprofiler.jobs.user_query import check_workload, query_transform
from cp_common.cli_options import options_of
from cp_common.faces import deprecated_names
from cp_common.printable import redact
from cp_store.location import Location, resolve
from cp_store.tables import output_file, resolve_option, write_figure

DESCRIPTION = """Find the maximum rate a streaming query sustains: constant-rate trials of
--duration seconds from fresh sender ids; a trial passes when the generator
dropped nothing, the factory lost nothing, and the sink committed every emitted
tuple within --grace seconds after the generator stopped (otherwise: drop, lost
or backlog). The automatic grace is the pipeline's own latency (the median of
the three smallest landing times of the loads it sustained, warm-ups included)
plus 0.5 s. A backlog that drains within the grace passes, so a rate up to
about grace/duration above capacity can pass: longer trials are more precise.
Optionally (--latency-slope) event-time latency must not keep
growing during the trial (Karimov et al.). A trial whose generator fell behind
its schedule is invalid (generator-bound) and caps the search.

Without --sink, maxrate starts local Spark and its own query: the
"cloudprofiler" source (embedded factory, spool bounded by --max-spool-bytes)
-> the YSB join with the campaigns table -> the cloudprofiler sink. On your
data (--workload file:PATH --schema DDL, or parquet:PATH)
the query is source -> sink, or your transformation: --query module:function
(or path/to/file.py:function) takes the source's DataFrame and returns what
goes into the sink, keeping tuple_id and the gen stamp (cp_tsc_gen,
cp_node_gen). A query that drops tuples is judged by what it read: a trial
lands once the query has read every tuple emitted, and what it read and did
not write is counted as filtered, at the same instant as what it received (a
tuple read after the grace counts against the trial, written or not). The
transformation is per tuple (filter, select, withColumn, a join with a static
table, UDFs): a streaming
aggregation is refused at start, as its windows come out in later trials. With
--sink, it measures your running query: its source must read the spool given
by --spool (or the factory at --endpoint) and its cloudprofiler sink must
write --sink and carry tuple_id for every tuple.

examples:
  cloudprofiler maxrate
  cloudprofiler maxrate --method linear --start 20000 --increment 20000 --duration 10
  cloudprofiler maxrate --method bisect --start 50000 --tolerance 0.05 --json maxrate.json --plot rate.png
  cloudprofiler maxrate --sink /data/records --spool /data/spool --latency-slope 0.05
  cloudprofiler maxrate --workload file:events.ndjson --schema 'user STRING, price DOUBLE'
  cloudprofiler maxrate --workload parquet:sample.parquet --query path/to/query.py:transform
  cloudprofiler maxrate --workload file:events.ndjson --schema 'user STRING, price DOUBLE' \
      --query my_query:transform --start 5000
  cloudprofiler maxrate --json s3://bucket/maxrate/result.json --plot s3://bucket/maxrate/rate.png
"""

PROGRESS_COLOURS = {"sustained": "green", "generator-bound": "yellow"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler maxrate``."""
    p.add_argument("--method", choices=["bisect", "linear"], default="bisect", help="search (default bisect)")
    p.add_argument("--start", type=float, default=20_000, help="first rate, tuples/s (default 20000)")
    p.add_argument("--increment", type=float, help="linear: rate step (default: the start rate)")
    p.add_argument("--max-rate", type=float, default=math.inf, help="never offer more than this")
    p.add_argument("--tolerance", type=float, default=0.05, help="bisect: stop within this fraction (0.05)")
    p.add_argument("--max-steps", type=int, default=20, help="at most this many judged trials (20)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per trial (default 5)")
    p.add_argument(
        "--grace",
        type=float,
        help="seconds after the generator stops for the sink to commit the rest; a rate up to "
        "about grace/duration above capacity can pass (default: the pipeline's reference "
        "landing time + 0.5 s)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=1,
        help="re-run a failed trial: at most 1 + 2 x this many runs, sustained once the passing "
        "runs outnumber the failing ones (default 1)",
    )
    p.add_argument(
        "--latency-slope",
        type=float,
        help="fail a trial whose gen->sink latency grows faster than this (s per s), e.g. 0.05",
    )
    p.add_argument("--bucket", type=int, default=1000, help="tuples per generator bucket (default 1000)")
    p.add_argument("--senders", type=int, default=1, help="generator processes (default 1)")
    p.add_argument(
        "--sink", help="sink path or URI of a running query to measure (default: start the built-in one)"
    )
    p.add_argument("--spool", help="the running query's spool (transit-loss counts and its factory endpoint)")
    p.add_argument("--endpoint", help="the running query's factory endpoint (default: read from --spool)")
    p.add_argument("--workers", type=int, default=2, help="built-in query: factory workers (default 2)")
    p.add_argument(
        "--max-spool-bytes",
        type=int,
        default=64 << 20,
        help="built-in query: spool bound in bytes (default 64 MiB)",
    )
    p.add_argument(
        "--handler", default="xoy", help="built-in query: sink handler (default xoy; pc, null, id)"
    )
    p.add_argument("--out", help="built-in query: local work directory (default: a temp dir)")
    p.add_argument(
        "--workload",
        default="ysb",
        help="what the generator replays and the source reads: ysb (default), file:PATH (NDJSON, "
        "with --schema) or parquet:PATH",
    )
    p.add_argument("--schema", help="the records' schema in Spark DDL, e.g. 'user STRING, price DOUBLE'")
    p.add_argument(
        "--query",
        help="built-in query: module:function or path/to/file.py:function, taking the source's "
        "DataFrame and returning the sink's (default: the YSB join on ysb, source -> sink otherwise)",
    )
    p.add_argument("--json", help="write the result (every step) as JSON here (a path or URI)")
    p.add_argument("--plot", help="write the ingestion rate over time (PNG) here (a path or URI)")
    p.add_argument(
        "--report",
        metavar="DIR",
        help="write the run directory (run.json, report.html: verdict, every trial as a table and a "
        "chart, machine) here, a path or URI (default: the built-in query's work directory; with "
        "--sink, none)",
    )


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.start <= 1e9:
        raise CommandError(f"--start {args.start}: expected 0 < tuples/s <= 1e9")
    if args.increment is not None and not 0 < args.increment <= 1e9:
        raise CommandError(f"--increment {args.increment}: expected 0 < tuples/s <= 1e9")
    if not 0 < args.tolerance < 1:
        raise CommandError(f"--tolerance {args.tolerance}: expected a fraction in (0, 1)")
    if not 0 < args.duration <= 3600 or args.grace is not None and not 0 <= args.grace <= 600:
        raise CommandError("--duration must be in (0, 3600] and --grace in [0, 600] seconds")
    if not 0 <= args.retries <= 5 or not 1 <= args.max_steps <= 200:
        raise CommandError("--retries must be 0..5 and --max-steps 1..200")
    if not 1 <= args.senders <= 256 or not 1 <= args.bucket <= 1 << 20 or not 1 <= args.workers <= 64:
        raise CommandError("--senders must be 1..256, --bucket 1..1048576, --workers 1..64")
    if args.spool and not args.sink or args.endpoint and not args.sink:
        raise CommandError("--spool and --endpoint describe a running query: give its --sink too")
    if args.sink and not (args.spool or args.endpoint):
        raise CommandError("--sink needs --spool (or --endpoint) of the query's source")
    if args.sink and args.query:
        raise CommandError("--query shapes the built-in query: not with --sink (your query has its own)")
    check_workload(args.workload, args.schema)
    if args.report:
        resolve_option("--report", args.report)  # a typo in the scheme fails now, not after the search
    if args.out and not resolve_option("--out", args.out).is_local:
        raise CommandError(
            f"--out {redact(args.out)}: the built-in query's work directory holds its spool, which "
            "stays on local disk; give a local path (--json and --plot take URIs)"
        )


def _outputs(args: argparse.Namespace) -> tuple[Location | None, Location | None]:
    """Where --json and --plot go, checked before the search starts (a typo fails now, not after it)."""
    json_loc = output_file("--json", args.json) if args.json else None
    plot_loc = output_file("--plot", args.plot) if args.plot else None
    return json_loc, plot_loc


def confirming(
    trial: Trial,
    retries: int,
    latency_slope_limit: float | None,
    attempts: list[Step],
    progress: Callable[[Step], None] | None = None,
) -> Trial:
    """A trial that re-runs a failure; every run is kept in ``attempts``.

    On a shared machine a single slow micro-batch can fail a trial the pipeline
    sustains, so a failed rate runs again, at most ``1 + 2 * retries`` runs in
    all, and is sustained once its passing runs outnumber its failing ones. A
    pass after a failure is a tie, not a pass: taking any pass would give a rate
    just above capacity, which now and then lands within the grace period, one
    more chance per retry. The returned step carries the rate's verdict.
    """

    def run(rate: float) -> Step:
        passed = failed = 0
        budget = 1 + 2 * retries
        for i in range(budget):
            step = trial(rate)
            verdict = step.judge(latency_slope_limit)
            attempts.append(step)
            if progress is not None:
                progress(step)
            if verdict == "generator-bound":
                break
            passed, failed = (passed + 1, failed) if verdict == "sustained" else (passed, failed + 1)
            # stop once the passes lead, or once the failures can no longer be outnumbered
            if passed > failed or failed - passed > budget - 1 - i:
                break
        return step

    return run


def find_max_rate(
    target: Target,
    method: str = "bisect",
    start: float = 20_000,
    increment: float | None = None,
    max_rate: float = math.inf,
    tolerance: float = 0.05,
    max_steps: int = 20,
    duration: float = 5.0,
    grace: float | None = None,
    retries: int = 1,
    latency_slope_limit: float | None = None,
    warm_up: bool = True,
    progress: Callable[[Step], None] | None = None,
) -> tuple[SearchResult, PipelineTrial, list[Step]]:
    """Search the maximum sustainable rate of ``target``; return the result, the trial and every attempt.

    ``target`` comes from :func:`cloudprofiler.jobs.queries.start_source_query`
    (a query this process starts on a SparkSession) or
    :func:`cloudprofiler.jobs.queries.user_target` (a query running elsewhere).
    """
    trial = PipelineTrial(target, duration=duration, grace=grace, latency=latency_slope_limit is not None)
    if warm_up or grace is None:
        # the first micro-batches start Python workers and JIT-compile parsers: not part of any trial;
        # an automatic grace period starts from the warm-ups' landing times
        trial.warm_up(min(start / 2, 10_000), duration=2.0)
    attempts: list[Step] = []
    run = confirming(trial, retries, latency_slope_limit, attempts, progress)
    if method == "linear":
        result = linear_search(
            run,
            start,
            increment or start,
            max_rate=max_rate,
            max_steps=max_steps,
            latency_slope_limit=latency_slope_limit,
        )
    elif method == "bisect":
        result = bisect_search(
            run,
            start,
            tolerance=tolerance,
            max_rate=max_rate,
            max_steps=max_steps,
            latency_slope_limit=latency_slope_limit,
        )
    else:
        raise ValueError(f"method {method!r}: expected bisect or linear")
    return result, trial, attempts


def step_table(attempts: list[Step], title: str) -> Any:
    """A rich table of every trial run (retries included)."""
    from rich.table import Table

    t = Table(title=title)
    filtering = any(s.filtered for s in attempts)  # a user's query that drops tuples
    cols = ["#", "rate", "achieved", "emitted", "dropped", "lost", "received"]
    # a filtering query's ledger: emitted = lost + received + filtered + pending when judged
    cols += ["filtered", "pending"] * filtering + ["landing/grace", "latency slope", "verdict"]
    for col in cols:
        t.add_column(col, justify="left" if col == "verdict" else "right")
    for i, s in enumerate(attempts, 1):
        slope = "-" if s.latency_slope is None else f"{s.latency_slope:+.3f}"
        landing = "-" if s.landing is None else f"{s.landing:.2f}"
        grace = "-" if s.grace is None else f"{s.grace:.2f} s"
        colour = PROGRESS_COLOURS.get(s.verdict, "red")
        t.add_row(
            str(i),
            f"{s.rate:,.0f}",
            f"{s.achieved_rate:,.0f}",
            f"{s.emitted:,}",
            f"{s.dropped:,}",
            f"{s.lost:,}",
            f"{s.received:,}",
            *([f"{s.filtered:,}", f"{s.pending:,}"] * filtering),
            f"{landing}/{grace}",
            slope,
            f"[{colour}]{s.verdict}[/{colour}]",
        )
    return t


def ingestion_rows(sink: str | Path, history: list[dict[str, Any]]) -> tuple[list[list[float]], str]:
    """The ingestion rate at the sink over the search (the paper's Fig. 3): rows of (time since the
    first trial, tuples/s committed over the period or micro-batch that ended then, the rate the
    trial running then offered, 0 between trials), and where the rate came from.

    From the ``pc`` handler's periods when the sink kept them, else from the per-micro-batch counts
    (tuples committed between consecutive sink stamps). The PNG (``--plot``) and the report's chart
    are both drawn from these rows.
    """
    import numpy as np

    import native_tsc
    from cp_sink.records import read_counts, read_periods

    hz = native_tsc.frequency_hz()
    t0 = min((h["tsc_start"] for h in history), default=0)
    periods = read_periods(sink)
    x = y = np.empty(0)
    if periods.num_rows:
        source = "pc handler periods"
        g = periods.group_by(["period"]).aggregate(
            [("count", "sum"), ("period_cycles", "max"), ("period_ms", "max")]
        )
        per = g["period"].to_numpy()
        order = np.argsort(per)
        seconds = g["period_ms_max"].to_numpy()[order] / 1000.0
        x = ((per[order] + 1) * g["period_cycles_max"].to_numpy()[order] - t0) / hz  # the period's end
        y = g["count_sum"].to_numpy()[order] / seconds
    else:
        source = "per-micro-batch counts"
        c = read_counts(sink)
        if c.num_rows:
            g = c.group_by(["batch_id"]).aggregate([("seen", "sum"), ("last_tsc_sink", "max")])
            order = np.argsort(g["last_tsc_sink_max"].to_numpy())
            end = g["last_tsc_sink_max"].to_numpy()[order].astype(np.float64)
            seen = g["seen_sum"].to_numpy()[order]
            keep = end > 0
            end, seen = end[keep], seen[keep]
            if len(end) > 1:
                x = (end[1:] - t0) / hz
                y = seen[1:] / np.maximum((end[1:] - end[:-1]) / hz, 1e-3)
    spans = [((h["tsc_start"] - t0) / hz, (h["tsc_offered"] - t0) / hz, h["rate"]) for h in history]
    rows = []
    for t, rate in zip(x.tolist(), y.tolist(), strict=True):
        offered = next((r for lo, hi, r in spans if lo <= t <= hi), 0.0)
        rows.append([float(t), float(rate), float(offered)])
    return rows, source


def plot_ingestion(sink: str | Path, history: list[dict[str, Any]], path: str | Path | Location) -> str:
    """Ingestion rate over time at the sink (:func:`ingestion_rows`) with the offered rate of each
    trial, as a PNG at ``path`` (a path or URI). Returns where the rate came from."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import native_tsc

    rows, source = ingestion_rows(sink, history)
    hz = native_tsc.frequency_hz()
    t0 = min((h["tsc_start"] for h in history), default=0)
    fig, ax = plt.subplots(figsize=(9, 4))
    if rows:
        ax.step([r[0] for r in rows], [r[1] for r in rows], where="pre", label=f"ingested (sink, {source})")
    for i, h in enumerate(history):
        xs = [(h["tsc_start"] - t0) / hz, (h["tsc_offered"] - t0) / hz]
        ax.plot(xs, [h["rate"], h["rate"]], color="black", lw=2, label="offered" if i == 0 else None)
    ax.set_xlabel("time since the first trial (s)")
    ax.set_ylabel("tuples/s")
    ax.set_title(f"ingestion rate at the sink ({source})")
    ax.legend(loc="upper left")
    fig.tight_layout()
    write_figure(resolve(path), fig)
    return source


def _report(
    result: SearchResult,
    attempts: list[Step],
    trial: PipelineTrial,
    args: argparse.Namespace,
    console: Any,
    outputs: tuple[Location | None, Location | None] | None = None,
    workdir: Path | None = None,
) -> None:
    ref = trial.reference_landing()
    if trial.grace is not None:
        grace = f"grace {trial.grace:.2f} s"
    else:
        grace = "automatic grace" + ("" if ref is None else f" (reference landing {ref:.2f} s)")
    console.print(
        step_table(
            attempts,
            f"maxrate: {result.method} search, {args.duration:g} s per trial, {grace}",
        )
    )
    found = "none" if result.max_rate is None else f"{result.max_rate:,.0f} tuples/s"
    console.print(f"maximum sustainable rate: [bold]{found}[/bold] ({result.stopped_because})")
    loosest = max((s.grace for s in attempts if s.grace is not None), default=0.0)
    if loosest / args.duration > args.tolerance:
        # a backlog that drains within the grace period passes: the result can be this far above capacity
        console.print(
            f"[yellow]grace {loosest:.2f} s is {loosest / args.duration:.0%} of the trial duration: "
            "a rate up to about that much above capacity can pass; a longer --duration is "
            "more precise[/yellow]"
        )
    if result.generator_cap is not None:
        console.print(
            f"[yellow]the generator could not offer {result.generator_cap:,.0f} tuples/s here: "
            "rates above it were not tested[/yellow]"
        )
    json_loc, plot_loc = _outputs(args) if outputs is None else outputs
    if json_loc is not None:
        json_loc.write_bytes(
            json.dumps(result_doc(result, attempts, trial, args), indent=2, default=str).encode()
        )
        console.print(f"result written to {json_loc.uri}")
    if plot_loc is not None:
        source = plot_ingestion(trial.target.sink, trial.history, plot_loc)
        console.print(f"ingestion-rate plot ({source}): {plot_loc.uri}")
    where = args.report or workdir
    if where is not None:  # the HTML report's path: the last line
        from cloudprofiler.report.runs import maxrate_latency, write_maxrate_run

        label = _built_in_label(args) if workdir is not None else f"the query writing {redact(args.sink)}"
        sink, history = trial.target.sink, trial.history
        page = write_maxrate_run(
            resolve_option("--report", where),
            result,
            attempts,
            args,
            label,
            ingestion_rows(sink, history),
            # a local run's records share one TSC domain; a running query's may not (translate them)
            maxrate_latency(sink, attempts, history) if workdir is not None else None,
        )
        console.print(f"report: {page.uri}", soft_wrap=True)


def result_doc(
    result: SearchResult, attempts: list[Step], trial: PipelineTrial, args: argparse.Namespace
) -> dict[str, Any]:
    """The --json document: the result, every attempt, the trials and the settings (locations given
    as URIs without credentials)."""
    doc = result.to_json()
    doc["attempts"] = [s.__dict__ for s in attempts]
    doc["trials"] = trial.history
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    for k in ("sink", "spool", "out", "report"):
        if isinstance(settings.get(k), str):
            settings[k] = redact(settings[k])
    doc["settings"] = settings
    return doc


def run(args: argparse.Namespace) -> int:
    """Run the search and print every step."""
    _check(args)
    outputs = _outputs(args)
    # loaded before Spark starts: a bad spec costs no session
    transform = query_transform(args.query) if args.query else None
    from cloudprofiler.jobs.queries import user_target
    from cp_common.console import cli_console

    console = cli_console(min_width=120)  # the step table needs ~110 columns
    names = (
        "method",
        "start",
        "increment",
        "max_rate",
        "tolerance",
        "max_steps",
        "duration",
        "grace",
        "retries",
    )
    opts = options_of(args, *names, latency_slope_limit="latency_slope")
    opts["progress"] = progress_printer(console)
    if args.sink:
        target = user_target(
            args.sink, args.spool, args.endpoint, args.bucket, args.senders, args.workload, args.schema
        )
        console.print(f"measuring the query that writes {redact(args.sink)}")
        result, trial, attempts = find_max_rate(target, **opts)
        _report(result, attempts, trial, args, console, outputs)
        return 0 if result.max_rate is not None else 1
    return _run_built_in(args, opts, transform, console, outputs)


def progress_printer(console: Any) -> Callable[[Step], None]:
    """A search's progress: one line per trial run as it is judged."""

    def progress(step: Step) -> None:
        colour = PROGRESS_COLOURS.get(step.verdict, "red")
        filtered = f", filtered {step.filtered:,}, pending {step.pending:,}" if step.filtered else ""
        console.print(
            f"  {step.rate:>12,.0f} tuples/s: emitted {step.emitted:,}, "
            f"dropped {step.dropped:,}, lost {step.lost:,}, received {step.received:,}{filtered} "
            f"-> [{colour}]{step.verdict}[/{colour}]"
        )

    return progress


def _built_in_label(args: argparse.Namespace) -> str:
    if args.query:
        return f"cloudprofiler source ({args.workload}) -> {args.query}"
    if args.workload == "ysb":
        return "cloudprofiler source -> YSB join"
    return f"cloudprofiler source ({args.workload})"


def _run_built_in(
    args: argparse.Namespace,
    opts: dict[str, Any],
    transform: Callable[[Any], Any] | None,
    console: Any,
    outputs: tuple[Location | None, Location | None],
) -> int:
    """The search on the built-in query: local Spark, the embedded source, the transformation, the sink."""
    from cloudprofiler.jobs.queries import start_source_query

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cloudprofiler-maxrate-"))
    if (out / "spool").exists() and any((out / "spool").iterdir()):
        raise CommandError(f"{out / 'spool'} already holds a spool: give an empty --out directory")
    with console.status("starting Spark (local[2]) and the built-in query"):
        from pyspark.sql import SparkSession

        from cloudprofiler.spark_local import local_session

        # called from a running session (a notebook, cloudprofiler.cli.main): use it and leave it running
        owned = SparkSession.getActiveSession() is None
        spark = local_session("cloudprofiler-maxrate")
    query = None
    try:
        target, query = start_source_query(
            spark,
            out,
            transform=transform,
            may_filter=transform is not None,
            **options_of(
                args, "workers", "max_spool_bytes", "handler", "bucket", "senders", "workload", "schema"
            ),
        )
        console.print(f"built-in query: {_built_in_label(args)} -> sink ({args.handler}) in {out}")
        result, trial, attempts = find_max_rate(target, **opts)
        _report(result, attempts, trial, args, console, outputs, out)
    finally:
        if query is not None and query.isActive:
            query.stop()
        if owned:
            spark.stop()
    return 0 if result.max_rate is not None else 1


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["find_max_rate", "step_table"])
