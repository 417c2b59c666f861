"""A demo-shaped run written without Spark: synthetic stamps on virtual domains, real sync tables and
the real commit protocol, so the demo's report can be checked against a known truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

HZ = 2.6e9
T0 = 10**13  # raw counter at the first sync phase
START = T0 + int(HZ)  # the queries start: time zero of every plot
MEASURED = START + int(33 * HZ)  # the measured run begins: the warm-up band ends here
WARM_IDS, RUN_IDS = (1000, 1200), (0, 500)  # the measured run numbered lower, as the demo may


def write_run(
    tmp_path: Path, run: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[Path, Path, Path, Any, Any]:
    """A demo-shaped run: a simulated generator node, source, sink and window stamps on the reference
    node; a warm-up of slow records (up to 29.5 s), then a measured run of fast ones; sync throughout.

    ``run``: the measured run's 500 records instead, as their gen and sink times in seconds since it
    began (default: over 4 s, each done 1 to 50 ms after its gen stamp)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from cp_sync.compare.synthetic import synth_phases
    from cp_sync.sync_table import write_sync
    from native_tsc.domain import make_virtual

    ref, gen = make_virtual("ref-node", "0", 0), make_virtual("gen-node", "87.5", 3_000_000_000_000)
    rng = np.random.default_rng(7)
    sync = tmp_path / "sync"
    table = synth_phases([ref, gen], [T0 + int(k * HZ) for k in (0, 25, 50)], 20, rng)
    for name in sorted(set(table["phase"].to_pylist())):
        write_sync(sync, name, [table.filter(pc.equal(table["phase"], name))], {ref.domain: HZ})

    def stamps(ids: np.ndarray, t_gen: np.ndarray, t_end: np.ndarray, end: str) -> pa.Table:
        mid = t_gen + (t_end - t_gen) // 3
        cols: dict[str, Any] = {"tuple_id": ids.astype(np.int64)}
        for point, raw, dom in (("gen", t_gen, gen), ("source", mid, ref), (end, t_end, ref)):
            if end == "window" and point == "source":
                continue
            cols[f"cp_tsc_{point}"] = np.array([dom.apply(int(t)) for t in raw], np.int64)
            cols[f"cp_node_{point}"] = [dom.domain] * len(ids)
        return pa.table(cols)

    warm_gen = START + np.linspace(2 * HZ, 4 * HZ, 200).astype(np.int64)
    warm_end = warm_gen + np.linspace(0.5 * HZ, 25 * HZ, 200).astype(np.int64)
    run_gen = MEASURED + np.linspace(0.1 * HZ, 4 * HZ, 500).astype(np.int64)
    run_end = run_gen + rng.integers(int(1e-3 * HZ), int(50e-3 * HZ), 500)
    if run is not None:
        run_gen, run_end = (MEASURED + (np.asarray(x) * HZ).astype(np.int64) for x in run)
    from cp_store.batch_log import publish

    records, windows = tmp_path / "records", tmp_path / "windows"
    for i, (ids, g, e) in enumerate(
        ((np.arange(*WARM_IDS), warm_gen, warm_end), (np.arange(*RUN_IDS), run_gen, run_end))
    ):
        publish(records, i, {"records-0.parquet": stamps(ids, g, e, "sink")})
    # window rows: the latest tuple's id and gen stamp (an id may repeat), stamped at output
    w_ids = np.array([1010, 1010, 1150, 1199, 20, 20, 250, 300])
    w_gen = np.array([warm_gen[10], warm_gen[10], warm_gen[150], warm_gen[199], *run_gen[[20, 20, 250, 300]]])
    w_end = w_gen + (np.array([29.5, 28.0, 12.0, 6.0, 2.5, 2.0, 1.0, 0.5]) * HZ).astype(np.int64)
    publish(windows, 0, {"windows-0.parquet": stamps(w_ids, w_gen, w_end, "window")})
    ends = {"sink": np.concatenate([warm_end, run_end]), "window": w_end}
    return records, windows, sync, ref, ends
