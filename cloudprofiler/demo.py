"""``cloudprofiler demo``: the YSB pipeline on embedded defaults, with latencies.

Two streaming queries run side by side on one local Spark, each on its own
"cloudprofiler" source (an embedded factory and spool each) fed by its own
generator process:

* the **latency** query: YSB events joined with the campaigns table, a stamp
  point after the join, into the cloudprofiler sink (one record per tuple);
* the **windows** query: the YSB query proper, 10-second event-time windowed
  view counts per campaign; each output row carries the generator stamp of the
  window's latest tuple and is stamped when Spark hands it out.

Sync agents probe every pair of TSC domains before and after the run, and the
records are translated into latencies with error bounds. With
``--simulate-nodes K`` the generators and factories run under virtual TSC
domains, so the cross-node path is exercised on one machine (labelled as
simulated).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cloudprofiler.errors import CommandError

DESCRIPTION = """Run the YSB pipeline on embedded defaults: local Spark (local[2], UI off), the
"cloudprofiler" stream reader with its embedded factory, generators in background
processes, the YSB query (filter views, join the campaigns table on ad_id,
10-second event-time windowed count per campaign) and a per-tuple latency query
into the cloudprofiler sink, MinRTT sync before and after. Prints what was
offered, dropped, lost and ingested, the rate sustained, and the latency table
(generator to source, source to sink, end to end, windowed output) with error
bounds; writes latency.parquet (one row per record and pair of points),
latency.png and timeline.png beside the output.

examples:
  cloudprofiler demo
  cloudprofiler demo --duration 5 --rate 20000
  cloudprofiler demo --simulate-nodes 2            # generator and factory on simulated nodes
  cloudprofiler demo --out /tmp/ysb --summary /tmp/ysb/summary.json
"""

# the console script's entry point (python -m would load cli.py a second time, as __main__)
CLI = [sys.executable, "-c", "import sys; from cloudprofiler.cli import main; sys.exit(main())"]
WINDOW = "10 seconds"
WATERMARK = "30 seconds"
# Simulated nodes: (skew ppm, offset cycles) of each virtual TSC domain.
SIM_CLOCKS = [
    ("85.5", 700_000_000_000_000),
    ("-142", -300_000_000_000_000),
    ("230", 50_000_000_000_000),
    ("-37.25", 900_000_000_000_000),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler demo``."""
    p.add_argument("--duration", type=float, default=10.0, help="seconds of generated load (default 10)")
    p.add_argument("--rate", type=float, default=50_000, help="tuples per second offered (default 50000)")
    p.add_argument("--workers", type=int, default=2, help="factory worker processes (default 2)")
    p.add_argument("--bucket", type=int, default=1000, help="tuples per bucket (default 1000)")
    p.add_argument(
        "--simulate-nodes",
        type=int,
        default=0,
        metavar="K",
        help="run the generators and factories under K virtual TSC domains (1 to 4; default 0: "
        "everything on this node's real TSC)",
    )
    p.add_argument("--rounds", type=int, default=100, help="probes per pair and sync phase (default 100)")
    p.add_argument("--out", help="directory for spools, checkpoints, records and plots (default: a temp dir)")
    p.add_argument("--summary", help="also write the totals as JSON to this file")
    p.add_argument("--timeout", type=float, default=180.0, help="give up after this many seconds")


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.duration <= 3600:
        raise CommandError(f"--duration {args.duration}: expected 0 < seconds <= 3600")
    if not 0 < args.rate <= 1e8:
        raise CommandError(f"--rate {args.rate}: expected 0 < tuples/s <= 1e8")
    if not 1 <= args.workers <= 64:
        raise CommandError(f"--workers {args.workers}: expected 1..64")
    if not 1 <= args.bucket <= 1 << 20:
        raise CommandError(f"--bucket {args.bucket}: expected 1..1048576")
    if not 0 <= args.simulate_nodes <= len(SIM_CLOCKS):
        raise CommandError(f"--simulate-nodes {args.simulate_nodes}: expected 0..{len(SIM_CLOCKS)}")
    if not 2 <= args.rounds <= 10_000:
        raise CommandError(f"--rounds {args.rounds}: expected 2..10000")


