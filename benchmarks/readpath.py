"""The read path against the Python DataSource API's own ceiling, side by side in one run.

One spool is prefilled by the real factory (generator -> factory -> spool, YSB).
Its rows, with the source's stamp columns, are then written once as Parquet and
once as an Arrow IPC file, so every row below reads the same rows into Spark's
``noop`` sink with ``trigger(availableNow=True)`` on local[2]:

1. Spark's Parquet file source;
2. a bare Python DataSource (``bare_arrow``, defined here) that memory-maps the Arrow
   file and yields its rows as ``pyarrow.RecordBatch`` (a few partition/batch shapes);
3. the ``cloudprofiler`` source on a copy of the spool (factory external), reading
   the segment files (fetch local) or fetching them from its segment server (fetch network);
4. the ``cloudprofiler`` source into the ``cloudprofiler`` sink (handler null and id).

Each query runs ``--repeat`` times (best kept, after a warm-up query that starts the
Python workers). ``M rows/s`` is rows over the micro-batches' trigger time (what
Spark reports in the progress); ``wall`` is from ``start()`` to the end of the query.
The ratio is ours over the best bare DataSource shape of the same run.

    python benchmarks/readpath.py [--rows 2000000] [--repeat 2]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_common import arg_parser, make_table, run_head, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: E402

# The bare source's partition/batch shapes: (partitions, rows per batch).
BARE_SHAPES = [(2, 65_536), (8, 65_536), (20, 10_000)]
OLD_PLAN = {"segmentsPerPartition": "4", "rowsPerPartition": str(1 << 40)}
# What the YSB query (cloudprofiler.jobs.queries.ysb_stateless) and the sink read of the source.
YSB_COLUMNS = (
    "ad_id",
    "event_type",
    "event_time",
    "tuple_id",
    "cp_tsc_gen",
    "cp_node_gen",
    "cp_tsc_factory",
    "cp_node_factory",
    "cp_tsc_source",
    "cp_node_source",
)
GOAL = 0.85  # of the best bare shape, in every shape of ours


# ---- the bare Python DataSource: the API's ceiling for the same Arrow data ----------------------
class RowRange(InputPartition):
    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


class BareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One micro-batch of every row of the file, split into ``partitions`` row ranges."""

    def __init__(self, options: dict[str, str]) -> None:
        from cp_common.process_times import mark, mark_process_start

        mark_process_start("bare reader")
        mark("bare reader: constructed")
        self.path = options["path"]
        self.parts = int(options["partitions"])
        self.batch = int(options["batch"])
        self.rows = int(options["rows"])
        self.trickle = int(options.get("trickle", 0))  # >0: a micro-batch of this many rows per trigger

    def initialOffset(self) -> dict:
        return {"v": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"v": start["v"] + 1} if self.trickle else {"v": 1}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[RowRange]:
        if start["v"] == end["v"]:
            return []
        if self.trickle:
            lo = start["v"] * self.trickle % max(1, self.rows - self.trickle)
            half = self.trickle // self.parts
            return [RowRange(lo + i * half, lo + (i + 1) * half) for i in range(self.parts)]
        step = -(-self.rows // self.parts)
        return [RowRange(lo, min(lo + step, self.rows)) for lo in range(0, self.rows, step)]

    def read(self, partition: RowRange) -> Iterator[Any]:  # type: ignore[override]
        import pyarrow as pa

        with pa.memory_map(self.path, "r") as src:
            table = pa.ipc.open_file(src).read_all()
        yield from table.slice(partition.lo, partition.hi - partition.lo).to_batches(self.batch)

    def commit(self, end: dict) -> None:
        pass


class BareArrowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bare_arrow"

    def schema(self) -> str:
        raise ValueError("bare_arrow: give the schema with readStream.schema(...)")

    def streamReader(self, schema: Any) -> BareStreamReader:
        return BareStreamReader(dict(self.options))


# ---- the data --------------------------------------------------------------------------------------
def prefill(spool: Path, rows: int, rate: float) -> dict[str, Any]:
    """Fill ``spool`` through the real factory (2 workers) with about ``rows`` YSB tuples."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    t0 = time.monotonic()
    with start_factory("tcp://127.0.0.1:0", spool, workers=2, max_spool_bytes=8 << 30) as f:
        summary = run_generator(f.endpoint, GeneratorSettings(rate, rows / rate, senders=2))
        if not f.wait_drained(timeout=120, senders=[int(s["id"]) for s in summary["senders"]]):
            raise RuntimeError("the factory did not publish everything it received")
    sp = Spool(spool)
    segs = [s for w in sp.workers() for s in sp.segments(w, -1, sp.latest()[w])]
    return {
        "rows": sum(s.rows for s in segs),
        "segments": len(segs),
        "segment_rows_mean": sum(s.rows for s in segs) / max(1, len(segs)),
        "dropped": summary["dropped"],
        "fill_s": time.monotonic() - t0,
    }


def export_rows(spool: Path, work: Path, schema: Any) -> tuple[str, str]:
    """The spool's rows as the source outputs them: an Arrow IPC file and a Parquet directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    import native_tsc
    from cp_source.spool.segments import Spool, read_segment

    sp = Spool(spool)
    target = to_arrow_schema(schema, timezone="UTC")
    tables = []
    for w in sp.workers():
        for s in sp.segments(w, -1, sp.latest()[w]):
            t = read_segment(s.path)
            n = t.num_rows
            t = t.append_column(target.names[-2], pa.repeat(pa.scalar(native_tsc.now(), pa.int64()), n))
            t = t.append_column(target.names[-1], pa.repeat(pa.scalar(native_tsc.domain_id()), n))
            tables.append(t.select(target.names).cast(target).replace_schema_metadata(None))
    table = pa.concat_tables(tables).combine_chunks()
    arrow_path = str(work / "rows.arrow")
    with pa.OSFile(arrow_path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=1 << 16)
    pq_dir = work / "parquet"
    pq_dir.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), pq_dir / "part-0.parquet")
    pq.write_table(table.slice(half), pq_dir / "part-1.parquet")
    return arrow_path, str(pq_dir)


