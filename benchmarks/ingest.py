"""Ingest benchmark: generator offer rate, YSB deserialization per core, factory throughput.

Run: python benchmarks/ingest.py [--quick]

Side by side in one run:
* the generator (one sender process) offering 2 to 8 M tuples/s over TCP to a
  receiver that only drains: which rates it sustains (no drop, on schedule);
* YSB bucket deserialization per core (CPU time, so a busy shared host does
  not distort it): the naive path (per-row orjson into Python rows), generic
  orjson-to-Arrow, pyarrow's JSON reader, the numba parser, the C one (the same
  kernel, the workers' default), and the whole worker path with the numba parser
  (parse, stamp, build and write a segment);
* the factory with real ZeroMQ fed by the generator, with each worker parser
  (naive, generic orjson-to-Arrow, pyarrow JSON, numba) and with 2 numba
  workers, while a consumer commits what is published (as the stream reader
  does): tuples/s published to the spool (wall clock) and per worker
  CPU-second.

Writes benchmarks/results/ingest.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import add_show, committed_factory, make_table, proc_cpu_s, shown, write_json
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cp_source.factory.parse_json import parse_arrow_json, parse_naive_rows, parse_orjson
from cp_source.factory.parse_ysb import StringRowParser
from cp_source.factory.workers import FactoryWorker, WorkerConfig
from cp_source.generate.generator import run_generator
from cp_source.generate.payloads import build_payloads
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import answer_control
from cp_source.wire.workloads import ysb_fields

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
GOAL_GENERATOR = 5e6
GOAL_WORKER = 2e6


def _drain(q: Any, transport: str) -> None:
    """A receiver that takes every bucket and discards it, until end-of-stream."""
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)  # answers the senders' hello and end-of-stream, as a factory does
    s.setsockopt(zmq.RCVHWM, 64)
    if transport == "ipc":
        path = tempfile.mktemp(prefix="cp-drain-", dir="/tmp")
        s.bind(f"ipc://{path}")
    else:
        s.bind("tcp://127.0.0.1:*")
    q.put(s.getsockopt_string(zmq.LAST_ENDPOINT))
    tuples = 0
    while True:
        frames = s.recv_multipart(copy=False)
        h = bk.parse_header(frames[1].buffer)
        if h.kind in (bk.KIND_HELLO, bk.KIND_EOS):
            answer_control(s, frames[0].bytes, h)
        if h.kind == bk.KIND_EOS:
            break
        tuples += h.count
    q.put(tuples)
    s.close(0)
    ctx.term()


def bench_generator(rate: float, duration: float, bucket: int, transport: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_drain, args=(q, transport))
    p.start()
    endpoint = q.get(timeout=60)
    cpu0 = time.process_time()
    s = run_generator(endpoint, GeneratorSettings(rate=rate, duration=duration, bucket=bucket, sender_base=1))
    cpu = time.process_time() - cpu0
    received = q.get(timeout=60)
    p.join(30)
    return {
        "transport": transport,
        "bucket": bucket,
        "target_rate": rate,
        "elapsed_s": s["elapsed_s"],
        "generator_bound": s["generator_bound"],
        "max_lag_ms": s["max_lag_ms"],
        "emitted": s["emitted"],
        "dropped": s["dropped"],
        "received": received,
        "emitted_per_s": s["emitted"] / s["elapsed_s"],
        "offered_per_s": s["achieved_rate"],
        "emitted_per_cpu_s": s["emitted"] / cpu if cpu else 0.0,
    }


def _cpu_rate(fn: Any, payloads: list[bytes], bucket: int, seconds: float) -> float:
    """Tuples per CPU-second of ``fn(payload)``, over at least ``seconds`` of CPU time."""
    fn(payloads[0])
    n = 0
    t0 = time.process_time()
    while True:
        for p in payloads:
            fn(p)
        n += len(payloads)
        dt = time.process_time() - t0
        if dt >= seconds:
            return n * bucket / dt


def bench_parsers(bucket: int, seconds: float) -> dict[str, float]:
    fields = ysb_fields()
    pays = build_payloads("ysb", bucket)
    numba, c_kernel = StringRowParser(fields, "numba"), StringRowParser(fields, "c")
    paths = {
        "naive: per-row orjson into Python rows": lambda p: parse_naive_rows(p, fields, bucket),
        "generic: orjson to Arrow": lambda p: parse_orjson(p, fields, bucket),
        "pyarrow.json reader": lambda p: parse_arrow_json(p, fields, bucket),
        "numba YSB parser": lambda p: numba.fast(p, bucket),
        "C YSB parser (the workers' default)": lambda p: c_kernel.fast(p, bucket),
    }
    out = {name: _cpu_rate(fn, pays, bucket, seconds) for name, fn in paths.items()}
    # the whole worker path: validate, parse, stamp, build the segment and publish it
    with tempfile.TemporaryDirectory() as d:
        w = FactoryWorker(WorkerConfig(backend="tcp://127.0.0.1:1", spool=d, worker="w0", parser="numba"))
        pk = bk.HeaderPacker(1, "bench@0")
        state = {"seq": 0}

        def worker_path(p: bytes) -> None:
            seq = state["seq"]
            first = bk.tuple_id(1, seq * bucket)
            hdr = bytes(pk.pack(bk.KIND_DATA, seq, first, bucket, len(p), 1, time.time_ns()))
            state["seq"] = seq + 1
            w.handle([memoryview(hdr), memoryview(p)])
            if w.pending_rows >= 50_000:
                w.flush()
                Spool(d).commit(Spool(d).latest())  # keep the disk footprint small

        out["factory worker path (numba, stamp, segment write)"] = _cpu_rate(
            worker_path, pays, bucket, seconds
        )
        w.close()
    return out


def bench_factory(
    workers: int, rate: float, duration: float, bucket: int, parser: str = "auto"
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d, committed_factory(d, workers=workers, parser=parser) as f:
        cpu0 = proc_cpu_s(f.worker_pids())
        s = run_generator(
            f.endpoint, GeneratorSettings(rate=rate, duration=duration, bucket=bucket, sender_base=2)
        )
        f.wait_drained(60)
        cpu = proc_cpu_s(f.worker_pids()) - cpu0
        st = Spool(d).stats()
    rows = st.rows
    return {
        "workers": workers,
        "parser": parser,
        "offered": s["offered"],
        "emitted": s["emitted"],
        "dropped": s["dropped"],
        "published": rows,
        "lost_in_transit": st.lost_in_transit_total,
        "elapsed_s": s["elapsed_s"],
        "published_per_s": rows / s["elapsed_s"],
        "per_worker_cpu_s": rows / cpu if cpu else 0.0,
        "worker_cpu_s": cpu,
    }


def highest_rate(gen: list[dict[str, Any]], ok: str) -> float:
    """Per bucket size the highest rate before the first failing one; the best bucket size.

    ``ok`` is "sustained" (no drop and on schedule) or "schedule" (on schedule only).
    """
    out = 0.0
    for b in sorted({g["bucket"] for g in gen}):
        for g in sorted((g for g in gen if g["bucket"] == b), key=lambda g: g["target_rate"]):
            if not (g["sustained"] if ok == "sustained" else not g["generator_bound"]):
                break
            out = max(out, g["target_rate"])
    return out


def generator_sweep(console: Console, secs: float) -> list[dict[str, Any]]:
    """Offer each rate for ``secs`` per bucket size; print which rates were sustained."""
    # a rate is sustained when every tuple was taken (no drop) and the generator kept its
    # schedule (not generator-bound)
    gen = [bench_generator(r, secs, b, "tcp") for b in (1000, 5000) for r in (2e6, 4e6, 5e6, 6e6, 8e6)]
    for g in gen:
        g["sustained"] = g["dropped"] == 0 and not g["generator_bound"]
    report_generator(console, gen)
    return gen


def report_generator(console: Console, gen: list[dict[str, Any]]) -> None:
    columns = (
        "bucket",
        "target tuples/s",
        "achieved (offered)",
        "emitted/s",
        "dropped",
        "generator-bound",
        "sustained",
    )
    cells = [
        (
            str(g["bucket"]),
            f"{g['target_rate'] / 1e6:.1f} M",
            f"{g['offered_per_s'] / 1e6:.2f} M",
            f"{g['emitted_per_s'] / 1e6:.2f} M",
            f"{g['dropped']:,}",
            str(g["generator_bound"]),
            "yes" if g["sustained"] else "no",
        )
        for g in gen
    ]
    title = "Generator, one sender process, TCP to a draining receiver"
    console.print(make_table(title, columns, cells, left=()))


def report_generator_max(console: Console, on_schedule: float, best: float) -> None:
    console.print(
        f"highest rate one sender offered on schedule (within 1%, not generator-bound): "
        f"{on_schedule / 1e6:.1f} M tuples/s (goal 5 M: "
        f"{'met' if on_schedule >= GOAL_GENERATOR else 'not met'})"
    )
    console.print(f"highest rate also taken without a single drop: {best / 1e6:.1f} M tuples/s")


def report_parsers(console: Console, parsers: dict[str, float]) -> None:
    base = parsers["generic: orjson to Arrow"]
    cells = [
        (name, f"{v / 1e6:.2f} M", f"{v / base:.2f}", "met" if v >= GOAL_WORKER else "-")
        for name, v in parsers.items()
    ]
    title = "YSB deserialization per core (tuples per CPU-second, buckets of 1000)"
    console.print(make_table(title, ("path", "tuples/s", "x generic", "goal 2 M"), cells, left=()))


def factory_runs(console: Console, secs: float) -> list[dict[str, Any]]:
    """The real factory with each worker parser, the numba one also with 2 workers; print the table."""
    runs = [(1, "naive"), (1, "orjson"), (1, "arrow-json"), (1, "numba"), (2, "numba")]
    fac = [bench_factory(w, 4e6, max(secs, 1.0) * 1.5, 2000, parser=p) for w, p in runs]
    report_factory(console, fac)
    return fac


def report_factory(console: Console, fac: list[dict[str, Any]]) -> None:
    columns = (
        "worker parser",
        "workers",
        "published tuples/s",
        "per worker CPU-s",
        "offered",
        "dropped",
        "lost in transit",
    )
    cells = [
        (
            r["parser"],
            str(r["workers"]),
            f"{r['published_per_s'] / 1e6:.2f} M",
            f"{r['per_worker_cpu_s'] / 1e6:.2f} M",
            f"{r['offered']:,}",
            f"{r['dropped']:,}",
            str(r["lost_in_transit"]),
        )
        for r in fac
    ]
    title = "Factory with real ZeroMQ (generator offers 4 M/s, YSB, buckets of 2000)"
    console.print(make_table(title, columns, cells, left=()))


def report_gains(console: Console, parsers: dict[str, float], fac: list[dict[str, Any]], cpus: int) -> None:
    """Print the parser and worker-count ratios the design's claims rest on."""
    base = parsers["generic: orjson to Arrow"]
    numba_gain = parsers["numba YSB parser"] / base
    console.print(
        f"numba parser / generic orjson-to-Arrow: {numba_gain:.2f}x; "
        f"naive / generic: {parsers['naive: per-row orjson into Python rows'] / base:.2f}x"
    )
    one, two, generic = fac[3], fac[4], fac[1]
    console.print(
        f"factory, numba / generic orjson-to-Arrow worker (per worker CPU-s): "
        f"{one['per_worker_cpu_s'] / generic['per_worker_cpu_s']:.2f}x; "
        f"2 workers / 1 worker (published tuples/s): "
        f"{two['published_per_s'] / one['published_per_s']:.2f}x on {cpus} cores "
        f"shared with the generator"
    )


