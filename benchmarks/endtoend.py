"""End to end through Spark local[2]: the maximum sustainable rate of five ingestion paths, one run.

Same machine, same SparkSession, same tuples (YSB ad events), same downstream
(the YSB join with the campaigns table into the cloudprofiler sink with the
null handler, which only counts), same search (bisection over constant-rate
trials, ``cloudprofiler.jobs.maxrate.find_max_rate``):

1. the cloudprofiler source: generator -> factory (Arrow) -> spool -> stream reader; twice more
   with every executor fetching its segments from the segment server (``fetch=network``), once
   with CurveZMQ keys off and once on (``curveKeys`` on the reader, ``--curve-keys`` on the
   generator): the cost of encryption on every ZeroMQ link, printed as the on/off ratio;
2. the naive Python DataSource ``cp_naive_zmq``: the same generator, JSON parsed row by row in ``read``;
3. Spark's ``socket`` source + ``from_json``: NDJSON lines offered over a local TCP connection;
4. Spark's JSON file source: NDJSON files dropped into a directory at the offered rate;
5. Spark's ``rate-micro-batch`` source into the same sink: rows per second processed with no payload
   and nothing to parse (the ceiling, for context; it never drops, so no search).

Offers of (3) and (4) follow the generator's rules: a fixed schedule per bucket, a send the
receiver cannot take is a counted drop (socket), and an offer that falls behind its schedule
is generator-bound. Writes benchmarks/results/endtoend.json.

    python benchmarks/endtoend.py [--duration 5] [--only cloudprofiler,naive]
    python benchmarks/endtoend.py --only keys     # the two fetch=network rows, keys off and on
    python benchmarks/endtoend.py --only projection   # the source with and without columns=
    python benchmarks/endtoend.py --show benchmarks/results/endtoend.json   # re-print a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from bench_common import make_table
from proc_cpu import CpuByRole

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from cloudprofiler.children import cli_argv  # noqa: E402
from cloudprofiler.errors import TrialError  # noqa: E402
from cloudprofiler.jobs.maxrate import find_max_rate  # noqa: E402
from cloudprofiler.jobs.queries import (  # noqa: E402
    Target,
    generator_offer,
    sender_blocks,
    start_source_query,
    ysb_stateless,
)
from cp_source.wire.bucket import tuple_id  # noqa: E402
from cp_source.wire.workloads import YSB_FIELDS, ysb_rows  # noqa: E402

BUCKET = 1000
OLD_BEST = 400_000  # the cloudprofiler source's maximum before issue 13 (docs/benchmarks.md)
KEYS_OFF, KEYS_ON = "cloudprofiler, fetch network, keys off", "cloudprofiler, fetch network, keys on"
# The same query with the source reading only the columns it uses (the reader's columns= option).
PROJECTED = "cloudprofiler source, columns="
# Systems compared in pairs, searched in turn (--keys-rounds).
PAIRED = (KEYS_OFF, KEYS_ON, "cloudprofiler source", PROJECTED)
# The systems searched, each with the rate its search starts from (tuples/s).
SYSTEMS = [
    ("cloudprofiler source", 40_000),
    (PROJECTED, 40_000),
    ("cloudprofiler, fetch network, keys off", 40_000),
    ("cloudprofiler, fetch network, keys on", 40_000),
    ("naive Python source", 5_000),
    ("Spark socket + from_json", 10_000),
    ("Spark JSON files", 10_000),
]
JSON_SCHEMA = ", ".join(f"{f} STRING" for f in YSB_FIELDS) + ", tuple_id BIGINT, event_ms BIGINT"


def _prefixes(n: int = 4096) -> list[bytes]:
    """Serialized YSB rows without their closing brace: a line is prefix + ids + '}'."""
    return [orjson.dumps(r)[:-1] for r in ysb_rows(n, seed=7)]


class LineOffer:
    """Offers NDJSON lines with tuple ids at an exact rate through ``emit(bucket_bytes) -> bool``."""

    def __init__(self, emit: Any) -> None:
        self.emit = emit
        self.prefixes = _prefixes()

    def __call__(self, rate: float, duration: float) -> dict[str, Any]:
        sender = random.SystemRandom().randrange(1, 1 << 23)
        base = tuple_id(sender, 0)
        total = round(rate * duration)
        per = BUCKET / rate
        emitted = dropped = 0
        dropped_ranges: list[list[int]] = []  # [first id, count] of each bucket the receiver refused
        max_lag = 0.0
        pre = self.prefixes
        t0 = time.perf_counter()
        k = 0
        n = 0
        while n < total:
            due = t0 + k * per
            now = time.perf_counter()
            if due > now:
                time.sleep(max(0.0, due - now - 0.0002))
                while time.perf_counter() < due:
                    pass
            else:
                max_lag = max(max_lag, now - due)
            cnt = min(BUCKET, total - n)
            ms = int(time.time() * 1000)
            lines = b"".join(
                b'%s,"tuple_id":%d,"event_ms":%d}\n' % (pre[(n + i) % len(pre)], base + n + i, ms)
                for i in range(cnt)
            )
            if self.emit(lines):
                emitted += cnt
            else:
                dropped += cnt
                dropped_ranges.append([base + n, cnt])
            n += cnt
            k += 1
        elapsed = max(time.perf_counter() - t0, duration)
        achieved = total / elapsed
        bound = achieved < 0.99 * rate or max_lag > 0.1 * duration
        return {
            "emitted": emitted,
            "dropped": dropped,
            "achieved_rate": achieved,
            "generator_bound": bound,
            "max_lag_ms": max_lag * 1e3,
            # the generator's summary shape: the trial accounts ids per sender from these
            "senders": [
                {
                    "id": sender,
                    "first_tuple_id": base,
                    "next_tuple_id": base + total,
                    "dropped_ranges": dropped_ranges,
                }
            ],
        }


class SocketServer:
    """A TCP server Spark's socket source connects to; a send the kernel cannot take is a drop."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        self.conn, _ = self.listener.accept()
        self.conn.setblocking(False)

    def emit(self, data: bytes) -> bool:
        if self.conn is None:
            raise RuntimeError("Spark's socket source has not connected")
        try:
            sent = self.conn.send(data)
        except BlockingIOError:
            return False  # the receiver's buffer is full: the bucket is dropped, as with ZeroMQ
        view = memoryview(data)[sent:]
        while view:  # never split a line: finish a bucket that has started
            try:
                sent = self.conn.send(view)
                view = view[sent:]
            except BlockingIOError:
                time.sleep(0.0002)
        return True

    def close(self) -> None:
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()


