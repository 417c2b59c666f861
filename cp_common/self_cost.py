"""The profiler's own CPU on a query's path, per query, from the executors' thread CPU clocks.

A probe that changes what it measures must say by how much. The profiler's code on the path
runs in Spark's Python workers: the sink's ``write`` (the batches it receives included), each
user stamp point (a ``mapInArrow`` stage of its own: its input and output batches included)
and the source's ``read`` (segments loaded and stamped). Each measures the thread CPU time of
its whole partition (``time.thread_time_ns`` at its start and end: two clock reads per
partition, nothing per tuple) and adds it to this process's totals for the task's query.

At the end of each partition a process writes its cumulative totals for that query into a
ledger on the node (one small file per process and query, ``ledger_dir()``): a process only
ever overwrites its own file, so no lock is needed, and the files' sum is the query's cost on
that node whenever it is read. :func:`query_cost` sums them; :class:`TreeCpu` gives the whole
run's CPU (this process and every descendant: Spark's JVM, its Python workers, factories,
generators) to compare with. Both are of this node: a query whose executors run elsewhere
leaves its ledger there (its cost reads as nil here, which :func:`share_line` says).
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cp_common.process_times import process_cpu_seconds, process_start_ticks

PARTS = ("sink_write", "stamps", "source_read")
SINK_WRITE, STAMPS, SOURCE_READ = range(3)
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's local property on every task of a streaming query
LEDGER_ENV = "CLOUDPROFILER_COST_DIR"
_RECORD = struct.Struct("<4q")  # ns per part, tuples through the sink
T = TypeVar("T")

# this process's cumulative totals per query id: [sink_write ns, stamps ns, source_read ns, tuples]
_totals: dict[str, list[int]] = {}


def ledger_dir() -> Path:
    """The node's ledger: ``$CLOUDPROFILER_COST_DIR``, or a per-user directory in the temp dir."""
    given = os.environ.get(LEDGER_ENV)
    return Path(given) if given else Path(tempfile.gettempdir()) / f"cloudprofiler-cost-{os.getuid()}"


def task_query_id() -> str | None:
    """The streaming query of the task this worker runs (None outside a streaming query's task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return None if ctx is None else ctx.getLocalProperty(QUERY_ID_PROPERTY) or None


def charge(query_id: str | None, part: int, ns: int, tuples: int = 0) -> None:
    """Add one partition's thread CPU of ``part`` (and, for the sink, its tuples) and write this
    process's totals for the query to the ledger. Never raises: a diagnostic never fails the path."""
    if query_id is None:
        return
    row = _totals.setdefault(query_id, [0, 0, 0, 0])
    row[part] += max(0, ns)
    row[3] += tuples
    try:
        d = ledger_dir() / query_id
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        pid = os.getpid()
        fd = os.open(d / f"{pid}-{process_start_ticks(pid) or 0}", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, _RECORD.pack(*row), 0)
        finally:
            os.close(fd)
    except OSError:
        pass


def charged(batches: Iterator[T], part: int) -> Iterator[T]:
    """``batches`` passed on, the thread CPU from the first to the last (what the worker does with
    each batch in between, its serialization, included) charged to ``part`` of the task's query."""
    query_id = task_query_id()
    t0 = time.thread_time_ns()
    try:
        yield from batches
    finally:
        charge(query_id, part, time.thread_time_ns() - t0)


@dataclass
class QueryCost:
    """The profiler's CPU on one query's path on this node, summed over the processes that ran it."""

    ns: dict[str, int]
    tuples: int  # through the sink's write
    processes: int

    @property
    def profiler_ns(self) -> int:
        """The stamps and the sink: what a query into another sink would not run."""
        return self.ns["sink_write"] + self.ns["stamps"]

    def __add__(self, other: QueryCost) -> QueryCost:
        ns = {p: self.ns[p] + other.ns[p] for p in PARTS}
        return QueryCost(ns, self.tuples + other.tuples, self.processes + other.processes)


def query_cost(query_id: str, remove: bool = False) -> QueryCost:
    """Sum the ledger of ``query_id`` on this node (``remove``: delete it once read)."""
    d = ledger_dir() / query_id
    total = [0, 0, 0, 0]
    files = sorted(d.iterdir()) if d.is_dir() else []
    for f in files:
        raw = f.read_bytes()
        if len(raw) == _RECORD.size:  # a file being created this instant is not yet a record
            total = [a + b for a, b in zip(total, _RECORD.unpack(raw), strict=True)]
        if remove:
            f.unlink(missing_ok=True)
    if remove and d.is_dir():
        d.rmdir()
    return QueryCost(dict(zip(PARTS, total[:3], strict=True)), total[3], len(files))


class TreeCpu:
    """CPU seconds of this process and its descendants between ``start()`` and ``stop()``.

    A sampler thread reads /proc every ``period`` s, so a process that exits in between (a
    generator, a factory) keeps its CPU up to its last sample: at most one period of it is missed.
    """

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self._first: dict[tuple[int, int], float] = {}
        self._last: dict[tuple[int, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-cpu", daemon=True)

    def _sample(self, first: bool = False) -> None:
        for pid in _descendants(os.getpid()):
            cpu = process_cpu_seconds(pid)
            if cpu is None:
                continue
            key = (pid, process_start_ticks(pid) or 0)
            # a process started since the first sample counts from its start
            self._first.setdefault(key, cpu if first else 0.0)
            self._last[key] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def start(self) -> TreeCpu:
        """Take the first sample (what each process spent before it is not counted) and go on."""
        self._sample(first=True)
        self._thread.start()
        return self

    def stop(self) -> float:
        """The CPU seconds spent since ``start()`` by every process seen."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return sum(self._last[k] - self._first[k] for k in self._last)


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cost_doc(cost: QueryCost, run_cpu_s: float) -> dict[str, Any]:
    """The figures of a run: the profiler's CPU (stamps and sink), the source's read, the run's CPU."""
    run_ns = run_cpu_s * 1e9
    return {
        "run_cpu_s": round(run_cpu_s, 3),
        "profiler_cpu_s": round(cost.profiler_ns / 1e9, 3),
        "parts_cpu_s": {p: round(v / 1e9, 3) for p, v in cost.ns.items()},
        "profiler_share": cost.profiler_ns / run_ns if run_ns > 0 else None,
        "source_read_share": cost.ns["source_read"] / run_ns if run_ns > 0 else None,
        "tuples": cost.tuples,
        "ns_per_tuple": cost.profiler_ns / cost.tuples if cost.tuples else None,
        "processes": cost.processes,
    }


def share_line(doc: dict[str, Any] | None) -> str:
    """One line: "the profiler used X% of the run's CPU (Y ns per tuple)", and what it leaves out."""
    if not doc:
        return "the profiler's own CPU was not measured in this run"
    if not doc["processes"] or doc["profiler_share"] is None:
        return (
            "the profiler's own CPU: no ledger on this node (executors elsewhere?), "
            f"run CPU {doc['run_cpu_s']:.1f} s"
        )
    per = "-" if doc["ns_per_tuple"] is None else f"{doc['ns_per_tuple']:,.0f}"
    return (
        f"the profiler used {doc['profiler_share']:.1%} of the run's CPU ({per} ns per tuple: stamps "
        f"{doc['parts_cpu_s']['stamps']:.2f} s + sink {doc['parts_cpu_s']['sink_write']:.2f} s of "
        f"{doc['run_cpu_s']:.1f} s, {doc['tuples']:,} tuples); the source's read, its stamp included, "
        f"{doc['source_read_share']:.1%}"
    )
