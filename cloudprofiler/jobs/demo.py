"""``cloudprofiler demo``: the YSB pipeline on embedded defaults, with latencies.

Two streaming queries run side by side on one local Spark, each on its own
"cloudprofiler" source (an embedded factory and spool each) fed by its own
generator process:

* the **latency** query: YSB events joined with the campaigns table, a stamp
  point after the join, into the cloudprofiler sink (one record per tuple);
* the **windows** query: the YSB query proper, 10-second event-time windowed
  view counts per campaign; each output row carries the generator stamp of the
  window's latest tuple and is stamped when Spark hands it out.

The run warms up before it measures: the queries start, each waits for its
factory (workers ready to parse), a short warm-up load (--warmup seconds at the
same rate) goes through both queries until their first batches are done, and
only then does the measured load begin. The warm-up is reported on its own line;
the ingest and latency tables show the measured, steady-state load.

Sync agents probe every pair of TSC domains every few seconds for the whole
run (continuous sync, from before the first record to after the last), and the
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
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import native_tsc
from cloudprofiler.children import cli_argv, stop_processes
from cloudprofiler.errors import CommandError
from cloudprofiler.jobs.demo_args import DESCRIPTION as DESCRIPTION  # the command's face (cloudprofiler.cli)
from cloudprofiler.jobs.demo_args import SIM_CLOCKS, check_args
from cloudprofiler.jobs.demo_args import add_arguments as add_arguments
from cloudprofiler.jobs.demo_phases import Laps, phase_collector, write_phase_table
from cloudprofiler.jobs.demo_report import DemoLayout
from cp_store.location import Location

QUERIES = ("latency", "windows")
QUEUE_MS = 1000
DRIVER_MEMORY = "512m"


def _wait(predicate: Callable[[], bool], deadline: float, what: str) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise CommandError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _catch_up(done: Callable[[], bool], what: str, deadline: float, since: float, rate: float) -> None:
    """Wait for the queries to catch up with a load that ended at ``since``; past ``deadline`` that is
    the run's verdict, in one line."""
    try:
        _wait(done, deadline, what)
    except CommandError:
        behind = time.monotonic() - since
        raise CommandError(
            f"not sustained: {rate:,.0f} tuples/s into each query: still catching up {behind:.0f} s after "
            f"the load ended ({what}; --timeout)"
        ) from None


def _stop_query(query: Any) -> None:
    if query.isActive:
        query.stop()


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
        stop_processes(self.procs)


class _Nodes:
    """Which TSC domain runs each part: the real one, or simulated virtual domains."""

    def __init__(self, k: int) -> None:
        from native_tsc.domain import make_virtual

        self.virtual = [
            make_virtual(f"sim-node{i + 1}", ppm, off) for i, (ppm, off) in enumerate(SIM_CLOCKS[:k])
        ]

    def env(self, part: str) -> dict[str, str]:
        """CP_TSC_VIRTUAL for ``part`` (generator or factory); empty on the real TSC."""
        if not self.virtual:
            return {}
        v = self.virtual[0] if part == "generator" or len(self.virtual) == 1 else self.virtual[1]
        return {"CP_TSC_VIRTUAL": v.spec()}