class FileDropper:
    """Writes each bucket as an NDJSON file into ``dest`` (written beside it, then renamed in)."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.tmp = dest.parent / (dest.name + "-tmp")
        dest.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def emit(self, data: bytes) -> bool:
        self.n += 1
        name = f"part-{self.n:09d}.json"
        (self.tmp / name).write_bytes(data)
        os.rename(self.tmp / name, self.dest / name)
        return True


def _from_json(df: Any) -> Any:
    from pyspark.sql import functions as F

    parsed = df.select(F.from_json("value", JSON_SCHEMA).alias("j")).select("j.*")
    return parsed.withColumn("event_time", F.timestamp_millis("event_ms")).drop("event_ms")


def _start(df: Any, work: Path) -> tuple[str, Any]:
    sink = work / "records"
    q = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(sink))
        .option("handler", "null")
        .option("checkpointLocation", str(work / "ck"))
        .start()
    )
    return str(sink), q


def _alive(q: Any) -> Any:
    return lambda: None if q.isActive else f"{q.exception() or 'stopped'}"


def keyed_offer(endpoint: str, keys: str) -> Any:
    """``generator_offer`` with ``--curve-keys``: the generator process connects with the client key."""
    take_base = sender_blocks(1)

    def offer(rate: float, duration: float) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="cp-endtoend-gen-") as tmp:
            summary = Path(tmp) / "gen.json"
            cmd = cli_argv(
                "generate",
                *("--endpoint", endpoint, "--rate", repr(float(rate)), "--duration", repr(float(duration))),
                *("--bucket", str(BUCKET), "--summary", str(summary), "--sender-base", str(take_base())),
                *("--curve-keys", keys),
            )
            done = subprocess.run(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600
            )
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
                raise TrialError(f"generator failed: {tail[0]}")
            return dict(json.loads(summary.read_text()))

    return offer


def start_network_source(spark: Any, work: Path, keys: str | None) -> tuple[Target, Any]:
    """``start_source_query``'s pipeline with every segment fetched from the segment server, keys optional.

    The same options as ``start_source_query`` (embedded factory, 2 workers, 256 MiB spool, the
    YSB join, the null handler) plus ``fetch=network`` and, with ``keys``, ``curveKeys``: the
    factory's front end, the segment server and every executor fetch then speak CurveZMQ.
    """
    import cloudprofiler
    from cloudprofiler.jobs.queries import YSB_ROW_BYTES

    spool_bytes = 256 << 20
    cloudprofiler.register(spark)
    reader = (
        spark.readStream.format("cloudprofiler")
        .option("endpoint", "tcp://127.0.0.1:0")
        .option("spool", str(work / "spool"))
        .option("workers", "2")
        .option("maxSpoolBytes", str(spool_bytes))
        .option("maxRecordsPerTrigger", str(spool_bytes // (3 * YSB_ROW_BYTES)))
        .option("fetch", "network")
    )
    if keys:
        reader = reader.option("curveKeys", keys)
    sink, q = _start(ysb_stateless(reader.load()), work)
    try:
        endpoint = cloudprofiler.wait_for_factory(str(work / "spool"), q, 120).factory_endpoint
    except (RuntimeError, TimeoutError) as e:
        q.stop()
        raise TrialError(str(e)) from e
    offer = keyed_offer(endpoint, keys) if keys else generator_offer(endpoint, bucket=BUCKET)
    label = KEYS_ON if keys else KEYS_OFF
    return Target(sink, offer, spool=str(work / "spool"), alive=_alive(q), label=label), q


def make_keys(work: Path) -> str:
    """A fresh keys directory, as ``cloudprofiler keys generate --out DIR`` makes it."""
    from cp_common import curve_keys

    out = work / "keys"
    curve_keys.generate(out)
    return str(out)


def with_rounds(systems: list[tuple[str, int]], rounds: int) -> list[tuple[str, int]]:
    """``systems`` with the keys off/on pair and the projection pair (whichever are selected)
    searched ``rounds`` times in turn (off, on, off, on...).

    Other load on a shared machine moves a search's result by more than encryption costs; pairs
    searched in turn, best of each side, compare the two under the most similar conditions.
    """
    pair = [s for s in systems if s[0] in PAIRED]
    rest = [s for s in systems if s not in pair]
    more = [(f"{n} #{r + 1}", start) for r in range(1, rounds) for n, start in pair]
    return rest + pair + more


def ysb_columns() -> list[str]:
    """What the YSB query (``ysb_stateless``) and the sink read of the source: its join key, the
    columns it keeps and every stamp column."""
    from cp_common.stamp_columns import is_stamp_column
    from cp_source.reader.options import ReaderOptions, full_schema

    stamps = [n for n in full_schema(ReaderOptions.parse({})).fieldNames() if is_stamp_column(n)]
    return ["ad_id", "event_type", "event_time", "tuple_id", *stamps]


def build(name: str, spark: Any, work: Path) -> tuple[Target, Any, Any]:
    """Start system ``name``'s query; return its target, the query and a cleanup function."""
    work.mkdir(parents=True)
    name = name.split(" #")[0]  # a later round of the keys pair
    if name in ("cloudprofiler source", PROJECTED):
        extra = {"columns": ",".join(ysb_columns())} if name == PROJECTED else None
        for k in range(10):  # Spark's runner of a Python source must connect back within 10 s
            try:
                target, q = start_source_query(
                    spark, work / f"try{k}", max_spool_bytes=256 << 20, handler="null", source_options=extra
                )
                return target, q, lambda: None
            except TrialError as e:
                if "connect back" not in str(e) or k == 9:
                    raise
                time.sleep(5)
    if name in (KEYS_OFF, KEYS_ON):
        target, q = start_network_source(spark, work, make_keys(work) if name == KEYS_ON else None)
        return target, q, lambda: None
    if name == "naive Python source":
        from cp_source.reader.naive_source import NaiveZmqDataSource

        spark.dataSource.register(NaiveZmqDataSource)
        state = work / "naive.json"
        df = spark.readStream.format("cp_naive_zmq").option("stateFile", str(state)).load()
        sink, q = _start(ysb_stateless(df), work)
        deadline = time.monotonic() + 120
        # The reader answers a generator's hello only in latestOffset, once per micro-batch: its
        # first (empty) batch waits for Spark's Python workers, which on a loaded machine outlasts
        # the generator's 10 s wait for an answer. Offer only once that batch is done.
        while not state.exists() or q.lastProgress is None:
            if time.monotonic() > deadline or not q.isActive:
                raise RuntimeError(f"naive source did not start: {q.exception()}")
            time.sleep(0.1)
        endpoint = json.loads(state.read_text())["endpoint"]
        return (
            Target(sink, generator_offer(endpoint, bucket=BUCKET), alive=_alive(q), label=name),
            q,
            lambda: None,
        )
    if name == "Spark socket + from_json":
        server = SocketServer()
        df = spark.readStream.format("socket").option("host", "127.0.0.1").option("port", server.port).load()
        sink, q = _start(ysb_stateless(_from_json(df)), work)
        deadline = time.monotonic() + 120
        while server.conn is None:
            if time.monotonic() > deadline or not q.isActive:
                raise RuntimeError(f"socket source did not connect: {q.exception()}")
            time.sleep(0.1)
        return Target(sink, LineOffer(server.emit), alive=_alive(q), label=name), q, server.close
    if name == "Spark JSON files":
        from pyspark.sql import functions as F

        dropper = FileDropper(work / "in")
        df = spark.readStream.schema(JSON_SCHEMA).json(str(work / "in"))
        df = df.withColumn("event_time", F.timestamp_millis("event_ms")).drop("event_ms")
        sink, q = _start(ysb_stateless(df), work)
        return Target(sink, LineOffer(dropper.emit), alive=_alive(q), label=name), q, lambda: None
    raise ValueError(name)