# ---- the queries -----------------------------------------------------------------------------------
def run_query(df: Any, work: Path, sink: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Run ``df`` to its end with availableNow into noop (or ``sink(writer)``); rows and times."""
    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=work)
    w = df.writeStream.trigger(availableNow=True).option("checkpointLocation", ckpt)
    w = sink(w) if sink is not None else w.format("noop")
    t0 = time.monotonic()
    q = w.start()
    q.awaitTermination()
    wall = time.monotonic() - t0
    if q.exception() is not None:
        raise RuntimeError(f"query failed: {q.exception()}")
    progress = [p for p in q.recentProgress if int(p["numInputRows"]) > 0]
    rows = sum(int(p["numInputRows"]) for p in progress)
    trigger_ms = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress)
    return {
        "rows": rows,
        "batches": len(progress),
        "trigger_s": trigger_ms / 1000,
        "wall_s": wall,
        "mrows_s": rows / (trigger_ms / 1000) / 1e6 if trigger_ms else 0.0,
        "durations_ms": [dict(p["durationMs"]) for p in progress],
    }


def retried(once: Callable[[], dict[str, Any]], label: str, tries: int = 10) -> dict[str, Any]:
    """``once()``, run again when Spark could not start a Python worker (a machine so busy that one
    does not connect back in time): that run measured nothing; the retries are recorded."""
    for k in range(tries):
        try:
            return {**once(), "retries": k}
        except Exception as e:  # a failed query (StreamingQueryException) or its RuntimeError
            if "connect back" not in str(e) or k == tries - 1:
                raise
            print(f"{label}: a Python worker did not connect back, run again")
            time.sleep(5)
    raise AssertionError("unreachable")


def interleaved(
    cases: list[tuple[str, str, Callable[[], dict[str, Any]]]], repeat: int, rows: int
) -> list[dict[str, Any]]:
    """Every case ``repeat`` times, round by round (case 1, 2, ..., then again), the best run of
    each kept with the load average when it ended; every run must read exactly ``rows`` rows."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in cases}
    for i in range(repeat):
        for label, _, once in cases:
            r = retried(once, label)
            if r["rows"] != rows:
                raise RuntimeError(f"{label}: read {r['rows']} rows, expected {rows}")
            r["load_average"] = os.getloadavg()[0]
            runs[label].append(r)
            print(f"round {i + 1}, {label}: {r['mrows_s']:.2f} M rows/s, load {r['load_average']:.1f}")
    out = []
    for label, kind, _ in cases:
        best = max(runs[label], key=lambda r: r["mrows_s"])
        out.append(
            {
                "path": label,
                "kind": kind,
                **best,
                "runs_mrows_s": [round(r["mrows_s"], 3) for r in runs[label]],
            }
        )
    return out


def ours_df(spark: Any, spool: str, fetch: str, extra: dict[str, str] | None = None) -> Any:
    r = (
        spark.readStream.format("cloudprofiler")
        .option("spool", spool)
        .option("factory", "external")
        .option("fetch", fetch)
    )
    for k, v in (extra or {}).items():
        r = r.option(k, v)
    return r.load()


def fresh_copy(spool: Path, work: Path) -> str:
    """A copy of the prefilled spool: a query's commit deletes the segments it read."""
    dst = Path(tempfile.mkdtemp(prefix="spool-", dir=work)) / "spool"
    shutil.copytree(spool, dst, ignore=shutil.ignore_patterns("*.lock", "_reader.json"))
    return str(dst)


def measure(
    spark: Any, work: Path, spool: Path, files: tuple[str, str], n: int, repeat: int, quick: bool = False
) -> list[dict[str, Any]]:
    """Every row of the throughput table, in one session (``quick``: the bare and source rows only)."""
    from cp_source.reader.options import ReaderOptions, source_schema

    schema = source_schema(ReaderOptions.parse({}))
    arrow_path, pq_dir = files

    def bare(parts: int, batch: int) -> Callable[[], dict[str, Any]]:
        opts = {"path": arrow_path, "partitions": str(parts), "batch": str(batch), "rows": str(n)}
        return lambda: run_query(
            spark.readStream.schema(schema).format("bare_arrow").options(**opts).load(), work
        )

    def ours(
        fetch: str, sink: Callable[[Any], Any] | None = None, extra: dict[str, str] | None = None
    ) -> Callable[[], dict[str, Any]]:
        return lambda: run_query(ours_df(spark, fresh_copy(spool, work), fetch, extra), work, sink)

    def into_sink(handler: str) -> Callable[[Any], Any]:
        return lambda w: (
            w.format("cloudprofiler")
            .option("handler", handler)
            .option("path", tempfile.mkdtemp(prefix=f"sink-{handler}-", dir=work))
        )

    cases: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
        (
            "Spark Parquet file source",
            "spark",
            lambda: run_query(spark.readStream.schema(schema).parquet(pq_dir), work),
        ),
        *[
            (f"bare DataSource, {p} partitions x {b:,}-row batches", "bare", bare(p, b))
            for p, b in BARE_SHAPES
        ],
        ("cloudprofiler source, fetch local", "ours", ours("local")),
        ("cloudprofiler source, fetch network", "ours", ours("network")),
        # how partitions were planned before rowsPerPartition: 4 segments each
        ("cloudprofiler source, fetch local, 4 segments/partition", "ours", ours("local", None, OLD_PLAN)),
        # projection: the columns the YSB query and the sink read (fewer bytes than the bare rows)
        (
            f"cloudprofiler source, fetch local, {len(YSB_COLUMNS)} of 15 columns",
            "projected",
            ours("local", None, {"columns": ",".join(YSB_COLUMNS)}),
        ),
        ("cloudprofiler source -> sink (null)", "ours+sink", ours("local", into_sink("null"))),
        ("cloudprofiler source -> sink (id)", "ours+sink", ours("local", into_sink("id"))),
    ]
    if quick:
        cases = [c for c in cases if c[1] in ("bare", "ours", "projected")]
    retried(lambda: bare(2, 65_536)(), "warm-up")  # starts the Python workers, JIT-free paths imported
    retried(ours("local"), "warm-up")
    return interleaved(cases, repeat, n)


