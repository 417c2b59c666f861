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

from bench_common import arg_parser, make_table, result_head, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: E402

# The bare source's partition/batch shapes: (partitions, rows per batch).
BARE_SHAPES = [(2, 65_536), (8, 65_536), (20, 10_000)]


# ---- the bare Python DataSource: the API's ceiling for the same Arrow data ----------------------
class RowRange(InputPartition):
    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


class BareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One micro-batch of every row of the file, split into ``partitions`` row ranges."""

    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.parts = int(options["partitions"])
        self.batch = int(options["batch"])
        self.rows = int(options["rows"])

    def initialOffset(self) -> dict:
        return {"v": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"v": 1}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[RowRange]:
        if start["v"] == end["v"]:
            return []
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
    from cp_source.factory import start_factory
    from cp_source.generator import run_generator
    from cp_source.spool import Spool

    t0 = time.monotonic()
    with start_factory("tcp://127.0.0.1:0", spool, workers=2, max_spool_bytes=8 << 30) as f:
        summary = run_generator(f.endpoint, rate, rows / rate, senders=2)
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
    from cp_source.spool import Spool, read_segment

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


def best_of(repeat: int, once: Callable[[], dict[str, Any]], rows: int, label: str) -> dict[str, Any]:
    """The fastest of ``repeat`` runs; every run must read exactly ``rows`` rows."""
    runs = []
    for _ in range(repeat):
        r = once()
        if r["rows"] != rows:
            raise RuntimeError(f"{label}: read {r['rows']} rows, expected {rows}")
        runs.append(r)
    best = max(runs, key=lambda r: r["mrows_s"])
    return {**best, "runs_mrows_s": [round(r["mrows_s"], 3) for r in runs]}


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


def measure(spark: Any, work: Path, spool: Path, info: dict[str, Any], repeat: int) -> list[dict[str, Any]]:
    """Every row of the table, in one session."""
    from cp_source.stream_reader import ReaderOptions, source_schema

    schema = source_schema(ReaderOptions.parse({}))
    arrow_path, pq_dir = export_rows(spool, work, schema)
    n = info["rows"]
    spark.dataSource.register(BareArrowSource)

    def bare(parts: int, batch: int) -> Callable[[], dict[str, Any]]:
        opts = {"path": arrow_path, "partitions": str(parts), "batch": str(batch), "rows": str(n)}
        return lambda: run_query(
            spark.readStream.schema(schema).format("bare_arrow").options(**opts).load(), work
        )

    def ours(fetch: str, sink: Callable[[Any], Any] | None = None) -> Callable[[], dict[str, Any]]:
        return lambda: run_query(ours_df(spark, fresh_copy(spool, work), fetch), work, sink)

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
        ("cloudprofiler source -> sink (null)", "ours+sink", ours("local", into_sink("null"))),
        ("cloudprofiler source -> sink (id)", "ours+sink", ours("local", into_sink("id"))),
    ]
    bare(2, 65_536)()  # warm-up: starts the Python workers, JIT-free paths imported
    ours("local")()
    rows = []
    for label, kind, once in cases:
        r = best_of(repeat, once, n, label)
        rows.append({"path": label, "kind": kind, **r})
        print(f"{label}: {r['mrows_s']:.2f} M rows/s (runs {r['runs_mrows_s']}), wall {r['wall_s']:.1f}s")
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    bare_best = max(r["mrows_s"] for r in rows if r["kind"] == "bare")
    out = []
    for r in rows:
        ratio = f"{r['mrows_s'] / bare_best:.0%}" if r["kind"].startswith("ours") else ""
        out.append([r["path"], f"{r['mrows_s']:.2f}", f"{r['wall_s']:.1f}", str(r["batches"]), ratio])
    return out


def main() -> int:
    ap = arg_parser(__doc__, "readpath")
    ap.add_argument("--rows", type=int, default=2_000_000, help="tuples prefilled (default 2,000,000)")
    ap.add_argument("--rate", type=float, default=250_000, help="generator rate for the prefill")
    ap.add_argument("--repeat", type=int, default=2, help="runs per row, best kept (default 2)")
    args = ap.parse_args()
    from rich.console import Console

    from cloudprofiler.spark_local import local_session

    with tempfile.TemporaryDirectory(prefix="readpath-") as tmp:
        work = Path(tmp)
        info = prefill(work / "spool", args.rows, args.rate)
        print(f"prefilled {info['rows']:,} rows in {info['segments']} segments ({info['fill_s']:.1f}s)")
        spark = local_session(
            "readpath", conf={"spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"}
        )
        try:
            rows = measure(spark, work, work / "spool", info, args.repeat)
        finally:
            spark.stop()
    cols = ["path", "M rows/s", "wall s", "batches", "of bare"]
    Console().print(
        make_table(
            f"read path, {info['rows']:,} YSB rows, local[2], availableNow -> noop", cols, table_rows(rows)
        )
    )
    doc = {**result_head("readpath"), "spool": info, "rows": rows, "argv": sys.argv[1:]}
    write_json(args.json, doc, announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
