"""A waterfall table and Spark's phases on one known clock, for the report's waterfall: the table in
the shape ``translate --waterfall`` writes, the phases through spark_phases' own placement."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

STAGES = [
    ("intended", "gen", "held or behind"),
    ("gen", "factory", "transport and parse"),
    ("factory", "planned", "waiting in the spool"),
    ("planned", "source", "task start and read"),
    ("source", "sink", "the query"),
    ("sink", "committed", "commit"),
]
# each stage's scale (ms): the spool's wait is the largest, the query's tail the longest
SCALES_MS = (0.2, 1.0, 60.0, 3.0, 25.0, 2.0)
WALL0_NS = 1_800_000_000_000_000_000  # the wall clock (ns since the epoch) at the run's start


def waterfall_table(
    ids: np.ndarray,
    t_s: np.ndarray,
    seed: int = 3,
    origin_tsc: int = 0,
    hz: float = 2.6e9,
    reference: str = "ref",
) -> pa.Table:
    """One row per record: each stage drawn (ns), the end to end their sum, a bound per record; the
    axis of ``t_s`` (``origin_tsc`` at ``hz`` in ``reference``) in the metadata."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    cols: dict[str, Any] = {"tuple_id": ids.astype(np.int64), "t_s": t_s.astype(np.float64)}
    stages = {}
    for (a, b, _), ms in zip(STAGES, SCALES_MS, strict=True):
        stages[f"stage_{a}_{b}"] = rng.exponential(ms * 1e6, n).astype(np.int64).astype(np.float64)
    cols["e2e_ns"] = np.sum(list(stages.values()), axis=0)
    cols["e2e_bound_ns"] = rng.uniform(1e3, 5e4, n)
    for name, ns in stages.items():
        cols[f"{name}_ns"] = ns
        cols[f"{name}_bound_ns"] = np.zeros(n) if name != "stage_intended_gen" else cols["e2e_bound_ns"]
    meta = {
        "stages": [{"from": a, "to": b, "label": label} for a, b, label in STAGES],
        "points": ["intended", "gen", "factory", "planned", "source", "sink", "committed"],
        "reference": reference,
        "origin_tsc": origin_tsc,
        "frequency_hz": hz,
        "notes": ["every record has every stage"],
    }
    table = pa.table(cols)
    return table.replace_schema_metadata({b"cloudprofiler.waterfall": json.dumps(meta).encode()})


def phase_table(
    origin_tsc: int, hz: float, node: str, starts_s: list[float], query_id: str = "q-latency"
) -> pa.Table:
    """Spark's phases of batches starting ``starts_s`` seconds after ``origin_tsc`` (on ``node``),
    placed by spark_phases itself from a wall-clock start and a pair; and one batch of another query."""
    from cloudprofiler.spark_phases import SCHEMA, BatchProgress, WallPair, phase_rows

    rows = []
    for q, starts in ((query_id, starts_s), ("q-other", [starts_s[0] + 0.2])):
        for b, s in enumerate(starts):
            wall = WALL0_NS + round(s * 1e9)
            pair = WallPair(origin_tsc + round((s + 0.3) * hz), wall + 300_000_000, 120)
            durations = {"triggerExecution": 400, "latestOffset": 20, "walCommit": 30, "getBatch": 5,
                         "queryPlanning": 15, "addBatch": 250, "commitOffsets": 40}  # fmt: skip
            batch = BatchProgress(q, q, "run-1", b, wall, durations, 100, pair)
            rows += phase_rows(batch, hz, node, 500)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def stages_of(table: pa.Table) -> list[tuple[str, str]]:
    """A waterfall table's stages, (from, to) in order, from its metadata."""
    from cp_sync.translate.waterfall import waterfall_meta

    return [(s["from"], s["to"]) for s in waterfall_meta(table)["stages"]]


def assert_stages_add_up(table: pa.Table) -> None:
    """Every record's stages sum to its end to end (to float rounding of the positions)."""
    total = np.zeros(table.num_rows)
    for a, b in stages_of(table):
        total += table[f"stage_{a}_{b}_ns"].to_numpy()
    e2e = table["e2e_ns"].to_numpy()
    assert table.num_rows and np.all(np.abs(total - e2e) <= 1e-9 * np.abs(e2e) + 1e-3)