def python_side(spool: Path, arrow_path: str, n: int) -> dict[str, float]:
    """CPU seconds per million rows of the Python part of ``read``, in this process: the bare
    source's (memory-map, slice into 65,536-row batches) and ours by stage (load and check each
    segment; join into large batches; stamp and cast). The rest of a query is Spark's own."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    import native_tsc
    from cp_source.reader.coalesce import coalesced
    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.partitions import SegmentLoader, SegmentRange, stamped
    from cp_source.spool.segments import Spool

    def cpu(fn: Callable[[], Any]) -> float:
        t0 = time.process_time()
        fn()
        return (time.process_time() - t0) / n * 1e6

    def bare() -> None:
        with pa.memory_map(arrow_path, "r") as src:
            sum(b.num_rows for b in pa.ipc.open_file(src).read_all().to_batches(65_536))

    sp = Spool(spool)
    parts = [
        SegmentRange(
            w,
            [(s.number, s.path, s.rows, s.tuple_id_min) for s in sp.segments(w, -1, sp.latest()[w])],
            fetch="local",
            spool_id=sp.spool_id(),
            planned=native_tsc.reading(),  # as the driver plans it: the planned columns are made too
        )
        for w in sp.workers()
    ]
    target = to_arrow_schema(source_schema(ReaderOptions.parse({})), timezone="UTC")
    tables: list[Any] = []
    load = cpu(lambda: tables.extend(SegmentLoader(p).load(*seg) for p in parts for seg in p.segments))
    batches: list[Any] = []
    join = cpu(lambda: batches.extend(coalesced(iter(tables))))
    stamp = cpu(
        lambda: sum(
            b.num_rows
            for b in stamped(iter([pa.Table.from_batches([b]) for b in batches]), target, part=parts[0])
        )
    )
    return {
        "bare_read": cpu(bare),
        "load_check": load,
        "coalesce": join,
        "stamp_cast": stamp,
        "batches_in": sum(t.num_rows and len(t.to_batches()) for t in tables),
        "batches_out": len(batches),
    }


# ---- start-up and the per-batch floor ---------------------------------------------------------------
def _first_rows_s(q: Any, t0: float, timeout: float = 180.0) -> float:
    """Seconds from ``t0`` until the query's progress shows a finished micro-batch with rows."""
    while time.monotonic() < t0 + timeout:
        if any(int(p["numInputRows"]) > 0 for p in q.recentProgress):
            from cp_common.process_times import mark

            mark("bench: first rows seen")
            return time.monotonic() - t0
        if not q.isActive:
            raise RuntimeError(f"query stopped: {q.exception()}")
        time.sleep(0.02)
    raise TimeoutError(f"no rows within {timeout:.0f}s")


