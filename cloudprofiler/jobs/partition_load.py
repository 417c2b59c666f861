"""Per-partition load of a query from the sink's records: rows, source-to-sink time, imbalance, hot keys.

Each micro-batch's sink tasks are its partitions (after a shuffle by key, a partition holds the
keys that hash to it). From what the cloudprofiler sink published (``cp_sink.read_counts``: rows per
batch and partition; ``cp_sink.read_records``: per tuple the ``source`` and ``sink`` TSC stamps):

* per batch and partition: ``rows`` (the tuples the sink saw) and ``ms``, the time from the
  partition's earliest source stamp to its latest sink stamp (both in one TSC domain);
* per batch: ``duration_ms`` (the slowest partition's ``ms``), ``rows_imbalance`` and
  ``ms_imbalance`` (max over mean across the batch's partitions, 1.0 when balanced), the
  ``heaviest`` (most rows) and ``slowest`` partitions and, given each tuple's key, the keys that
  dominate them (rows and share of the partition);
* over the run: the p50/p99 of ``duration_ms``, the mean and max imbalance, and ``hot_keys``: keys
  that hold at least ``min_share`` of the heaviest partition of some batch (what
  ``cloudprofiler.windows.skew.salted_aggregate`` takes as ``hot_keys``).

The records carry tuple ids, not keys: ``keys`` is a table of ``tuple_id`` and one key column,
e.g. :func:`generator_keys` (each tuple's campaign, exact, from the generator's summary).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pyarrow as pa

import native_tsc
from cp_common.faces import deprecated_names
from cp_common.stamp_columns import SINK, SOURCE, node_column, tsc_column
from cp_sink import read_counts, read_records


def generator_keys(summary: dict[str, Any], key: str = "campaign_id") -> pa.Table:
    """``tuple_id`` and the campaign (``key="campaign_id"``) or ad (``"ad_id"``) of every tuple a YSB
    generator run assigned an id to, from its summary: exact, the senders' own seeded draws."""
    from cp_source.generate.hot_keys import expected_ads, parse_key_skew
    from cp_source.generate.payloads import default_pool
    from cp_source.wire.workloads import ADS_PER_CAMPAIGN, campaigns_table, ysb_rows

    if summary.get("workload") != "ysb":
        raise ValueError(f"generator keys need a ysb run, not {summary.get('workload')!r}")
    if key not in ("campaign_id", "ad_id"):
        raise ValueError(f"key must be campaign_id or ad_id, got {key!r}")
    camp = campaigns_table()
    names = np.array(camp.column(key).to_pylist(), dtype=object)
    ad_index = {a: i for i, a in enumerate(camp.column("ad_id").to_pylist())}
    b, per_rate = int(summary["bucket"]), summary["target_rate"] / len(summary["senders"])
    ids, ads = [], []
    for s in summary["senders"]:
        n = int(s["next_tuple_id"]) - int(s["first_tuple_id"])
        if summary.get("key_skew"):
            skew = parse_key_skew(summary["key_skew"], summary["skew_keys"], summary["hot_key_rotate_s"])
            a = expected_ads(skew, int(s["id"]), per_rate, b, n, default_pool(b))
        else:  # the unskewed pool: payload k is pool[k % pool size], seeded with the sender id
            rows = ysb_rows(b * default_pool(b), int(s["id"]))
            pool_ads = np.array([ad_index[r["ad_id"]] for r in rows], dtype=np.int64)
            t = np.arange(n, dtype=np.int64)
            a = pool_ads[((t // b) % default_pool(b)) * b + t % b]
        ids.append(np.arange(int(s["first_tuple_id"]), int(s["next_tuple_id"]), dtype=np.int64))
        ads.append(a)
    all_ads = np.concatenate(ads) if ads else np.zeros(0, np.int64)
    values = names[all_ads] if key == "ad_id" else names[all_ads // ADS_PER_CAMPAIGN * ADS_PER_CAMPAIGN]
    return pa.table({"tuple_id": np.concatenate(ids) if ids else np.zeros(0, np.int64), key: values.tolist()})


def _top_keys(ids: np.ndarray, keys: pa.Table | None, top: int) -> list[list[Any]]:
    """[key, rows, share] of the ``top`` most frequent keys among ``ids``."""
    if keys is None or not len(ids):
        return []
    kid = keys.column("tuple_id").to_numpy()
    order = np.argsort(kid, kind="stable")
    pos = np.searchsorted(kid, ids, sorter=order)
    pos = np.minimum(pos, len(kid) - 1)
    found = kid[order[pos]] == ids
    if not found.all():
        raise ValueError(f"{int((~found).sum())} tuple ids of the records are not in the keys table")
    vals = np.array(keys.column(1).to_pylist(), dtype=object)[order[pos]]
    uniq, counts = np.unique(vals.astype(str), return_counts=True)
    best = np.lexsort((uniq, -counts))[:top]
    return [[str(uniq[i]), int(counts[i]), float(counts[i] / len(ids))] for i in best]


def _ratio(v: np.ndarray) -> float:
    m = float(v.mean()) if len(v) else 0.0
    return float(v.max()) / m if m > 0 else 1.0


def _batch(
    bid: int, counts: pa.Table, rec: dict[str, np.ndarray], keys: pa.Table | None, top: int, to_ms: float
) -> dict[str, Any]:
    """One micro-batch's partitions: rows, source-to-sink ms, imbalance, heaviest and slowest."""
    parts = sorted(set(counts["partition"].to_pylist()))
    seen = counts["seen"].to_numpy()
    rows = np.array([int(seen[np.asarray(counts["partition"]) == p].sum()) for p in parts], dtype=np.int64)
    mine = rec["batch_id"] == bid
    ms = np.zeros(len(parts))
    for i, p in enumerate(parts):
        sel = mine & (rec["partition"] == p)
        if sel.any():
            ms[i] = (int(rec["sink"][sel].max()) - int(rec["source"][sel].min())) * to_ms
    heavy, slow = int(np.argmax(rows)), int(np.argmax(ms))
    ids_of = {i: rec["tuple_id"][mine & (rec["partition"] == parts[i])] for i in {heavy, slow}}
    return {
        "batch_id": bid,
        "partitions": [
            {"partition": p, "rows": int(r), "ms": float(m)} for p, r, m in zip(parts, rows, ms, strict=True)
        ],
        "rows": int(rows.sum()),
        "duration_ms": float(ms.max()) if len(ms) else 0.0,
        "rows_imbalance": _ratio(rows),
        "ms_imbalance": _ratio(ms),
        "heaviest": {"partition": parts[heavy], "keys": _top_keys(ids_of[heavy], keys, top)},
        "slowest": {"partition": parts[slow], "keys": _top_keys(ids_of[slow], keys, top)},
    }


def partition_load(
    path: str | os.PathLike[str],
    keys: pa.Table | None = None,
    top: int = 5,
    min_share: float = 0.2,
    hz: float | None = None,
) -> dict[str, Any]:
    """The load report of the sink output at ``path`` (see the module docstring); JSON-ready.

    ``keys``: ``tuple_id`` and a key column (None: no keys); ``hz``: the TSC frequency (default this
    machine's). Needs the identity handler's records (every tuple) with source and sink stamps in
    one TSC domain; raises ValueError naming what is missing otherwise."""
    if keys is not None and (keys.num_columns != 2 or "tuple_id" not in keys.column_names):
        raise ValueError(f"keys must have two columns, tuple_id and the key; got {keys.column_names}")
    counts, recs = read_counts(path), read_records(path)
    src, snk = tsc_column(SOURCE), tsc_column(SINK)
    for c in (src, snk):
        if c not in recs.column_names:
            raise ValueError(f"the records at {path} have no {c} column: the query must keep it")
    nodes: set[str] = set()
    for c in (node_column(SOURCE), node_column(SINK)):
        if c in recs.column_names:
            nodes |= set(recs.column(c).unique().to_pylist())
    if len(nodes) > 1:
        raise ValueError(f"source and sink stamps come from {len(nodes)} TSC domains: translate them first")
    to_ms = 1000.0 / (hz or native_tsc.frequency_hz())
    rec = {
        "batch_id": recs["batch_id"].to_numpy(),
        "partition": recs["partition"].to_numpy(),
        "tuple_id": recs["tuple_id"].to_numpy(),
        "source": recs[src].to_numpy(),
        "sink": recs[snk].to_numpy(),
    }
    bids = counts["batch_id"].to_numpy()
    batches = [
        _batch(int(b), counts.filter(pa.array(bids == b)), rec, keys, top, to_ms)
        for b in sorted(set(bids.tolist()))
        if int(counts.filter(pa.array(bids == b))["seen"].to_numpy().sum())
    ]
    dur = np.array([b["duration_ms"] for b in batches])
    imb = np.array([b["rows_imbalance"] for b in batches])
    hot: list[str] = []
    for b in batches:
        for k, _, share in b["heaviest"]["keys"]:
            if share >= min_share and k not in hot:
                hot.append(k)
    return {
        "batches": batches,
        "p50_duration_ms": float(np.percentile(dur, 50)) if len(dur) else math.nan,
        "p99_duration_ms": float(np.percentile(dur, 99)) if len(dur) else math.nan,
        "mean_rows_imbalance": float(imb.mean()) if len(imb) else math.nan,
        "max_rows_imbalance": float(imb.max()) if len(imb) else math.nan,
        "hot_keys": hot,
    }


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["generator_keys", "partition_load"])
