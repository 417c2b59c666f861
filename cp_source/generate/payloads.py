"""A sender's payloads: pools of pre-serialized full buckets, built before its emission loop starts.

Each sender builds a small pool of payloads (``bucket`` rows each, serialized by orjson) that the
loop reuses; the tuple ids and the event time live in the per-bucket header, so reusing payload rows
changes nothing the factory produces except the repeated field values.

The factory's frame cap: the answer to a sender's hello names the largest payload the factory
accepts; a sender whose pool holds a larger one raises ``BucketTooLarge`` before its first bucket.
"""

from __future__ import annotations

import math

import orjson

from cp_source.generate.hot_keys import KeySkew, Payloads, plan_skew, skewed_payloads
from cp_source.wire import bucket as bk
from cp_source.wire.workloads import file_lines, ysb_rows


def default_pool(bucket: int) -> int:
    """Payloads in a sender's pool: 2..16, about 64,000 rows."""
    return max(2, min(16, 64_000 // bucket))


def build_payloads(workload: str, bucket: int, seed: int = 0, pool: int | None = None) -> list[bytes]:
    """A pool of full-bucket NDJSON payloads for ``workload`` (``ysb`` or ``file:PATH``)."""
    if bucket < 1 or bucket > bk.DEFAULT_MAX_TUPLES:
        raise ValueError(f"bucket must be 1..{bk.DEFAULT_MAX_TUPLES} tuples, got {bucket}")
    n_pool = pool or default_pool(bucket)
    if workload == "ysb":
        lines = [orjson.dumps(r) for r in ysb_rows(bucket * n_pool, seed)]
    elif workload.startswith("file:"):
        src = file_lines(workload[5:])
        lines = [src[i % len(src)] for i in range(bucket * n_pool)]
    else:
        raise ValueError(f"unknown workload {workload!r}: expected ysb or file:PATH")
    return [b"\n".join(lines[k * bucket : (k + 1) * bucket]) + b"\n" for k in range(n_pool)]


def sender_payloads(
    workload: str, bucket: int, rate: float, tuples: int, seed: int, skew: KeySkew | None
) -> Payloads:
    """A sender's payloads: one pool, or with key skew one pool per hot-key configuration."""
    if skew is None:
        return Payloads([build_payloads(workload, bucket, seed=seed)], [])
    if workload != "ysb":
        raise ValueError(f"key skew needs the ysb workload (its campaigns and ads), not {workload!r}")
    return skewed_payloads(plan_skew(skew, rate, bucket, tuples, default_pool(bucket)), seed)


def partial_payload(payload: bytes, rows: int) -> bytes:
    """The first ``rows`` lines of a payload."""
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


class BucketTooLarge(ValueError):
    """A bucket's payload is larger than the factory accepts (its frame cap): nothing was sent."""


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
    fit = bucket * cap // biggest
    hint = f"use --bucket {fit} or smaller" if fit else "one tuple alone is over it"
    raise BucketTooLarge(
        f"a bucket of {bucket} tuples of {workload} is {biggest:,} bytes, over the factory's frame cap "
        f"of {cap:,} bytes (its --max-frame-bytes): nothing was sent; {hint}, or start the factory "
        "with a larger --max-frame-bytes"
    )
