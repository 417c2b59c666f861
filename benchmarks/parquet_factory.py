"""The factory's rate per core for ``parquet:`` (Arrow IPC payloads) against ``file:`` (NDJSON) on the
same rows.

Run: python benchmarks/parquet_factory.py [--quick] [--rows 64000] [--bucket 1000]

One table of rows (two strings, a BIGINT, a DOUBLE, a BOOLEAN, a TIMESTAMP) is written twice, as
NDJSON and as Parquet, and measured side by side in one run:

* payload per core: what a worker does to one bucket's payload (pyarrow's JSON reader for
  ``file:``, the IPC checks for ``parquet:``), in tuples per CPU-second of this process;
* worker path per core: the whole worker (header checks, payload, stamps, segment built and
  published), in tuples per CPU-second of this process;
* factory over ZeroMQ: a real factory (1 worker) fed by the generator faster than it can take,
  tuples published per CPU-second of the worker process.

CPU time, not wall time, so that other load on a shared host depresses the figures less; the load
average is printed. Both payloads of the same bucket are checked to decode to the same table.
Writes benchmarks/results/parquet_factory.json.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from bench_common import (
    add_show,
    arg_parser,
    committed_factory,
    finish,
    make_table,
    print_load,
    proc_cpu_s,
    run_head,
    shown,
)
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cp_source.factory.workers import FactoryWorker, WorkerConfig, make_accumulator
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from cp_source.wire.ipc_payload import parquet_payloads
from cp_source.wire.workloads import resolve

DDL = "user STRING, region STRING, n BIGINT, price DOUBLE, ok BOOLEAN, ts TIMESTAMP"
T0 = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)


def write_rows(d: Path, n: int) -> tuple[str, str]:
    """The same ``n`` rows as NDJSON and as Parquet; their ``file:`` and ``parquet:`` workloads."""
    rng = np.random.default_rng(28)
    ts = [T0 + dt.timedelta(microseconds=int(u)) for u in rng.integers(0, 86_400_000_000, n)]
    t = pa.table(
        {
            "user": pa.array([f"user-{u:08x}" for u in rng.integers(0, 1 << 32, n)]),
            "region": pa.array([f"region-{r}" for r in rng.integers(0, 8, n)]),
            "n": pa.array(rng.integers(-(1 << 40), 1 << 40, n)),
            "price": pa.array(np.round(rng.random(n) * 1000, 2)),
            "ok": pa.array(rng.random(n) < 0.5),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(t, d / "rows.parquet")
    with open(d / "rows.ndjson", "wb") as f:
        for row in t.to_pylist():
            f.write(orjson.dumps({**row, "ts": row["ts"].isoformat()}) + b"\n")
    return f"file:{d}/rows.ndjson", f"parquet:{d}/rows.parquet"


def ndjson_payloads(path: str, bucket: int, pool: int) -> list[bytes]:
    """Buckets of the file's first ``bucket * pool`` lines, as the generator sends them."""
    lines = Path(path).read_bytes().splitlines(keepends=True)[: bucket * pool]
    return [b"".join(lines[k * bucket : (k + 1) * bucket]) for k in range(pool)]


def _per_cpu_s(fn: Callable[[bytes], None], payloads: list[bytes], bucket: int, seconds: float) -> float:
    """Tuples per CPU-second of ``fn(payload)`` over at least ``seconds`` of this process's CPU."""
    fn(payloads[0])
    n, t0 = 0, time.process_time()
    while True:
        for p in payloads:
            fn(p)
        n += len(payloads)
        if (dt_s := time.process_time() - t0) >= seconds:
            return n * bucket / dt_s


def payload_rate(workload: str, payloads: list[bytes], bucket: int, seconds: float) -> float:
    acc = make_accumulator(resolve(workload, DDL if workload.startswith("file:") else None))
    state = {"rows": 0}

    def one(p: bytes) -> None:
        acc.add(p, bucket)
        state["rows"] += bucket
        if state["rows"] >= 50_000:
            acc.take()
            state["rows"] = 0

    return _per_cpu_s(one, payloads, bucket, seconds)


def worker_rate(workload: str, payloads: list[bytes], bucket: int, seconds: float) -> float:
    """The whole worker path: header checks, payload, stamps, a segment published every 50,000 rows."""
    schema = DDL if workload.startswith("file:") else None
    with tempfile.TemporaryDirectory() as d:
        w = FactoryWorker(WorkerConfig("tcp://127.0.0.1:1", d, "w0", workload=workload, schema=schema))
        pk = bk.HeaderPacker(1, "bench@0")
        state = {"seq": 0}

        def one(p: bytes) -> None:
            seq = state["seq"]
            hdr = bytes(
                pk.pack(bk.KIND_DATA, seq, bk.tuple_id(1, seq * bucket), bucket, len(p), 1, time.time_ns())
            )
            state["seq"] = seq + 1
            w.handle([memoryview(hdr), memoryview(p)])
            if w.pending_rows >= 50_000:
                w.flush()
                Spool(d).commit(Spool(d).latest())  # keep the disk footprint small

        try:
            return _per_cpu_s(one, payloads, bucket, seconds)
        finally:
            w.close()