def host_report(console: Console, results: dict[str, Any]) -> None:
    console.print(
        f"host: {results['host_cpus']} CPUs, load average {results['load_avg'][0]:.1f} at start, "
        f"{results['load_avg_end'][0]:.1f} at end (figures are depressed accordingly)"
    )


def show(results: dict[str, Any]) -> None:
    """The report of a result file, as the run printed it."""
    console = Console(width=110)
    report_generator(console, results["generator"])
    report_generator_max(console, results["generator_max_on_schedule"], results["generator_max_sustained"])
    report_parsers(console, results["deserialize_per_core"])
    report_factory(console, results["factory"])
    report_gains(console, results["deserialize_per_core"], results["factory"], results["host_cpus"])
    host_report(console, results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    add_show(ap)
    a = ap.parse_args(argv)
    if shown(a.show, show):
        return 0
    secs = 0.5 if a.quick else 2.0
    console = Console(width=110)
    results: dict[str, Any] = {"host_cpus": os.cpu_count(), "load_avg": os.getloadavg()}

    gen = results["generator"] = generator_sweep(console, secs)
    on_schedule = results["generator_max_on_schedule"] = highest_rate(gen, "schedule")
    best = results["generator_max_sustained"] = highest_rate(gen, "sustained")
    report_generator_max(console, on_schedule, best)

    parsers = results["deserialize_per_core"] = bench_parsers(1000, secs)
    report_parsers(console, parsers)
    fac = results["factory"] = factory_runs(console, secs)
    report_gains(console, parsers, fac, os.cpu_count() or 1)

    results["load_avg_end"] = os.getloadavg()
    host_report(console, results)
    write_json(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