def _ours_live(spark: Any, work: Path, name: str, rate: float, seconds: float, bucket: int = 1000) -> Any:
    """Start the source (embedded factory) into noop and a generator thread once the factory is ready.

    Returns the query, the start time, the ready time and the generator thread."""
    import threading

    import cloudprofiler
    from cp_common.process_times import mark
    from cp_source.generate.generator import run_generator
    from cp_source.reader.state import wait_reader_state

    spool = work / f"{name}-spool"
    df = spark.readStream.format("cloudprofiler").option("endpoint", "tcp://127.0.0.1:0")
    df = df.option("spool", str(spool)).load()
    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=work)
    t0 = time.monotonic()
    mark("bench: start()")
    q = df.writeStream.format("noop").option("checkpointLocation", ckpt).start()
    mark("bench: start() returned")
    wait_reader_state(str(spool), 120.0)
    mark("bench: reader state live")
    state = cloudprofiler.wait_for_factory(str(spool), q)
    mark("bench: wait_for_factory returned")
    ready = time.monotonic() - t0
    gen = threading.Thread(
        target=run_generator, args=(state.factory_endpoint, rate, seconds), kwargs={"bucket": bucket}
    )
    gen.start()
    return q, t0, ready, gen


def _batches(q: Any, wall0: float, n: int = 3) -> list[dict[str, Any]]:
    """The query's first ``n`` micro-batches: start (s after ``wall0``), rows and phases (ms)."""
    from datetime import datetime

    out = []
    for p in q.recentProgress[:n]:
        at = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        out.append(
            {
                "batch": int(p["batchId"]),
                "start_s": round(at - wall0, 3),
                "rows": int(p["numInputRows"]),
                "ms": dict(p["durationMs"]),
            }
        )
    return out


