"""Sync tables: one Parquet row per MinRTT probe, every probe kept.

Columns: phase, round (probe index within its run), initiator and responder
domain ids, c_i (send, initiator's domain), c_j (receipt, responder's domain),
c_k (return, initiator's domain), ns_i (initiator's CLOCK_MONOTONIC_RAW ns at
send, for frequencies). File metadata ``cp_sync.domains`` holds each domain's
reported frequency (Hz) as JSON.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from cp_store.location import Location, resolve
from cp_store.tables import files_under, missing, read_schema, write_parquet

SCHEMA = pa.schema(
    [
        ("phase", pa.string()),
        ("round", pa.int32()),
        ("initiator", pa.string()),
        ("responder", pa.string()),
        ("c_i", pa.int64()),
        ("c_j", pa.int64()),
        ("c_k", pa.int64()),
        ("ns_i", pa.int64()),
    ]
)
_META_KEY = b"cp_sync.domains"
MAX_ROWS_PER_PAIR = 1_000_000


def probes_table(
    phase: str,
    initiator: str,
    responder: str,
    c_i: np.ndarray,
    c_j: np.ndarray,
    c_k: np.ndarray,
    ns_i: np.ndarray,
    rounds: np.ndarray | None = None,
) -> pa.Table:
    """One pair's probes as a table with the sync schema."""
    n = len(c_i)
    return pa.table(
        {
            "phase": pa.array([phase] * n, pa.string()),
            "round": pa.array(np.arange(n, dtype=np.int32) if rounds is None else rounds, pa.int32()),
            "initiator": pa.array([initiator] * n, pa.string()),
            "responder": pa.array([responder] * n, pa.string()),
            "c_i": pa.array(c_i, pa.int64()),
            "c_j": pa.array(c_j, pa.int64()),
            "c_k": pa.array(c_k, pa.int64()),
            "ns_i": pa.array(ns_i, pa.int64()),
        },
        schema=SCHEMA,
    )


def write_sync(
    out_dir: str | os.PathLike[str] | Location,
    phase: str,
    tables: Iterable[pa.Table],
    domains_hz: Mapping[str, float],
) -> Location:
    """Write one phase's probes to ``out_dir/sync-<phase>-<ns>.parquet``; returns its location.

    ``out_dir`` is a path or URI. The file appears whole or not at all (a rename locally, one upload
    on an object store): a reader never sees part of a phase.
    """
    out = resolve(out_dir)
    tabs = [t.cast(SCHEMA) for t in tables]
    table = pa.concat_tables(tabs) if tabs else SCHEMA.empty_table()
    table = table.replace_schema_metadata({_META_KEY: orjson.dumps(dict(domains_hz))})
    path = out.join(f"sync-{phase}-{time.time_ns()}.parquet")
    write_parquet(table, path)
    return path


def sync_files(sync_dir: str | os.PathLike[str] | Location) -> list[Location]:
    """The sync tables directly under ``sync_dir`` (names starting with ``_`` or ``.`` ignored)."""
    return files_under(resolve(sync_dir), recursive=False)


def read_sync(sync_dir: str | os.PathLike[str] | Location) -> tuple[pa.Table, dict[str, float]]:
    """All probes under ``sync_dir`` (a path or URI) and the domains' reported frequencies."""
    root = resolve(sync_dir)
    if not root.is_dir():
        raise ValueError(str(missing(root, "sync directory")))
    files = sync_files(root)
    if not files:
        raise ValueError(f"no sync tables (*.parquet) in {root.uri}")
    hz: dict[str, float] = {}
    for f in files:
        meta = read_schema(f).metadata or {}
        if _META_KEY in meta:
            hz.update({str(k): float(v) for k, v in orjson.loads(meta[_META_KEY]).items()})
    table = ds.dataset(
        [f.path for f in files], format="parquet", schema=SCHEMA, filesystem=root.fs
    ).to_table()
    return table, hz


def minrtt(table: pa.Table) -> pa.Table:
    """The probe with the smallest round trip per (phase, initiator, responder), with ``rtt``."""
    t = table.append_column("rtt", pc.subtract(table["c_k"], table["c_i"]))
    t = t.sort_by(
        [
            ("phase", "ascending"),
            ("initiator", "ascending"),
            ("responder", "ascending"),
            ("rtt", "ascending"),
            ("round", "ascending"),
        ]
    )
    keys = np.array(
        [
            f"{p}\x00{a}\x00{b}"
            for p, a, b in zip(
                t["phase"].to_pylist(), t["initiator"].to_pylist(), t["responder"].to_pylist(), strict=True
            )
        ]
    )
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    return t.filter(pa.array(first))


def phase_order(table: pa.Table) -> list[str]:
    """Phases in the order they were run (by their first send time)."""
    g = table.group_by("phase").aggregate([("ns_i", "min")]).sort_by("ns_i_min")
    return g["phase"].to_pylist()