def rate_ceiling(spark: Any, work: Path, seconds: float) -> dict[str, Any]:
    """Rows/s Spark's rate-micro-batch source pushes into the same sink (no payload, never drops)."""
    import numpy as np

    import native_tsc
    from cp_sink.records import read_counts

    work.mkdir(parents=True)
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 2_000_000)
        .option("numPartitions", 2)
        .load()
        .selectExpr("value AS tuple_id")
    )
    sink, q = _start(df, work)
    time.sleep(seconds)
    q.stop()
    c = read_counts(sink)
    per_batch = (
        c.group_by(["batch_id"])
        .aggregate([("seen", "sum"), ("first_tsc_sink", "min"), ("last_tsc_sink", "max")])
        .sort_by("batch_id")
    )
    seen = per_batch["seen_sum"].to_numpy()[1:]  # the first batch starts the Python workers
    t = per_batch["last_tsc_sink_max"].to_numpy()[-1] - per_batch["last_tsc_sink_max"].to_numpy()[0]
    rate = float(np.sum(seen) / (t / native_tsc.frequency_hz())) if t > 0 else 0.0
    return {
        "max_rate": rate,
        "rows": int(np.sum(seen)),
        "batches": int(len(seen)),
        "stopped_because": f"ceiling: {len(seen)} micro-batches of 2,000,000 rows after the first",
    }