def _timeline(path: str, wall0: float, wall1: float) -> list[tuple[float, int, str]]:
    """The trace's events between ``wall0`` and ``wall1``, as seconds after ``wall0``."""
    from cp_common.process_times import read_trace

    return [(round(t - wall0, 3), pid, ev) for t, pid, ev in read_trace(path) if wall0 <= t <= wall1]


def _first_rows_of(df: Any, work: Path, trace: str | None) -> tuple[float, list[dict[str, Any]]]:
    """Seconds from start() to the first micro-batch with rows, and the first micro-batches."""
    from cp_common.process_times import mark

    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=work)
    t0, wall0 = time.monotonic(), time.time()
    mark("bench: start()")
    q = df.writeStream.format("noop").option("checkpointLocation", ckpt).start()
    first = _first_rows_s(q, t0)
    wall1 = time.time()
    q.stop()
    if trace:
        for t, pid, ev in _timeline(trace, wall0, wall1):
            print(f"  {t:7.3f} s  {pid:>7}  {ev}")
    return first, _batches(q, wall0)


def startup(
    spark: Any, work: Path, arrow: tuple[str, int], rounds: int = 2, trace: str | None = None
) -> list[dict[str, Any]]:
    """Seconds from start() to the first micro-batch with rows: Spark's rate source, a bare Python
    DataSource (the floor of any Python source: ``arrow`` is its file and rows), then ours.

    With ``trace`` (the file of ``CLOUDPROFILER_STARTUP_TRACE``) each round also keeps the timeline
    of our query's start-up and the first micro-batches of each query."""
    from cp_source.reader.options import ReaderOptions, source_schema

    schema = source_schema(ReaderOptions.parse({}))
    bare_opts = {"path": arrow[0], "partitions": "2", "batch": "65536", "rows": str(arrow[1])}
    out = []
    for i in range(rounds):
        rate_s, rate_batches = _first_rows_of(
            spark.readStream.format("rate").option("rowsPerSecond", 50_000).load(), work, None
        )
        bare = spark.readStream.schema(schema).format("bare_arrow").options(**bare_opts, trickle="2000")
        bare_s, bare_batches = _first_rows_of(bare.load(), work, trace)
        wall0 = time.time()
        q, t0, ready, gen = _ours_live(spark, work, f"start{i}", 50_000, 4.0)
        ours_s = _first_rows_s(q, t0)
        wall1 = time.time()
        gen.join()  # before stop(): a stopped factory leaves the generator waiting for its EOS ack
        q.stop()
        row = {
            "round": i + 1,
            "load_average": os.getloadavg()[0],
            "rate_first_rows_s": rate_s,
            "bare_first_rows_s": bare_s,
            "ours_factory_ready_s": ready,
            "ours_first_rows_s": ours_s,
            "rate_batches": rate_batches,
            "bare_batches": bare_batches,
            "ours_batches": _batches(q, wall0),
        }
        if trace:
            row["timeline"] = _timeline(trace, wall0, wall1)
            for t, pid, ev in row["timeline"]:
                print(f"  {t:7.3f} s  {pid:>7}  {ev}")
            for label in ("rate_batches", "bare_batches", "ours_batches"):
                for b in row[label]:
                    print(f"  {label} {b}")
        print(
            f"start-up round {i + 1}: rate {rate_s:.2f}s, bare {bare_s:.2f}s, ours {ours_s:.2f}s "
            f"(wait_for_factory {ready:.2f}s)"
        )
        out.append(row)
    return out


def _phases(q: Any, skip: int = 3) -> dict[str, Any]:
    """Median and p90 of each phase of the micro-batches with rows, the first ``skip`` left out."""
    import numpy as np

    progress = [p for p in q.recentProgress if int(p["numInputRows"]) > 0][skip:]
    if not progress:
        return {"batches": 0}
    keys = sorted({k for p in progress for k in p["durationMs"]})
    med = {k: float(np.median([p["durationMs"].get(k, 0) for p in progress])) for k in keys}
    p90 = {k: float(np.percentile([p["durationMs"].get(k, 0) for p in progress], 90)) for k in keys}
    rows = float(np.median([int(p["numInputRows"]) for p in progress]))
    return {"batches": len(progress), "rows_median": rows, "median_ms": med, "p90_ms": p90}


