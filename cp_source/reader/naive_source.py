"""The naive baseline: a Python DataSource that receives ZeroMQ and parses JSON row by row in ``read``.

This is the paper's unoptimised ingestion path, kept as the comparison for
``benchmarks/endtoend.py``: no factory, no spool, no Arrow. The driver-side
reader binds a PULL socket; each time Spark asks for the latest offset it
drains what has arrived (raw buckets, at most ``maxRowsPerRead`` rows, the
reader's default read limit; a trigger that asks for everything available
drains until the socket is empty), and
hands the buckets to the executors inside the partitions; ``read`` on the
executor parses every line with ``orjson.loads`` and yields one Python tuple
per row, which Spark then converts itself.

It accepts the generator's buckets (``cp_source.wire.bucket`` header + NDJSON
payload), so it takes exactly the same load as the cloudprofiler source.
Malformed messages are counted and skipped. Buckets are kept in the driver's
memory only until Spark commits their batch, and a restarted query cannot
replay them: use it for measurement, not for production.

    spark.dataSource.register(NaiveZmqDataSource)
    spark.readStream.format("cp_naive_zmq").option("stateFile", "/tmp/naive.json").load()
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from cp_common.options import check_names, int_option, lower_keys
from cp_common.stamp_columns import GEN, SOURCE, node_column, tsc_column
from cp_source.wire.workloads import YSB_FIELDS

SCHEMA = ", ".join(
    [
        *(f"{f} STRING" for f in YSB_FIELDS),
        "event_time TIMESTAMP",
        "tuple_id BIGINT",
        "sender_id INT",
        *(f"{tsc_column(p)} BIGINT, {node_column(p)} STRING" for p in (GEN, SOURCE)),
    ]
)
DEFAULT_MAX_ROWS = 1_000_000
NAIVE_OPTIONS = ("endpoint", "stateFile", "maxRowsPerRead", "partitions")
RCV_HWM = 16  # as the factory's front socket: a slow reader fills the queues back to the generator
UTC = dt.UTC


class NaiveZmqDataSource(DataSource):
    """``spark.readStream.format("cp_naive_zmq")``: ZeroMQ + per-row JSON in ``read`` (the baseline)."""

    @classmethod
    def name(cls) -> str:
        return "cp_naive_zmq"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> NaiveZmqReader:
        return NaiveZmqReader(dict(self.options))


@dataclass
class BucketsPartition(InputPartition):
    """Raw buckets (header fields and NDJSON payload) for one executor task."""

    buckets: list[tuple[int, int, int, str, int, bytes]]  # first_id, sender, tsc, domain, wall_ns, payload


class NaiveZmqReader(DataSourceStreamReader):
    """Binds on first use in the driver-side runner; ``latestOffset`` drains the socket."""

    def __init__(self, options: dict[str, str]) -> None:
        check_names(options, NAIVE_OPTIONS, "the cp_naive_zmq source")
        opts = lower_keys(options)
        self.endpoint = opts.get("endpoint", "tcp://127.0.0.1:0")
        self.state_file = opts.get("statefile")
        self.max_rows = int_option(opts, "maxRowsPerRead", DEFAULT_MAX_ROWS, 1, 10_000_000)
        self.n_partitions = int_option(opts, "partitions", 2, 1, 256)
        self._sock: Any = None
        self._pending: dict[int, list[tuple[int, int, int, str, int, bytes]]] = {}  # batch end -> buckets
        self._received = 0
        self.rejected = 0

    def _socket(self) -> Any:
        if self._sock is None:
            import zmq

            ctx: zmq.SyncContext = zmq.Context.instance()
            s = ctx.socket(zmq.ROUTER)  # generators say hello and wait for acknowledgements
            s.setsockopt(zmq.RCVHWM, RCV_HWM)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.MAXMSGSIZE, 256 << 20)  # bounded like the factory's front socket
            ep = self.endpoint
            s.bind(ep[:-2] + ":*" if ep.endswith(":0") else ep)
            self._sock = s
            if self.state_file:
                import orjson

                from cp_store.atomic_files import atomic_write

                # a fresh temp name: a symlink planted at a fixed one is never followed
                body = {"endpoint": s.getsockopt_string(zmq.LAST_ENDPOINT), "pid": os.getpid()}
                atomic_write(self.state_file, orjson.dumps(body))
        return self._sock

    def initialOffset(self) -> dict:
        self._socket()
        return {"rows": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Drain the socket: up to the limit's rows, or until it is empty (``ReadAllAvailable``).

        ``start`` is not needed: the offset counts rows received, and buckets are kept only until
        their batch commits.
        """
        import zmq

        from cp_source.wire.bucket import KIND_DATA, KIND_EOS, KIND_HELLO, BucketError, parse_header
        from cp_source.wire.sender_link import answer_control

        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        sock = self._socket()
        got: list[tuple[int, int, int, str, int, bytes]] = []
        rows = 0
        while max_rows is None or rows < max_rows:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 3:  # identity, header, payload
                self.rejected += 1
                continue
            try:
                h = parse_header(frames[1])
            except BucketError:
                self.rejected += 1
                continue
            if h.kind in (KIND_HELLO, KIND_EOS):
                answer_control(sock, frames[0], h)
            if h.kind != KIND_DATA:
                continue
            got.append((h.first_id, h.sender_id, h.tsc, h.domain, h.wall_ns, frames[2]))
            rows += h.count
        if got:
            self._received += rows
            self._pending[self._received] = got
        return {"rows": self._received}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        lo, hi = start["rows"], end["rows"]
        buckets = [b for e, bs in sorted(self._pending.items()) if lo < e <= hi for b in bs]
        if end["rows"] > start["rows"] and not buckets:
            raise RuntimeError("cp_naive_zmq cannot replay a batch: it keeps nothing once committed")
        n = self.n_partitions
        return [BucketsPartition(buckets[i::n]) for i in range(n) if buckets[i::n]]

    def read(self, partition: BucketsPartition) -> Iterator[tuple]:  # type: ignore[override]
        import orjson

        import native_tsc

        node = native_tsc.domain_id()
        for first_id, sender, gen_tsc, domain, wall_ns, payload in partition.buckets:
            event_time = dt.datetime.fromtimestamp(wall_ns // 1_000_000 / 1000, UTC)
            tsc = native_tsc.now()
            rows = []
            try:
                for i, line in enumerate(payload.splitlines()):
                    d = orjson.loads(line)  # the per-row parse this baseline stands for
                    rows.append(
                        (
                            d["user_id"],
                            d["page_id"],
                            d["ad_id"],
                            d["ad_type"],
                            d["event_type"],
                            d["ip_address"],
                            event_time,
                            first_id + i,
                            sender,
                            gen_tsc,
                            domain,
                            tsc,
                            node,
                        )
                    )
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a malformed bucket is skipped whole
            yield from rows

    def commit(self, end: dict) -> None:
        for e in [e for e in self._pending if e <= end["rows"]]:
            del self._pending[e]

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
