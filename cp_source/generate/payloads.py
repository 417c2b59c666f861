"""A sender's payloads: pools of pre-serialized full buckets, built before its emission loop starts.

Each sender builds a small pool of payloads (``bucket`` rows each, serialized by orjson) that the
loop reuses; the tuple ids and the event time live in the per-bucket header, so reusing payload rows
changes nothing the factory produces except the repeated field values.

A file workload's pool is its kept lines once plus the lines that wrap around (``file_pool``), bounded
in bytes: a sender of a file uses :func:`file_payloads` on the lines checked before the run.
A Parquet file's pool is one cycle of every row in Arrow IPC payloads, no more than the run sends
(``cp_source.wire.ipc_payload.parquet_payloads``), all serialized before the first bucket.

The factory's frame cap: the answer to a sender's hello names the largest payload the factory
accepts; a sender whose pool holds a larger one raises ``BucketTooLarge`` before its first bucket
(``frame_cap``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import orjson

from cp_common.faces import deprecated_names
from cp_source.generate.file_check import FileLines, check_file, file_path
from cp_source.generate.file_pool import FileBuckets
from cp_source.generate.frame_cap import BucketTooLarge, bucket_too_large
from cp_source.generate.hot_keys import KeySkew, Payloads, plan_skew, skewed_payloads
from cp_source.wire import bucket as bk
from cp_source.wire.ipc_payload import CONTINUATION as IPC_STREAM
from cp_source.wire.ipc_payload import head as ipc_head
from cp_source.wire.ipc_payload import parquet_payloads
from cp_source.wire.workloads import ysb_rows

__all__ = ["BucketTooLarge", "build_payloads", "check_fits", "file_payloads", "sender_payloads"]


def default_pool(bucket: int) -> int:
    """Payloads in a sender's pool: 2..16, about 64,000 rows."""
    return max(2, min(16, 64_000 // bucket))


def build_payloads(
    workload: str, bucket: int, seed: int = 0, pool: int | None = None, tuples: int | None = None
) -> Sequence[bytes | memoryview]:
    """A pool of full-bucket payloads for ``workload`` (``ysb``, ``file:PATH`` or ``parquet:PATH``).

    ``pool``: payloads in a ysb pool (None: :func:`default_pool`). A file's pool is its distinct
    buckets (:func:`file_payloads`; its lines checked to be JSON objects only, without a schema); a
    Parquet file's, every row of it cycled (``parquet_payloads``), no more buckets than ``tuples``
    (the run's, None: a whole cycle) fill."""
    if bucket < 1 or bucket > bk.DEFAULT_MAX_TUPLES:
        raise ValueError(f"bucket must be 1..{bk.DEFAULT_MAX_TUPLES} tuples, got {bucket}")
    n_pool = pool or default_pool(bucket)
    path = file_path(workload)
    if path is not None:
        return file_payloads(check_file(path, None), bucket)
    if workload.startswith("parquet:"):  # Arrow IPC payloads of the file's rows (cp_source.wire.ipc_payload)
        return parquet_payloads(workload, bucket, None if tuples is None else -(-tuples // bucket))
    if workload == "ysb":
        lines = [orjson.dumps(r) for r in ysb_rows(bucket * n_pool, seed)]
    else:
        raise ValueError(f"unknown workload {workload!r}: expected ysb or file:PATH")
    return [b"\n".join(lines[k * bucket : (k + 1) * bucket]) + b"\n" for k in range(n_pool)]


def file_payloads(lines: FileLines, bucket: int) -> FileBuckets:
    """The pool of a file's kept lines replayed cyclically in buckets of ``bucket``: bucket k of a
    sender is ``pool[k % len(pool)]`` (``cp_source.generate.file_pool``)."""
    return FileBuckets(lines.lines, bucket)


def sender_payloads(
    workload: str, bucket: int, rate: float, tuples: int, seed: int, skew: KeySkew | None
) -> Payloads:
    """A sender's payloads: one pool, or with key skew one pool per hot-key configuration."""
    if skew is None:
        return Payloads([build_payloads(workload, bucket, seed=seed, tuples=tuples)], [])
    if workload != "ysb":
        raise ValueError(f"key skew needs the ysb workload (its campaigns and ads), not {workload!r}")
    return skewed_payloads(plan_skew(skew, rate, bucket, tuples, default_pool(bucket)), seed)


def partial_payload(payload: bytes | memoryview, rows: int) -> bytes:
    """The first ``rows`` lines of a payload."""
    payload = bytes(payload)  # once per run: a file pool's payloads are views
    if payload.startswith(IPC_STREAM):  # parquet:PATH
        return ipc_head(payload, rows)
    pos = 0
    for _ in range(rows):
        pos = payload.index(b"\n", pos) + 1
    return payload[:pos]


def bucket_shape(payloads: Payloads, bucket: int, tuples: int) -> tuple[int, int, bytes]:
    """Buckets for ``tuples``, the rows of the last one, and its payload when it is partial (else b"")."""
    n_buckets = math.ceil(tuples / bucket)
    last_rows = tuples - (n_buckets - 1) * bucket if n_buckets else 0
    partial = partial_payload(payloads.payload(n_buckets - 1), last_rows) if 0 < last_rows < bucket else b""
    return n_buckets, last_rows, partial


def check_fits(payloads: Payloads, bucket: int, workload: str, cap: int | None) -> None:
    """BucketTooLarge, naming the size and the cap, when a payload is over the factory's frame cap.

    ``cap`` is what the factory's answer to the hello said (None: an older factory said nothing).
    A run's last bucket may be partial: a prefix of a full one, never larger.
    """
    if cap is None:
        return
    biggest = max(len(p) for pool in payloads.pools for p in pool)
    if biggest <= cap:
        return
    raise bucket_too_large(bucket, workload, biggest, cap)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["default_pool"])