def _wait(predicate: Any, deadline: float, what: str) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise CommandError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _drained(spool: Path, senders: list[str]) -> bool:
    """Every sender's end-of-stream arrived and every factory worker has published what it holds."""
    from cp_source.spool import Spool

    stats = Spool(spool).stats()
    if set(senders) - set(stats["end_of_stream"]):
        return False
    return all(
        w.get("pending_rows") == 0
        and not w.get("paused")
        and w.get("updated_wall", 0) - w.get("last_recv_wall", 0) >= 0.5
        for w in stats["per_worker"].values()
    )


def _end_offset(query: Any) -> dict[str, int] | None:
    prog = query.lastProgress
    if not prog or not prog["sources"]:
        return None
    end = prog["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Processes:
    """Child processes the demo started; all are stopped on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen:
        p = subprocess.Popen(argv, env=dict(os.environ, **(env or {})), **kw)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class _Nodes:
    """Which TSC domain runs each part: the real one, or simulated virtual domains."""

    def __init__(self, k: int) -> None:
        from native_tsc.domain import make_virtual

        self.virtual = [
            make_virtual(f"sim-node{i + 1}", skew, off) for i, (skew, off) in enumerate(SIM_CLOCKS[:k])
        ]

    def env(self, part: str) -> dict[str, str]:
        """CP_TSC_VIRTUAL for ``part`` (generator or factory); empty on the real TSC."""
        if not self.virtual:
            return {}
        v = self.virtual[0] if part == "generator" or len(self.virtual) == 1 else self.virtual[1]
        return {"CP_TSC_VIRTUAL": v.spec()}


def _sync_phase(server: str | None, phase: str, rounds: int, out: Path, expect: int) -> dict[str, Any]:
    if server is None:
        # One TSC domain: a phase with no pairs to probe, only the domain's frequency.
        import native_tsc
        from cp_sync.sync_table import write_sync

        write_sync(out, phase, [], {native_tsc.domain_id(): native_tsc.frequency_hz()})
        return {"phase": phase, "pairs": [], "failures": []}
    from cp_sync.coordinator import run_phase

    r = run_phase(server, phase, rounds, out, expect=expect, wait_s=30.0)
    if r["failures"]:
        raise CommandError(f"sync {phase}: {'; '.join(r['failures'])}")
    return r


def _latencies(records: Path, windows: Path, sync_dir: Path, reference: str) -> tuple[Any, list, dict]:
    """Every pair of points the demo reports, translated into ``reference``: table, summary rows, facts."""
    import pyarrow as pa

    from cp_sync.latency_report import DEFAULT_PAIRS, latency_report

    rows, facts, out = latency_report(records, sync_dir, DEFAULT_PAIRS, reference=reference)
    wrows, wfacts, wout = latency_report(
        windows, sync_dir, (("gen", "window", "windowed output"),), reference=reference
    )
    missing = facts["missing"] | wfacts["missing"]
    if missing or out is None or wout is None:
        raise CommandError(f"latencies could not be translated: {missing}")
    return pa.concat_tables([out, wout]), rows + wrows, facts


def _timeline_plot(out: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.compute as pc

    fig, ax = plt.subplots(figsize=(9, 4))
    for a, b in (("gen", "sink"), ("gen", "window")):
        sel = out.filter(pc.and_(pc.equal(out["from_point"], a), pc.equal(out["to_point"], b)))
        sel = sel.sort_by("tuple_id")
        lat = sel["duration_ns"].to_numpy() / 1e6
        ax.plot(range(len(lat)), lat, ".", markersize=2, label=f"{a} -> {b}")
    ax.set_xlabel("record (in tuple-id order)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("end-to-end and windowed-output latency over the run")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    _check(args)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cloudprofiler-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    spools = {"windows": out / "spool", "latency": out / "spool-latency"}
    for spool in spools.values():
        if spool.exists() and any(spool.iterdir()):
            raise CommandError(f"{spool} already holds a spool: give an empty --out directory")
    records, windows_dir, sync_dir = out / "records", out / "windows", out / "sync"
    deadline = time.monotonic() + args.timeout
    started = time.monotonic()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    nodes = _Nodes(args.simulate_nodes)

    with ExitStack() as stack, console.status("starting Spark (local[2])") as status:
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        import cloudprofiler
        import native_tsc
        from cp_sink.records import read_records
        from cp_sink.stamp import stamp
        from cp_source.spool import Spool
        from cp_source.workloads import campaigns_table

        procs = _Processes()
        stack.callback(procs.close)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("cloudprofiler-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
            .getOrCreate()
        )
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")

        # Sync agents: this process (Spark's driver and executors share this node's TSC) and one
        # process per simulated node.
        sync_server = None
        if nodes.virtual:
            from cp_sync.agent import Agent
            from cp_sync.coordinator import Coordinator

            status.update("starting sync agents")
            coord = Coordinator("127.0.0.1:0").start()
            stack.callback(coord.stop)
            sync_server = coord.address
            agent = Agent(sync_server)
            t = threading.Thread(target=agent.run, name="cp-demo-agent", daemon=True)
            t.start()
            stack.callback(agent.stop)
            for v in nodes.virtual:
                procs.start(
                    [*CLI, "sync", "agent", "--server", sync_server],
                    {"CP_TSC_VIRTUAL": v.spec()},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        expect = len(nodes.virtual) + 1
        status.update("sync: before")
        sync_before = _sync_phase(sync_server, "before", args.rounds, sync_dir, expect)

        cloudprofiler.register(spark)
        campaigns = F.broadcast(spark.createDataFrame(campaigns_table().to_pandas()))

        def source(name: str) -> Any:
            reader = (
                spark.readStream.format("cloudprofiler")
                .option("spool", str(spools[name]))
                .option("workers", str(args.workers))
            )
            if nodes.virtual:
                # A factory on a simulated node: an external process under its virtual TSC domain.
                endpoint = f"tcp://127.0.0.1:{_free_port()}"
                procs.start(
                    [
                        *CLI,
                        "factory",
                        "--endpoint",
                        endpoint,
                        "--spool",
                        str(spools[name]),
                        "--workers",
                        str(args.workers),
                    ],
                    nodes.env("factory"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                reader = reader.option("factory", "external").option("endpoint", endpoint)
            else:
                reader = reader.option("endpoint", "tcp://127.0.0.1:0")
            return reader.load()

        queries: dict[str, Any] = {}
        status.update("starting the queries and their factories")
        # every event (not only views), so the sink must hold exactly the tuples the factory published
        events = source("latency").join(campaigns, "ad_id")
        stamps = [c for c in events.columns if c.startswith("cp_")]
        queries["latency"] = (
            stamp(events.select("tuple_id", "campaign_id", *stamps), "join")
            .writeStream.format("cloudprofiler")
            .option("path", str(records))
            .option("handler", "id")
            .option("checkpointLocation", str(out / "checkpoint-latency"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )

        windows = (
            source("windows")
            .filter(F.col("event_type") == "view")
            .join(campaigns, "ad_id")
            .withWatermark("event_time", WATERMARK)
            .groupBy(F.window("event_time", WINDOW), "campaign_id")
            .agg(
                F.count("*").alias("views"),
                F.max("tuple_id").alias("tuple_id"),
                # the stamps of the window's latest tuple, for the windowed-output latency
                F.max_by("cp_tsc_gen", "tuple_id").alias("cp_tsc_gen"),
                F.max_by("cp_node_gen", "tuple_id").alias("cp_node_gen"),
            )
        )
        node = native_tsc.domain_id()

        def write_updates(batch: Any, batch_id: int) -> None:
            # update mode: each batch carries the new counts of the windows it touched; stamped
            # when Spark hands them out
            (
                batch.withColumn("batch_id", F.lit(batch_id))
                .withColumn("cp_tsc_window", F.lit(native_tsc.now()))
                .withColumn("cp_node_window", F.lit(node))
                .write.mode("append")
                .parquet(str(windows_dir))
            )

        queries["windows"] = (
            windows.writeStream.outputMode("update")
            .foreachBatch(write_updates)
            .option("checkpointLocation", str(out / "checkpoint"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        for q in queries.values():
            stack.callback(lambda q=q: q.isActive and q.stop())

        endpoints = {}
        for name, spool in spools.items():
            state = spool / "_reader.json"
            q = queries[name]
            _wait(
                lambda state=state, q=q: state.exists() or not q.isActive,
                deadline,
                f"the {name} query's factory",
            )
            if not q.isActive:
                raise CommandError(f"the {name} query stopped: {q.exception()}")
            endpoints[name] = json.loads(state.read_text())["factory_endpoint"]

        status.update(f"generating {args.rate:,.0f} tuples/s for {args.duration:g} s into each query")
        gens = {}
        for name, endpoint in endpoints.items():
            gens[name] = procs.start(
                [
                    *CLI,
                    "generate",
                    "--endpoint",
                    endpoint,
                    "--rate",
                    str(args.rate),
                    "--duration",
                    str(args.duration),
                    "--bucket",
                    str(args.bucket),
                    "--summary",
                    str(out / f"generator-{name}.json"),
                ],
                nodes.env("generator"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        summaries = {}
        for name, gen in gens.items():
            _, err = gen.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if gen.returncode != 0:
                last = err.strip().splitlines()[-1] if err.strip() else ""
                raise CommandError(f"the {name} generator failed: {last}")
            summaries[name] = json.loads((out / f"generator-{name}.json").read_text())

        status.update("waiting for the factories and the queries to catch up")
        for name, spool in spools.items():
            senders = [str(s["id"]) for s in summaries[name]["senders"]]
            _wait(
                lambda spool=spool, senders=senders: _drained(spool, senders),
                deadline,
                f"the {name} factory to publish everything",
            )
        latest = Spool(spools["windows"]).latest()
        qw = queries["windows"]
        _wait(lambda: _end_offset(qw) == latest or not qw.isActive, deadline, "the windows query")
        published_latency = Spool(spools["latency"]).stats()["rows"]
        ql = queries["latency"]

        def latency_done() -> bool:
            from cp_sink.records import total_seen

            return not ql.isActive or (records.exists() and total_seen(records) >= published_latency)

        _wait(latency_done, deadline, "the latency query")
        for name, q in queries.items():
            if q.exception() is not None:
                raise CommandError(f"the {name} query failed: {q.exception()}")
        rows_read = sum(int(p["numInputRows"]) for p in qw.recentProgress)
        for q in queries.values():
            q.stop()

        status.update("sync: after")
        sync_after = _sync_phase(sync_server, "after", args.rounds, sync_dir, expect)

        status.update("translating and summing up")
        stats = Spool(spools["windows"]).stats()
        stats_l = Spool(spools["latency"]).stats()
        updates = spark.read.parquet(str(windows_dir)) if windows_dir.exists() else None
        if updates is not None:
            final = updates.groupBy("window", "campaign_id").agg(F.max("views").alias("views"))
            agg = final.agg(F.count("*").alias("n"), F.sum("views").alias("v")).first()
            n_windows = final.select("window").distinct().count()
            window_keys, views_counted = int(agg["n"]), int(agg["v"] or 0)
        else:
            n_windows = window_keys = views_counted = 0
        rec = read_records(records)
        ids = rec["tuple_id"]
        import pyarrow.compute as pc

        n_records, n_unique = len(ids), pc.count_distinct(ids).as_py()
        reference = native_tsc.domain_id()
        lat, rows, facts = _latencies(records, windows_dir, sync_dir, reference)

    from cp_sync.report import plot

    summary = summaries["windows"]
    sl = summaries["latency"]
    totals = {
        "target_rate": summary["target_rate"],
        "achieved_rate": summary["achieved_rate"],
        "generator_bound": summary["generator_bound"],
        "offered": summary["offered"],
        "emitted": summary["emitted"],
        "dropped": summary["dropped"],
        "lost_in_transit": stats["lost_in_transit_total"],
        "rejected_buckets": stats["rejected_buckets"],
        "dead_letters": stats["deadletters_total"],
        "published": stats["rows"],
        "rows_read": rows_read,
        "windows": n_windows,
        "window_campaign_counts": window_keys,
        "views_counted": views_counted,
        "latency_query": {
            "emitted": sl["emitted"],
            "dropped": sl["dropped"],
            "lost_in_transit": stats_l["lost_in_transit_total"],
            "published": stats_l["rows"],
            "records": n_records,
            "unique_records": n_unique,
        },
        "simulated_nodes": [v.spec() for v in nodes.virtual],
        "reference_domain": reference,
        "frequency_hz": facts["frequency_hz"],
        "sync_pairs": {"before": sync_before["pairs"], "after": sync_after["pairs"]},
        "seconds": round(time.monotonic() - started, 1),
        "out": str(out),
    }
    # Every emitted tuple was read once by the windows query and is in the latency query's sink once.
    totals["consistent"] = (
        totals["rows_read"] == totals["published"] == totals["emitted"] - totals["lost_in_transit"]
        and n_records == n_unique == stats_l["rows"] == sl["emitted"] - stats_l["lost_in_transit_total"]
    )
    sustained = not summary["generator_bound"] and summary["dropped"] == 0 and sl["dropped"] == 0
    totals["sustained"] = sustained

    table = Table(title="cloudprofiler demo: YSB ingest (windows query)")
    table.add_column("what")
    table.add_column("value", justify="right")
    labels = [
        ("target rate (tuples/s)", f"{totals['target_rate']:,.0f}"),
        ("achieved rate (tuples/s)", f"{totals['achieved_rate']:,.0f}"),
        ("generator-bound", "yes (invalid run)" if totals["generator_bound"] else "no"),
        ("emitted", f"{totals['emitted']:,}"),
        ("dropped by the generator", f"{totals['dropped']:,}"),
        ("lost in transit", f"{totals['lost_in_transit']:,}"),
        ("published by the factory", f"{totals['published']:,}"),
        ("rows read by Spark", f"{totals['rows_read']:,}"),
        ("10 s windows", f"{totals['windows']:,}"),
        ("window x campaign counts", f"{totals['window_campaign_counts']:,}"),
        ("views counted", f"{totals['views_counted']:,}"),
        ("latency query: tuple records in the sink", f"{n_records:,}"),
        ("every emitted tuple read once", "yes" if totals["consistent"] else "NO"),
    ]
    for k, v in labels:
        table.add_row(k, v)
    console.print(table)
    rate_note = (
        f"sustained {args.rate:,.0f} tuples/s into each query with no drop"
        if sustained
        else f"did NOT sustain {args.rate:,.0f} tuples/s: dropped {summary['dropped'] + sl['dropped']:,}"
        + (" (generator-bound run)" if summary["generator_bound"] else "")
    )
    console.print(rate_note)

    totals["latency"] = rows
    where = "simulated nodes " + ", ".join(v.domain for v in nodes.virtual) if nodes.virtual else "one node"
    lt = Table(title=f"latency in ms, reference TSC domain {reference} ({where})")
    for c in ("path", "scenario", "count", "p50", "p90", "p99", "max", "bound median", "bound max"):
        lt.add_column(c, justify="left" if c in ("path", "scenario") else "right")
    for r in rows:
        lt.add_row(
            f"{r['label']} ({r['from_point']} -> {r['to_point']})",
            r["scenario"],
            f"{r['count']:,}",
            *(
                f"{r[k] / 1e3:.3f}"
                for k in ("p50_us", "p90_us", "p99_us", "max_us", "bound_median_us", "bound_max_us")
            ),
        )
    Console(width=max(console.width, 150)).print(lt)
    import pyarrow.parquet as pq

    pq.write_table(lat, out / "latency.parquet")
    plot(lat, str(out / "latency.png"))
    _timeline_plot(lat, out / "timeline.png")
    console.print(f"plots: {out / 'latency.png'}, {out / 'timeline.png'}")
    console.print(f"output in {out}  ({totals['seconds']} s)")
    if args.summary:
        Path(args.summary).write_text(json.dumps(totals, indent=2, default=str))
    return 0 if totals["consistent"] else 1