@dataclass
class _Demo:
    """One demo run: where things go, what runs, and what each step found."""

    args: argparse.Namespace
    out: Path
    stack: ExitStack
    status: Any
    deadline: float
    nodes: _Nodes
    procs: _Processes = field(default_factory=_Processes)
    sync_server: str | None = None
    queries: dict[str, Any] = field(default_factory=dict)
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    warm: dict[str, Any] = field(default_factory=dict)  # the warm-up: generator summaries, timings
    sync_pairs: dict[str, Any] = field(default_factory=dict)
    laps: Laps = field(default_factory=lambda: Laps(time.monotonic()))
    _sync: tuple[threading.Event, threading.Thread, dict[str, Any]] | None = None

    @property
    def layout(self) -> DemoLayout:
        return DemoLayout(self.out)

    @property
    def spools(self) -> dict[str, Path]:
        return self.layout.spools

    @property
    def records(self) -> Path:
        return self.layout.records

    @property
    def windows_dir(self) -> Path:
        return self.layout.windows_dir

    @property
    def sync_dir(self) -> Path:
        return self.layout.sync_dir

    def start_sync(self) -> None:
        """Sync agents: this process (Spark's driver and executors share this TSC) and one per sim node."""
        if not self.nodes.virtual:
            return
        from cp_sync.nodes.agent import Agent
        from cp_sync.nodes.coordinator import Coordinator

        self.status.update("starting sync agents")
        coord = Coordinator("127.0.0.1:0").start()
        self.stack.callback(coord.stop)
        self.sync_server = coord.address
        agent = Agent(coord.address)
        threading.Thread(target=agent.run, name="cp-demo-agent", daemon=True).start()
        self.stack.callback(agent.stop)
        for v in self.nodes.virtual:
            self.procs.start(
                cli_argv("sync", "agent", "--server", coord.address),
                {"CP_TSC_VIRTUAL": v.spec()},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def start_continuous_sync(self) -> None:
        """A sync phase every --sync-every seconds until ``end_continuous_sync``; waits for the first."""
        if self.sync_server is None:
            self.sync_phase("before")
            return
        from cp_sync.nodes.periodic import Schedule, run_periodic

        self.status.update("sync: the first phase")
        stop, result = threading.Event(), dict[str, Any]()

        def loop() -> None:
            try:
                result["load"] = run_periodic(
                    str(self.sync_server), self.sync_dir, Schedule(self.args.sync_every), stop=stop,
                    on_phase=lambda res, _load: self.sync_pairs.__setitem__(res["phase"], res["pairs"]),
                    rounds=self.args.rounds, expect=len(self.nodes.virtual) + 1, wait_s=30.0,
                )  # fmt: skip
            except (OSError, ValueError) as e:
                result["error"] = e

        thread = threading.Thread(target=loop, name="cp-demo-sync", daemon=True)
        thread.start()
        self.stack.callback(thread.join, 60.0)
        self.stack.callback(stop.set)
        self._sync = (stop, thread, result)
        _wait(lambda: bool(self.sync_pairs) or not thread.is_alive(), self.deadline, "the first sync phase")
        if "error" in result:
            raise CommandError(f"sync: {result['error']}")

    def end_continuous_sync(self) -> None:
        """Stop the periodic sync after one final phase; any failed phase or pair is an error."""
        if self._sync is None:
            self.sync_phase("after")
            return
        stop, thread, result = self._sync
        self.status.update("sync: the final phase")
        stop.set()
        thread.join(max(1.0, self.deadline - time.monotonic()))
        if thread.is_alive() or "error" in result:
            raise CommandError(f"sync: {result.get('error', 'the final phase did not end in time')}")
        load = result["load"]
        if load.failed_phases or load.failed_pairs:
            raise CommandError(f"sync: {load.failed_phases} phases and {load.failed_pairs} pairs failed")

    def sync_phase(self, phase: str) -> None:
        self.status.update(f"sync: {phase}")
        if self.sync_server is None:
            # One TSC domain: a phase with no pairs to probe, only the domain's frequency.
            import native_tsc
            from cp_sync.sync_table import write_sync

            write_sync(self.sync_dir, phase, [], {native_tsc.domain_id(): native_tsc.frequency_hz()})
            self.sync_pairs[phase] = []
            return
        from cp_sync.nodes.coordinator import run_phase

        expect = len(self.nodes.virtual) + 1
        r = run_phase(self.sync_server, phase, self.args.rounds, self.sync_dir, expect=expect, wait_s=30.0)
        if r["failures"]:
            raise CommandError(f"sync {phase}: {'; '.join(r['failures'])}")
        self.sync_pairs[phase] = r["pairs"]

    def source(self, spark: Any, name: str) -> Any:
        """The cloudprofiler source of query ``name``: embedded factory, or one on a simulated node."""
        spool = self.spools[name]
        reader = (
            spark.readStream.format("cloudprofiler")
            .option("spool", str(spool))
            .option("workers", str(self.args.workers))
        )
        if not self.nodes.virtual:
            return reader.option("endpoint", "tcp://127.0.0.1:0").load()
        endpoint = f"tcp://127.0.0.1:{_free_port()}"
        self.procs.start(
            cli_argv(
                "factory", "--endpoint", endpoint, "--spool", str(spool), "--workers", str(self.args.workers)
            ),
            self.nodes.env("factory"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return reader.option("factory", "external").option("endpoint", endpoint).load()

    def start_queries(self, spark: Any) -> None:
        from cloudprofiler.jobs.queries import campaigns_frame, start_latency_query, start_windows_query

        self.status.update("starting the queries and their factories")
        campaigns = campaigns_frame(spark)
        self.queries["latency"] = start_latency_query(
            self.source(spark, "latency"), campaigns, self.records, self.out / "checkpoint-latency"
        )
        self.queries["windows"] = start_windows_query(
            self.source(spark, "windows"), campaigns, self.windows_dir, self.out / "checkpoint"
        )
        for q in self.queries.values():
            self.stack.callback(_stop_query, q)

    def wait_factories(self) -> dict[str, str]:
        """Each query's factory endpoint, once it listens with every worker ready to parse."""
        from cloudprofiler import wait_for_factory

        self.status.update("waiting for the factories")
        endpoints = {}
        for name in QUERIES:
            left = max(1.0, self.deadline - time.monotonic())
            try:
                state = wait_for_factory(str(self.spools[name]), self.queries[name], left)
            except (RuntimeError, TimeoutError) as e:
                raise CommandError(f"the {name} query: {e}") from e
            endpoints[name] = state.factory_endpoint
        return endpoints

    def _generators(self, endpoints: dict[str, str], duration: float, tag: str) -> dict[str, dict[str, Any]]:
        """One generator per query for ``duration`` s at --rate, run to their end; their summaries."""
        a = self.args
        gens = {}
        for name, endpoint in endpoints.items():
            argv = cli_argv(
                "generate", "--endpoint", endpoint, "--rate", str(a.rate), "--duration", str(duration),
                "--bucket", str(a.bucket), "--summary", str(self.out / f"generator-{tag}{name}.json"),
                "--wait-ready", str(max(1.0, self.deadline - time.monotonic())),
                # Spark, two factories and two generators share local cores: a sender may queue 1 s of
                # buckets through a scheduling stall before a send counts as a drop
                "--queue-ms", str(QUEUE_MS),
            )  # fmt: skip
            gens[name] = self.procs.start(
                argv,
                self.nodes.env("generator"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        out = {}
        for name, gen in gens.items():
            _, err = gen.communicate(timeout=max(1.0, self.deadline - time.monotonic()))
            if gen.returncode != 0:
                last = err.strip().splitlines()[-1] if err.strip() else ""
                raise CommandError(f"the {name} generator failed: {last}")
            out[name] = json.loads((self.out / f"generator-{tag}{name}.json").read_text())
        return out

    def warm_up(self, started: float) -> dict[str, str]:
        """Factories ready, then a --warmup load through both queries until read: the steady state begins."""
        endpoints = self.wait_factories()
        self.warm["ready_s"] = time.monotonic() - started
        self.laps.lap("startup")
        a = self.args
        self.status.update(f"warm-up: {a.rate:,.0f} tuples/s for {a.warmup:g} s into each query")
        self.warm["summaries"] = self._generators(endpoints, a.warmup, "warmup-")
        self.warm["load_end_s"] = time.monotonic() - started
        # caught up: every warm-up tuple published, read and its micro-batch done, so the measured
        # run starts on idle queries with no backlog left
        self.wait_read(self.warm["summaries"], since=time.monotonic())
        self.warm["caught_up_s"] = time.monotonic() - started
        self.laps.lap("warmup")
        return endpoints

    def generate(self, endpoints: dict[str, str]) -> None:
        """The measured load: one generator per query at --rate for --duration."""
        a = self.args
        self.status.update(f"generating {a.rate:,.0f} tuples/s for {a.duration:g} s into each query")
        self.warm["measured_tsc"] = native_tsc.now()  # the warm-up band's end in every plot
        self.summaries = self._generators(endpoints, a.duration, "")
        self.laps.lap("measured")

    def wait_read(self, *runs: dict[str, dict[str, Any]], since: float) -> None:
        """Wait until the factories published every tuple of ``runs`` and both queries read it all
        (the load ended at ``since``, monotonic); past the deadline, the rate was not sustained."""
        from cloudprofiler.spark_local import source_end_offset
        from cp_sink.records import total_seen
        from cp_source.spool.segments import Spool

        wait = partial(_catch_up, deadline=self.deadline, since=since, rate=self.args.rate)
        for name, spool in self.spools.items():
            senders = {int(s["id"]) for run in runs for s in run[name]["senders"]}
            wait(partial(Spool(spool).drained, senders), f"the {name} factory has not published all")
        latest = Spool(self.spools["windows"]).latest()
        qw, ql = self.queries["windows"], self.queries["latency"]
        wait(lambda: source_end_offset(qw) == latest or not qw.isActive, "the windows query has not read all")
        published = Spool(self.spools["latency"]).stats().rows
        wait(
            lambda: not ql.isActive or (self.records.exists() and total_seen(self.records) >= published),
            "the latency query has not written all",
        )
        for name, q in self.queries.items():
            if q.exception() is not None:
                raise CommandError(f"the {name} query failed: {q.exception()}")

    def wait_caught_up(self) -> int:
        """Wait until both queries read the warm-up and the measured run, stop them; windows rows read."""
        self.status.update("waiting for the factories and the queries to catch up")
        self.wait_read(self.warm["summaries"], self.summaries, since=time.monotonic())
        qw = self.queries["windows"]
        rows_read = sum(int(p["numInputRows"]) for p in qw.recentProgress)
        for q in self.queries.values():
            q.stop()
        self.laps.lap("drain")
        return rows_read


def _session() -> Any:
    """The demo's local Spark."""
    from cloudprofiler.spark_local import local_session

    return local_session(
        "cloudprofiler-demo",
        conf={
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            # rows read are summed over every batch's progress: keep them all
            "spark.sql.streaming.numRecentProgressUpdates": "100000",
            # the JVM's heap: its micro-batches hold seconds of YSB rows at most. The rest of the JVM
            # (code, metaspace, threads, off-heap buffers) is not bounded by it: 0.8 to 1.5 GB resident
            # in default runs with 512 MB, 1.8 GB in one with the 1 GB default (benchmarks/demo_run.py)
            "spark.driver.memory": DRIVER_MEMORY,
        },
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    check_args(args)
    from cloudprofiler.spark_local import require_java

    require_java()  # before the output directory is made
    from cloudprofiler.jobs.calibrate import load_calibration
    from cloudprofiler.jobs.demo_out import clean_up, prepare_out
    from cloudprofiler.jobs.demo_report import collect
    from cp_common.console import cli_console
    from cp_common.self_cost import TreeCpu
    from cp_store.tables import output_file

    console = cli_console()
    summary = output_file("--summary", args.summary) if args.summary else None
    calibration = load_calibration(args.calibration) if args.calibration else None
    out, results = prepare_out(args)
    if not results.is_local:
        console.print(f"work files (spools, checkpoints, records) in {out}; results to {results.uri}")
    elif args.out is None:
        console.print(f"output directory (records, plots, report): {out}", soft_wrap=True)
    started = time.monotonic()
    with ExitStack() as stack, console.status("starting Spark (local[2])") as status:
        if not results.is_local:  # the local work directory goes, also when the run fails (run last)
            stack.callback(clean_up, out, results)
        demo = _Demo(
            args, out, stack, status, started + args.timeout, _Nodes(args.simulate_nodes), laps=Laps(started)
        )
        stack.callback(demo.procs.close)
        spark = _session()
        stack.callback(spark.stop)
        demo.start_sync()
        demo.start_continuous_sync()
        phases = phase_collector(spark, stack)
        queries_started = time.monotonic()
        demo.warm["start_tsc"] = native_tsc.now()  # time zero of every plot (this is the reference domain)
        run_cpu = TreeCpu().start()  # the run's CPU, beside the profiler's own (demo_cost)
        demo.start_queries(spark)
        endpoints = demo.warm_up(queries_started)
        demo.generate(endpoints)
        rows_read = demo.wait_caught_up()
        run_cpu_s = run_cpu.stop()
        phases.stop()
        demo.end_continuous_sync()
        demo.laps.lap("final_sync")
        status.update("translating and summing up")
        totals, lat, series, waterfall = collect(
            spark, demo.layout, demo.summaries, demo.nodes.virtual, demo.sync_pairs, rows_read, demo.warm
        )
        demo.laps.lap("translate")
    demo.laps.lap("shutdown")  # the queries, sync, child processes and Spark stopped
    translated = (lat, series, waterfall)
    return _finish(
        args,
        console,
        demo,
        totals,
        translated,
        phases,
        run_cpu_s,
        (summary, calibration),
        (out, results),
        started,
    )


def _finish(
    args: argparse.Namespace,
    console: Any,
    demo: _Demo,
    totals: dict[str, Any],
    translated: tuple[Any, Any, Any],
    phases: Any,
    run_cpu_s: float,
    checked: tuple[Any, Any],
    dirs: tuple[Path, Location],
    started: float,
) -> int:
    """After Spark stopped: the phases, the cost, the verdict, the report and the summary (its file and
    the calibration: ``checked``, both read before the run started; ``dirs``: the work directory and
    where the results go)."""
    out, results = dirs
    from cloudprofiler.jobs.demo_cost import calibration_summary, cost_lines, run_cost
    from cloudprofiler.jobs.demo_out import clean_up
    from cloudprofiler.jobs.demo_report import report
    from cloudprofiler.jobs.demo_verdict import judge

    summary, calibration = checked
    lat, series, waterfall = translated
    totals["phases_s"] = demo.laps.seconds
    totals["spark_phases"] = write_phase_table(phases, demo.queries, results)
    totals["profiler_cost"] = run_cost(demo.queries, run_cpu_s)
    totals["calibration"] = calibration_summary(calibration)
    judge(totals, args.latency_slope)
    totals["seconds"] = round(time.monotonic() - started, 1)
    totals["out"] = results.uri
    clean_up(out, results)
    for line in cost_lines(totals):
        console.print(line, soft_wrap=True)
    report(console, totals, lat, series, results, waterfall)  # its last line: where the HTML report is
    demo.laps.lap("report")  # the tables, plots, latency.parquet and report.html
    if summary is not None:  # last, so that it holds every phase
        totals["total_s"] = round(time.monotonic() - started, 1)
        summary.write_bytes(json.dumps(totals, indent=2, default=str).encode())
    return 0 if totals["consistent"] else 1