def floor(spark: Any, work: Path, arrow_path: str, n_rows: int, seconds: float) -> list[dict[str, Any]]:
    """Micro-batches of almost no data into noop: where a batch's time goes, per source."""
    from cp_source.reader.options import ReaderOptions, source_schema

    schema = source_schema(ReaderOptions.parse({}))
    opts = {"path": arrow_path, "partitions": "2", "batch": "65536", "rows": str(n_rows), "trickle": "200"}
    cases = {
        "Spark rate-micro-batch, 200 rows/batch": spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 200)
        .option("numPartitions", 2)
        .load(),
        "bare DataSource, 200 rows/batch": spark.readStream.schema(schema)
        .format("bare_arrow")
        .options(**opts)
        .load(),
    }
    out = []
    for label, df in cases.items():
        ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=work)
        q = df.writeStream.format("noop").option("checkpointLocation", ckpt).start()
        time.sleep(seconds)
        if not q.isActive:
            raise RuntimeError(f"{label}: the query stopped: {q.exception()}")
        q.stop()
        out.append({"path": label, **_phases(q)})
    q, _, _, gen = _ours_live(spark, work, "floor", 2_000, seconds + 2, bucket=50)
    time.sleep(seconds + 2)
    q.stop()
    gen.join()
    out.append({"path": "cloudprofiler source, 2,000 tuples/s", **_phases(q)})
    for r in out:
        med = r.get("median_ms", {})
        print(
            f"{r['path']}: {r['batches']} batches, median trigger {med.get('triggerExecution', 0):.0f} ms",
            med,
        )
    return out


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    bare_best = max(r["mrows_s"] for r in rows if r["kind"] == "bare")
    out = []
    for r in rows:
        ratio = f"{r['mrows_s'] / bare_best:.0%}" if r["kind"] not in ("spark", "bare") else ""
        load = f"{r['load_average']:.1f}" if "load_average" in r else ""
        out.append([r["path"], f"{r['mrows_s']:.2f}", f"{r['wall_s']:.1f}", str(r["batches"]), load, ratio])
    return out


def goal_line(rows: list[dict[str, Any]]) -> str:
    """Whether every shape of the source alone reached ``GOAL`` of the best bare shape."""
    bare_best = max(r["mrows_s"] for r in rows if r["kind"] == "bare")
    ours = [(r["mrows_s"] / bare_best, r["path"]) for r in rows if r["kind"] == "ours"]
    low, path = min(ours)
    verdict = "met" if low >= GOAL else "not met"
    return (
        f"goal: every shape of the source at least {GOAL:.0%} of the best bare shape: {verdict} "
        f"(lowest {low:.0%}, {path})"
    )


def main() -> int:
    ap = arg_parser(__doc__, "readpath")
    ap.add_argument("--rows", type=int, default=2_000_000, help="tuples prefilled (default 2,000,000)")
    ap.add_argument("--rate", type=float, default=300_000, help="generator rate for the prefill (2 senders)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds over every row, best kept (default 2)")
    ap.add_argument("--sections", default="throughput,startup,floor", help="which parts to run")
    ap.add_argument("--floor-seconds", type=float, default=15.0, help="seconds per per-batch floor query")
    ap.add_argument("--rounds", type=int, default=2, help="start-up rounds (default 2)")
    ap.add_argument("--trace", action="store_true", help="start-up: print where the time goes")
    ap.add_argument(
        "--quick", action="store_true", help="throughput of the bare and source rows only, 600,000 rows"
    )
    args = ap.parse_args()
    if args.quick:
        args.rows, args.sections = min(args.rows, 600_000), "throughput"
    sections = set(args.sections.split(","))
    from cloudprofiler.spark_local import local_session
    from cp_source.reader.options import ReaderOptions, source_schema

    doc = run_head("readpath")
    with tempfile.TemporaryDirectory(prefix="readpath-") as tmp:
        work = Path(tmp)
        trace = None
        if args.trace:
            from cp_common.process_times import TRACE_ENV

            trace = str(work / "startup-trace.txt")
            os.environ[TRACE_ENV] = trace  # before the session: Spark's Python workers inherit it
        info = prefill(work / "spool", args.rows, args.rate)
        print(f"prefilled {info['rows']:,} rows in {info['segments']} segments ({info['fill_s']:.1f}s)")
        doc["spool"] = {**info, "rate": args.rate}
        files = export_rows(work / "spool", work, source_schema(ReaderOptions.parse({})))
        if "throughput" in sections:
            doc["python_side"] = python_side(work / "spool", files[0], info["rows"])
        conf = {
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
            # a Python worker started on a busy machine may take more than the default 15 s to connect
            "spark.python.authenticate.socketTimeout": "120s",
        }
        spark = local_session("readpath", conf=conf)
        spark.dataSource.register(BareArrowSource)
        try:
            if "throughput" in sections:
                doc["rows"] = measure(
                    spark, work, work / "spool", files, info["rows"], args.repeat, args.quick
                )
            if "startup" in sections:
                doc["startup"] = startup(spark, work, (files[0], info["rows"]), args.rounds, trace)
            if "floor" in sections:
                doc["floor"] = floor(spark, work, files[0], info["rows"], args.floor_seconds)
        finally:
            spark.stop()
    carry_over(doc, args.json)
    print_report(doc)
    write_json(args.json, doc, announce=True)
    return 0