def report(
    results: dict[str, Any], load0: float, duration: float, grace: float | None, tolerance: float
) -> dict[str, float]:
    """Print the comparison table and the goals; return the ratios."""
    from rich.console import Console

    console = Console(width=max(Console().width, 130))
    ours = (results.get("cloudprofiler source") or {}).get("max_rate")
    cells = []
    for name, r in results.items():
        mr = r["max_rate"]
        ratio = f"{ours / mr:.2f}" if ours and mr else "-"
        load = f"{r['load_average']:.1f}" if "load_average" in r else "-"
        cells.append((name, "none" if mr is None else f"{mr:,.0f}", ratio, load, r["stopped_because"]))
    table = make_table(
        "Maximum sustainable rate, Spark local[2], YSB join -> cloudprofiler sink (null)",
        ("ingestion path", "tuples/s", "cloudprofiler / this", "load", "how the search ended"),
        cells,
        left=("ingestion path", "how the search ended"),
    )
    g = "automatic" if grace is None else f"{grace:g} s"
    console.print(
        f"load average at start: {load0:.1f} on {os.cpu_count()} cores; "
        f"{duration:g} s trials, grace {g}, bisection to {tolerance:.0%}"
    )
    console.print(table)
    naive = (results.get("naive Python source") or {}).get("max_rate")
    spark_best = max(
        (results.get(k) or {}).get("max_rate") or 0 for k in ("Spark socket + from_json", "Spark JSON files")
    )
    goals: dict[str, float] = {}
    if ours and naive:
        goals["vs naive (goal >= 5x)"] = ours / naive
    if ours and spark_best:
        goals["vs better of socket and files (goal >= 1.5x)"] = ours / spark_best
    if ours:
        goals[f"vs the {OLD_BEST:,} before issue 13 (goal >= 2x)"] = ours / OLD_BEST
    for k, v in goals.items():
        need = 5 if "naive" in k else 2 if "issue 13" in k else 1.5
        console.print(f"{k}: {v:.2f}x -> {'met' if v >= need else 'NOT met'}")
    best = {
        k: max((r["max_rate"] or 0 for n, r in results.items() if n.split(" #")[0] == k), default=0)
        for k in ("cloudprofiler source", PROJECTED)
    }
    projected, plain = best[PROJECTED], best["cloudprofiler source"]
    if plain and projected:
        goals["projected / all columns"] = projected / plain
        console.print(
            f"projection ({PROJECTED}{','.join(ysb_columns())}): "
            f"maximum rate with / without = {projected / plain:.2f}"
        )
    rounds = {k: [r for n, r in results.items() if n.split(" #")[0] == k] for k in (KEYS_OFF, KEYS_ON)}
    off = max((r["max_rate"] or 0 for r in rounds[KEYS_OFF]), default=0)
    on = max((r["max_rate"] or 0 for r in rounds[KEYS_ON]), default=0)
    if off and on:
        goals["keys on / keys off (fetch network)"] = on / off
        n = len(rounds[KEYS_ON])
        console.print(
            f"CurveZMQ keys end to end, fetch network: maximum rate on / off = {on / off:.2f}"
            + (f" (best of {n} searches each, in turn)" if n > 1 else "")
        )
    for rate, costs in cost_at_shared_rates(rounds[KEYS_OFF], rounds[KEYS_ON]).items():
        off_c, on_c = costs
        goals[f"keys on / off, CPU per tuple at {rate:,.0f}/s"] = on_c["all of ours"] / off_c["all of ours"]
        console.print(
            f"CPU us per tuple at {rate:,.0f} tuples/s offered, keys off -> on: "
            + "; ".join(f"{SHORT.get(k, k)} {off_c.get(k, 0):.2f} -> {v:.2f}" for k, v in on_c.items())
        )
    return goals