def factory_rate(workload: str, rate: float, duration: float, bucket: int) -> dict[str, Any]:
    """A real factory (1 worker) fed by the generator over ZeroMQ; rows published per worker CPU-second."""
    schema = DDL if workload.startswith("file:") else None
    with (
        tempfile.TemporaryDirectory() as d,
        committed_factory(d, workers=1, workload=workload, schema=schema) as f,
    ):
        cpu0 = proc_cpu_s(f.worker_pids())
        s = run_generator(
            f.endpoint, GeneratorSettings(rate=rate, duration=duration, bucket=bucket, workload=workload)
        )
        f.wait_drained(120)
        cpu = proc_cpu_s(f.worker_pids()) - cpu0
        st = Spool(d).stats()
    return {
        "offered": s["offered"],
        "dropped": s["dropped"],
        "published": st.rows,
        "deadletters": st.deadletters_total,
        "worker_cpu_s": cpu,
        "per_worker_cpu_s": st.rows / cpu if cpu else 0.0,
    }


def check_same_rows(file_wl: str, parquet_wl: str, nd: list[bytes], ipc: list[bytes], bucket: int) -> None:
    """Both payloads of the first bucket give the same table (else the comparison means nothing)."""
    a = make_accumulator(resolve(file_wl, DDL))
    b = make_accumulator(resolve(parquet_wl))
    a.add(nd[0], bucket)
    b.add(ipc[0], bucket)
    if not a.take().equals(b.take()):
        raise SystemExit("the NDJSON and the Parquet payloads of one bucket differ: fix the benchmark")


def run(a: Any) -> dict[str, Any]:
    secs = 0.5 if a.quick else 2.0
    doc = run_head("parquet_factory", rows=a.rows, bucket=a.bucket, seconds=secs)
    with tempfile.TemporaryDirectory() as d:
        file_wl, parquet_wl = write_rows(Path(d), a.rows)
        pool = max(1, a.rows // a.bucket)
        nd = ndjson_payloads(file_wl[5:], a.bucket, pool)
        ipc = parquet_payloads(parquet_wl, a.bucket, pool)
        check_same_rows(file_wl, parquet_wl, nd, ipc, a.bucket)
        doc["payload_bytes_per_row"] = {"file": len(nd[0]) / a.bucket, "parquet": len(ipc[0]) / a.bucket}
        doc["payload_per_cpu_s"] = {
            "file": payload_rate(file_wl, nd, a.bucket, secs),
            "parquet": payload_rate(parquet_wl, ipc, a.bucket, secs),
        }
        doc["worker_per_cpu_s"] = {
            "file": worker_rate(file_wl, nd, a.bucket, secs),
            "parquet": worker_rate(parquet_wl, ipc, a.bucket, secs),
        }
        if not a.no_factory:
            duration = 1.5 if a.quick else 4.0
            doc["factory"] = {
                "rate_offered": a.rate,
                "file": factory_rate(file_wl, a.rate, duration, a.bucket),
                "parquet": factory_rate(parquet_wl, a.rate, duration, a.bucket),
            }
    return doc


def report(doc: dict[str, Any]) -> None:
    rows = [
        ("payload: parse (file) / check (parquet)", doc["payload_per_cpu_s"]),
        ("worker path: header, payload, stamps, segment", doc["worker_per_cpu_s"]),
    ]
    if "factory" in doc:
        fac = doc["factory"]
        rows.append(
            (
                f"factory over ZeroMQ, 1 worker, offered {fac['rate_offered'] / 1e6:.0f} M/s",
                {k: fac[k]["per_worker_cpu_s"] for k in ("file", "parquet")},
            )
        )
    cells = [
        (name, f"{v['file'] / 1e6:.2f} M", f"{v['parquet'] / 1e6:.2f} M", f"{v['parquet'] / v['file']:.1f}x")
        for name, v in rows
    ]
    title = f"Tuples per CPU-second, the same {doc['rows']:,} rows, buckets of {doc['bucket']}"
    Console(width=120).print(
        make_table(title, ("", "file: (NDJSON)", "parquet: (Arrow IPC)", "ratio"), cells)
    )
    size = doc["payload_bytes_per_row"]
    print(f"payload bytes per row: file {size['file']:.0f}, parquet {size['parquet']:.0f}")
    for k, r in doc.get("factory", {}).items():
        if k != "rate_offered":
            print(
                f"factory {k}: offered {r['offered']:,}, dropped {r['dropped']:,}, "
                f"published {r['published']:,}, dead letters {r['deadletters']}, "
                f"worker CPU {r['worker_cpu_s']:.2f} s"
            )
    print_load(doc)


def main(argv: list[str] | None = None) -> int:
    ap = arg_parser(__doc__, "parquet_factory")
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--rows", type=int, default=64_000, help="rows in the file (default 64000)")
    ap.add_argument("--bucket", type=int, default=1000, help="tuples per bucket (default 1000)")
    ap.add_argument(
        "--rate", type=float, default=3e6, help="generator offer in the factory run (default 3e6)"
    )
    ap.add_argument("--no-factory", action="store_true", help="skip the run over ZeroMQ")
    add_show(ap)
    a = ap.parse_args(argv)
    if shown(a.show, report):
        return 0
    started = time.monotonic()
    return finish(run(a), started, a.json, report)


if __name__ == "__main__":
    sys.exit(main())