def carry_over(doc: dict[str, Any], path: str) -> None:
    """The sections this run did not measure, kept from the result file it replaces (marked so)."""
    import orjson

    old = Path(path)
    if not old.exists():
        return
    prev = orjson.loads(old.read_bytes())
    kept = [k for k in ("startup", "floor") if k not in doc and k in prev]
    for k in kept:
        doc[k] = prev[k]
    if kept:
        doc["carried_over"] = {"sections": kept, "argv": prev.get("argv"), "spool": prev.get("spool")}


def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(width=130)
    n = doc["spool"]["rows"]
    if "rows" in doc:
        cols = ["path", "M rows/s", "wall s", "batches", "load", "of bare"]
        spool = doc["spool"]
        title = (
            f"read path, {n:,} YSB rows in {spool['segments']} segments "
            f"({spool['segment_rows_mean']:,.0f} rows each, "
            f"filled at {spool.get('rate', 250_000):,.0f} tuples/s "
            "by 2 workers), local[2], availableNow -> noop"
        )
        console.print(make_table(title, cols, table_rows(doc["rows"])))
        console.print(goal_line(doc["rows"]))
    if "python_side" in doc:
        ps = doc["python_side"]
        stages = [
            ("bare source: memory-map, 65,536-row slices", "bare_read"),
            ("ours: load and check each segment", "load_check"),
            ("ours: join into large batches", "coalesce"),
            ("ours: source stamp and cast", "stamp_cast"),
        ]
        rows = [[label, f"{ps[k] * 1000:.1f}"] for label, k in stages]
        title = (
            f"Python side of read(), in-process ({ps['batches_in']} segment batches -> {ps['batches_out']})"
        )
        console.print(make_table(title, ["stage", "CPU ms per M rows"], rows))
    if "startup" in doc:
        rows = [
            [
                str(r["round"]),
                f"{r.get('load_average', 0):.1f}",
                f"{r['rate_first_rows_s']:.2f}",
                f"{r.get('bare_first_rows_s', float('nan')):.2f}",
                f"{r['ours_factory_ready_s']:.2f}",
                f"{r['ours_first_rows_s']:.2f}",
                f"{r['ours_first_rows_s'] - r['rate_first_rows_s']:+.2f}",
            ]
            for r in doc["startup"]
        ]
        cols = [
            "round",
            "load",
            "rate: first rows s",
            "bare DataSource: first rows s",
            "ours: wait_for_factory s",
            "ours: first rows s",
            "ours - rate",
        ]
        console.print(make_table("start() to the first micro-batch with rows", cols, rows))
    if "floor" in doc:
        keys = ["latestOffset", "queryPlanning", "addBatch", "commitOffsets", "walCommit", "triggerExecution"]
        rows = [
            [r["path"], str(r["batches"]), *[f"{r.get('median_ms', {}).get(k, 0):.0f}" for k in keys]]
            for r in doc["floor"]
        ]
        console.print(
            make_table(
                "per-batch floor, median ms of the batches with rows", ["path", "batches", *keys], rows
            )
        )


if __name__ == "__main__":
    sys.exit(main())