def cost_at_shared_rates(
    off: list[dict[str, Any]], on: list[dict[str, Any]]
) -> dict[float, tuple[dict[str, float], dict[str, float]]]:
    """CPU us per emitted tuple by role, keys off and on, at each rate both sides' searches offered.

    A search's maximum moves with other load by more than encryption costs, and CPU per tuple
    falls as the rate grows (a micro-batch has a fixed cost); at the same offered rate the two
    sides' CPU per tuple compare what each tuple costs, whatever share of the cores each got.
    """

    def per_rate(runs: list[dict[str, Any]]) -> dict[float, dict[str, float]]:
        acc: dict[float, dict[str, float]] = {}
        for r in runs:
            for t in r.get("trials") or []:
                if t["verdict"] == "warm-up" or not t["emitted"] or not t.get("cpu_cores"):
                    continue
                a = acc.setdefault(float(t["rate"]), {"emitted": 0.0})
                a["emitted"] += t["emitted"]
                for k, v in t["cpu_cores"].items():
                    if k != "rest of the machine":
                        a[k] = a.get(k, 0.0) + v * (t["t1"] - t["t0"])
        out = {}
        for rate, a in acc.items():
            n = a.pop("emitted")
            out[rate] = {k: v / n * 1e6 for k, v in a.items() if v > 0}
            out[rate]["all of ours"] = sum(out[rate].values())
        return out

    a, b = per_rate(off), per_rate(on)
    return {rate: (a[rate], b[rate]) for rate in sorted(set(a) & set(b))}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per trial (default 5)")
    ap.add_argument(
        "--grace", type=float, help="seconds for the sink to catch up (default: warm-up landing time + 0.5 s)"
    )
    ap.add_argument("--tolerance", type=float, default=0.1, help="bisection stops within this (default 0.1)")
    ap.add_argument("--max-steps", type=int, default=9)
    ap.add_argument("--only", help="comma-separated subset of systems (default: all)")
    ap.add_argument(
        "--keys-rounds",
        type=int,
        default=1,
        help="search the keys off/on and projection pairs this many times in turn",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "endtoend.json"))
    ap.add_argument("--show", metavar="JSON", help="print the table of a saved result and exit")
    ap.add_argument(
        "--latency",
        metavar="RATES",
        help="also measure steady-state latency at these rates (e.g. 50000,half: half the maximum)",
    )
    ap.add_argument("--latency-duration", type=float, default=40.0, help="seconds per latency run")
    ap.add_argument("--latency-warmup", type=float, default=15.0, help="seconds left out at the start")
    return ap.parse_args()


def selected_systems(only: str | None) -> list[tuple[str, int]]:
    """The systems ``--only`` names, by full name or first word; all of them without it."""
    if not only:
        return SYSTEMS
    keep = {s.strip() for s in only.split(",")}
    # "keys": the two fetch=network rows, keys off and on, side by side; "projection": the source
    # with and without columns=
    pair = ("cloudprofiler source", PROJECTED) if "projection" in keep else ()
    return [
        s
        for s in SYSTEMS
        if s[0] in keep or s[0].split()[0] in keep or ("keys" in keep and "keys" in s[0]) or s[0] in pair
    ]


def _progress(console: Any) -> Callable[[Any], None]:
    def progress(s: Any) -> None:
        console.print(
            f"  {s.rate:>12,.0f}/s: emitted {s.emitted:,} dropped {s.dropped:,} "
            f"received {s.received:,} -> {s.verdict}"
        )

    return progress


def _wall(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class TrialWindows:
    """Wraps a target's offer: each trial's time window and the micro-batches Spark started in it."""

    def __init__(self, offer: Any, query: Any) -> None:
        self.offer, self.query = offer, query
        self.trials: list[dict[str, Any]] = []

    def __call__(self, rate: float, duration: float) -> dict[str, Any]:
        t0, w0 = time.monotonic(), time.time()
        summary: dict[str, Any] = {}
        try:
            summary = dict(self.offer(rate, duration))
            return summary
        finally:
            t1, w1 = time.monotonic(), time.time()
            # the generator's emission, not its process's start-up (seconds at a high load)
            end = float(summary.get("end_wall_s") or w1)
            start = max(w0, end - float(summary.get("elapsed_s") or (end - w0)))
            if end > start:
                t0, t1, w0, w1 = t0 + (start - w0), t1 - (w1 - end), start, end
            batches = [p for p in self.query.recentProgress if w0 <= _wall(p["timestamp"]) < w1]
            busy_ms = sum(int(p["batchDuration"]) for p in batches)
            rows = sum(int(p["numInputRows"]) for p in batches)
            self.trials.append(
                {
                    "rate": rate,
                    "emitted": int(summary.get("emitted", 0)),
                    "t0": t0,
                    "t1": t1,
                    "batches": len(batches),
                    "spark_rows": rows,
                    # the share of the trial Spark spent running micro-batches, and its rate while it did
                    "spark_busy": busy_ms / 1e3 / (w1 - w0),
                    "spark_rows_per_busy_s": rows / (busy_ms / 1e3) if busy_ms else None,
                    "add_batch_ms": sum(int(p["durationMs"].get("addBatch", 0)) for p in batches),
                }
            )

    def finish(self, cpu: Any, attempts: list[Any]) -> list[dict[str, Any]]:
        """The trials with the CPU each role used during them and the search's verdict."""
        # the search's warm-up loads come first and are no attempts
        verdicts = ["warm-up"] * (len(self.trials) - len(attempts)) + [a.verdict for a in attempts]
        out = []
        for tr, verdict in zip(self.trials, verdicts, strict=False):
            roles = cpu.window(tr["t0"], tr["t1"]) if cpu is not None else {}
            out.append({**tr, "verdict": verdict, "cpu_cores": roles})
        return out


def search_system(
    name: str, start: int, spark: Any, work: Path, args: argparse.Namespace, console: Any, cpu: Any = None
) -> dict[str, Any]:
    """Start system ``name``'s query and bisect to its maximum sustainable rate; always stop it."""
    target, q, cleanup = build(name, spark, work)
    windows = TrialWindows(target.offer, q)
    target.offer = windows
    t_start = time.monotonic()
    try:
        res, _trial, attempts = find_max_rate(
            target,
            method="bisect",
            start=start,
            tolerance=args.tolerance,
            max_steps=args.max_steps,
            duration=args.duration,
            grace=args.grace,
            retries=1,
            progress=_progress(console),
        )
    finally:
        if q.isActive:
            q.stop()
        cleanup()
    return {
        "max_rate": res.max_rate,
        "load_average": os.getloadavg()[0],  # at the search's end (1-minute average)
        "stopped_because": res.stopped_because,
        "generator_cap": res.generator_cap,
        "attempts": [a.__dict__ for a in attempts],
        "trials": windows.finish(cpu, attempts),
        "cpu_us_per_tuple": cpu_per_tuple(cpu, t_start, time.monotonic(), windows.trials),
    }


def failed_or_searched(
    name: str, start: int, spark: Any, work: Path, args: argparse.Namespace, console: Any, cpu: Any
) -> dict[str, Any]:
    """``search_system``, or a row that says why the system failed: one system that cannot start or
    breaks mid-search is reported in its row, and the others still run."""
    try:
        return search_system(name, start, spark, work, args, console, cpu)
    except Exception as e:  # any failure of one system is that system's result
        line = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        console.print(f"[red]{name} failed: {line}[/red]")
        return {
            "max_rate": None,
            "load_average": os.getloadavg()[0],
            "stopped_because": f"failed: {type(e).__name__}: {line}",
            "failed": True,
        }


def cpu_per_tuple(cpu: Any, t0: float, t1: float, trials: list[dict[str, Any]]) -> dict[str, float]:
    """CPU us per emitted tuple by role over a whole search (warm-ups, trials, drains, idle gaps).

    Less sensitive to other load than the maximum rate: what a tuple costs each process,
    whichever share of the cores it got.
    """
    emitted = sum(t["emitted"] for t in trials)
    if cpu is None or not emitted:
        return {}
    cores = cpu.window(t0, t1)
    per = {k: v * (t1 - t0) / emitted * 1e6 for k, v in cores.items() if k != "rest of the machine"}
    per["all of ours"] = sum(per.values())
    return per


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected system, then the rate source's ceiling, on one SparkSession."""
    from rich.console import Console

    from cloudprofiler.spark_local import local_session

    console = Console(width=160)
    # a Python worker started on a busy machine may take more than the default 15 s to connect back
    conf = {"spark.driver.memory": "2g", "spark.python.authenticate.socketTimeout": "120s"}
    spark = local_session("cloudprofiler-endtoend", conf=conf)
    results: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="cp-endtoend-"))
    cpu = CpuByRole(1.0).__enter__()
    try:
        for i, (name, start) in enumerate(with_rounds(selected_systems(args.only), args.keys_rounds)):
            console.rule(name)
            results[name] = failed_or_searched(name, start, spark, work / f"s{i}", args, console, cpu)
            if results[name].get("trials"):
                console.print(where_time_goes(name, results[name]["trials"]))
        if not args.only or "rate" in args.only:
            console.rule("Spark rate source (ceiling)")
            results["Spark rate source (no payload)"] = rate_ceiling(spark, work / "rate", 15.0)
        if args.latency:
            lat = []
            for i, rate in enumerate(latency_rates(args.latency, results, args.out)):
                console.rule(f"latency at {rate:,.0f} tuples/s")
                lat.append(
                    steady_latency(spark, work / f"lat{i}", rate, args.latency_duration, args.latency_warmup)
                )
            console.print(latency_table(lat))
            results["latency"] = lat
    finally:
        cpu.__exit__()
        spark.stop()
    return results


SHORT = {
    "generator": "gen",
    "factory workers": "workers",
    "factory front end + segment server": "front+seg",
    "Spark JVM": "JVM",
    "Spark Python tasks": "py tasks",
    "Spark Python driver side": "py driver",
    "this script": "script",
    "rest of the machine": "others",
}


def where_time_goes(name: str, trials: list[dict[str, Any]]) -> Any:
    """Per trial: CPU by role (cores, of 2), and how busy Spark was running micro-batches."""
    cells = []
    for t in trials:
        c = t.get("cpu_cores") or {}
        per_busy = t["spark_rows_per_busy_s"]
        cells.append(
            (
                f"{t['rate']:,.0f}",
                t["verdict"],
                *(f"{c.get(k, 0.0):.2f}" for k in SHORT),
                f"{t['spark_busy']:.0%}",
                f"{t['batches']}",
                "-" if per_busy is None else f"{per_busy:,.0f}",
            )
        )
    return make_table(
        f"{name}: CPU by role during each trial (cores of {os.cpu_count()}) and Spark's micro-batches",
        ("offered/s", "verdict", *SHORT.values(), "Spark busy", "batches", "Spark rows/busy s"),
        cells,
    )


def steady_latency(spark: Any, work: Path, rate: float, duration: float, warmup: float) -> dict[str, Any]:
    """End-to-end latency (generator stamp to sink stamp, one host) of the cloudprofiler pipeline
    at a constant ``rate``: p50/p99 of the tuples generated after ``warmup`` s, and per 5 s."""
    import numpy as np

    import native_tsc
    from cp_common.stamp_columns import GEN, SINK, tsc_column
    from cp_sink.records import read_records, total_seen

    target, q = start_source_query(spark, work, max_spool_bytes=256 << 20, handler="xoy")
    try:
        summary = target.offer(rate, duration)
        deadline = time.monotonic() + 60
        while total_seen(target.sink) < summary["emitted"] and time.monotonic() < deadline:
            time.sleep(0.2)
        seen = total_seen(target.sink)
    finally:
        q.stop()
    rec = read_records(target.sink)
    gen = rec.column(tsc_column(GEN)).to_numpy()
    lat = (rec.column(tsc_column(SINK)).to_numpy() - gen) / native_tsc.frequency_hz()
    t = (gen - gen.min()) / native_tsc.frequency_hz()
    steady = lat[t >= warmup]
    per5 = [float(np.median(lat[(t >= a) & (t < a + 5)])) for a in range(0, int(duration), 5)]
    return {
        "rate": rate,
        "duration": duration,
        "warmup": warmup,
        "emitted": summary["emitted"],
        "dropped": summary["dropped"],
        "seen": seen,
        "sampled": int(len(steady)),
        "p50_s": float(np.percentile(steady, 50)),
        "p99_s": float(np.percentile(steady, 99)),
        "max_s": float(steady.max()),
        "median_per_5s": per5,
    }


def latency_rates(spec: str, results: dict[str, Any], saved: str) -> list[float]:
    """``50000,half``: numbers, or half the cloudprofiler source's maximum (this run's, else ``saved``)."""
    best = (results.get("cloudprofiler source") or {}).get("max_rate")
    if best is None and Path(saved).exists():
        best = json.loads(Path(saved).read_text())["results"]["cloudprofiler source"]["max_rate"]
    out = []
    for item in spec.split(","):
        if item.strip() == "half":
            if not best:
                raise SystemExit(
                    "--latency half: no maximum rate of the cloudprofiler source measured or saved"
                )
            out.append(round(best / 2))
        else:
            out.append(float(item))
    return out


def latency_table(rows: list[dict[str, Any]]) -> Any:
    cells = [
        (
            f"{r['rate']:,.0f}",
            f"{r['p50_s'] * 1e3:,.0f}",
            f"{r['p99_s'] * 1e3:,.0f}",
            f"{r['max_s'] * 1e3:,.0f}",
            f"{r['seen']:,} of {r['emitted']:,} ({r['dropped']:,} dropped)",
            " ".join(f"{x * 1e3:.0f}" for x in r["median_per_5s"]),
        )
        for r in rows
    ]
    return make_table(
        "Steady-state latency, generator -> cloudprofiler sink, after the warm-up",
        ("tuples/s", "p50 ms", "p99 ms", "max ms", "reached the sink", "median per 5 s, ms"),
        cells,
    )


def write_result(
    args: argparse.Namespace,
    load0: float,
    results: dict[str, Any],
    goals: dict[str, float],
    latency: list[dict[str, Any]] | None = None,
) -> None:
    # default=str: a value JSON has no type for (a numpy scalar, say) is written as text rather
    # than failing the run at its very end
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "load_average_start": load0,
                "duration": args.duration,
                "grace": args.grace,
                "tolerance": args.tolerance,
                "results": results,
                "ratios": goals,
                "latency": latency,
            },
            indent=2,
            default=str,
        )
    )


def show(doc: dict[str, Any]) -> None:
    """The report of a saved result: each search's CPU table, the comparison, the latency table."""
    from rich.console import Console

    for name, r in doc["results"].items():
        if r.get("trials"):
            Console(width=150).print(where_time_goes(name, r["trials"]))
    report(doc["results"], doc["load_average_start"], doc["duration"], doc["grace"], doc["tolerance"])
    if doc.get("latency"):
        Console(width=130).print(latency_table(doc["latency"]))


def main() -> int:
    args = parse_args()
    if args.show:
        show(json.loads(Path(args.show).read_text()))
        return 0
    load0 = os.getloadavg()[0]
    results = measure_all(args)
    latency = results.pop("latency", None)
    goals = report(results, load0, args.duration, args.grace, args.tolerance) if results else {}
    write_result(args, load0, results, goals, latency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
