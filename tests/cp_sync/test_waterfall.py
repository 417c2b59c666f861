"""The latency waterfall (``translate --waterfall``): every record's stages add up to its end to end, each
stage's bound is positive exactly where it crosses TSC domains, and the figures hold the truth.

Synthetic stamps on virtual domains of one raw counter (so the truth is known to the cycle) with real
sync tables and the real commit protocol. A real run's points (generator, factory, Spark, a user
point, sink) are checked in tests/cp_source/reader/test_planned_stamp.py, the demo's in test_demo.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import native_tsc
from cloudprofiler.cli import main
from cp_store.batch_log import publish
from cp_sync.translate.waterfall import WATERFALL_KEY, waterfall, waterfall_meta, waterfall_summary
from tests.helpers.waterfall_run import assert_stages_add_up, stages_of

HZ = 2.6e9
T0 = 10**13
N = 400
POINTS = ["intended", "gen", "factory", "source", "mid", "sink"]
LABELS = ["held or behind", "transport and parse", "waiting in the spool, task start and read",
          "the query", "sink"]  # fmt: skip


def _synthetic(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """Records of N tuples: intended and gen on a generator node, factory on a factory node, source, a
    user point and sink on the reference (raw counter); sync tables over the run. Raw stamps returned."""
    from cp_sync.compare.synthetic import synth_phases
    from cp_sync.sync_table import write_sync
    from native_tsc.domain import make_virtual

    ref = make_virtual("ref-node", "0", 0)
    gen = make_virtual("gen-node", "87.5", 3_000_000_000_000)
    fac = make_virtual("fac-node", "-41.25", 5_000_000_000_000)
    rng = np.random.default_rng(5)
    sync = tmp_path / "sync"
    probes = synth_phases([ref, gen, fac], [T0 + int(k * HZ) for k in (0, 10, 20)], 20, rng)
    for name in sorted(set(probes["phase"].to_pylist())):
        write_sync(sync, name, [probes.filter(pc.equal(probes["phase"], name))], {ref.domain: HZ})
    raw = {"intended": T0 + int(HZ) + np.linspace(0, 15 * HZ, N).astype(np.int64)}
    steps = [(0, 5e-3), (1e-4, 2e-3), (1e-3, 0.5), (1e-5, 1e-3), (1e-5, 3e-3)]  # seconds, per stage
    for (a, b), (lo, hi) in zip(zip(POINTS, POINTS[1:], strict=False), steps, strict=True):
        raw[b] = raw[a] + rng.integers(int(lo * HZ), int(hi * HZ), N)
    domains = {"intended": gen, "gen": gen, "factory": fac, "source": ref, "mid": ref, "sink": ref}
    cols: dict[str, Any] = {"tuple_id": np.arange(N, dtype=np.int64)}
    for p in POINTS:
        cols[f"cp_tsc_{p}"] = np.array([domains[p].apply(int(t)) for t in raw[p]], np.int64)
        cols[f"cp_node_{p}"] = [domains[p].domain] * N
    records = tmp_path / "records"
    t = pa.table(cols)
    publish(records, 0, {"records-0.parquet": t.slice(0, N // 2)})
    publish(records, 1, {"records-0.parquet": t.slice(N // 2)})
    return records, sync, raw


def test_stages_across_domains_add_up_and_hold_the_truth_within_their_bounds(tmp_path: Path) -> None:
    records, sync, raw = _synthetic(tmp_path)
    table = waterfall(records, sync)
    meta = waterfall_meta(table)
    assert meta["points"] == POINTS and meta["reference"] == "ref-node" and meta["method"] == "hull"
    assert [s["label"] for s in meta["stages"]] == LABELS
    assert sorted(table["tuple_id"].to_pylist()) == list(range(N))
    assert_stages_add_up(table)
    ids = table["tuple_id"].to_numpy()
    per_ns = 1e9 / meta["frequency_hz"]  # the reference is the raw counter: truth in its cycles
    crossing = {("gen", "factory"), ("factory", "source")}
    bounds = {}
    for a, b in [*stages_of(table), ("intended", "sink")]:
        col = "e2e" if (a, b) == ("intended", "sink") else f"stage_{a}_{b}"
        truth = (raw[b] - raw[a])[ids] * per_ns
        got, bound = table[f"{col}_ns"].to_numpy(), table[f"{col}_bound_ns"].to_numpy()
        assert np.all(np.abs(got - truth) <= bound), (a, b, float(np.max(np.abs(got - truth) - bound)))
        bounds[(a, b)] = bound
    for a, b in (("source", "mid"), ("mid", "sink")):  # two readings of the reference's counter
        assert np.all(bounds[(a, b)] == 0), (a, b)
    for pair in [*crossing, ("intended", "sink")]:  # across nodes: the relation's bound comes with it
        assert np.all(bounds[pair] > 0), pair
    # within the generator's node, not the reference's: only the rate's error, far below a crossing's
    widest_cross = min(float(bounds[p].min()) for p in crossing)
    assert np.all(bounds[("intended", "gen")] > 0)
    assert float(bounds[("intended", "gen")].max()) < 0.1 * widest_cross
    assert not [n for n in meta["notes"] if "left out" in n or "not guaranteed" in n], meta["notes"]
    # the run's axis: t_s from the earliest first point (the origin on the reference's counter), or
    # from a reading given; sink is on the reference, so its seconds are exact
    hz = meta["frequency_hz"]
    assert abs(meta["origin_tsc"] - raw["intended"].min()) <= bounds[("intended", "sink")].max() * hz / 1e9
    assert np.allclose(
        table["t_s"].to_numpy(), (raw["sink"][ids] - meta["origin_tsc"]) / hz, rtol=0, atol=1e-9
    )
    shutil.copytree(sync, records / "_sync")  # where the sink's sync=auto writes them: found there
    assert waterfall(records).equals(table, check_metadata=True)
    at_t0 = waterfall(records, sync, origin_tsc=T0)
    assert waterfall_meta(at_t0)["origin_tsc"] == T0
    assert np.allclose(at_t0["t_s"].to_numpy(), (raw["sink"][at_t0["tuple_id"].to_numpy()] - T0) / hz, rtol=0,
                       atol=1e-9)  # fmt: skip


def test_waterfall_command_prints_the_stage_table_and_writes_the_columns(tmp_path: Path, capsys: Any) -> None:
    records, sync, _ = _synthetic(tmp_path)
    out = tmp_path / "w.parquet"
    args = ["translate", "--records", str(records), "--sync", str(sync), "--waterfall", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    got = pq.read_table(out)
    stage_cols = [c for a, b in zip(POINTS, POINTS[1:], strict=False)
                  for c in (f"stage_{a}_{b}_ns", f"stage_{a}_{b}_bound_ns")]  # fmt: skip
    assert got.column_names == ["tuple_id", "t_s", "e2e_ns", "e2e_bound_ns", *stage_cols]
    assert got.schema.field("tuple_id").type == pa.int64()
    assert json.loads(got.schema.metadata[WATERFALL_KEY])["points"] == POINTS
    t_s = got["t_s"].to_numpy()
    assert t_s.min() > 0 and np.all(np.diff(t_s) >= 0)  # the end point, after the earliest first point
    rows = waterfall_summary(got)
    assert [r["label"] for r in rows] == [*LABELS, "end to end"] and {r["count"] for r in rows} == {N}
    lines = printed.splitlines()
    for r in rows:
        line = next(ln for ln in lines if f"{r['from_point']} -> {r['to_point']}" in ln)
        assert r["label"] in line and f"{N:,}" in line
    # the report's table: the record at each quantile of end to end, its stages (one column each)
    from cloudprofiler.report.summary import format_duration
    from cloudprofiler.report.waterfall_plot import dominance_line, quantile_rows, waterfall_of

    wf = waterfall_of(got)
    at = quantile_rows(wf)
    assert [r.quantile for r in at] == ["p50", "p90", "p99", "max"]
    shown = {
        ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
        for ln in lines
        if ln.count("│") == 6
    }
    assert shown["record"] == [str(r.tuple_id) for r in at]
    assert shown["end to end"] == [format_duration(r.e2e_ns) for r in at]
    for i, stage in enumerate(wf.stages):
        assert shown[stage.name] == [format_duration(r.stage_ns[i]) for r in at]
    assert dominance_line(wf, at) in lines
    assert lines[-1] == f"{N:,} rows written to {out}"


def _local(tmp_path: Path) -> Path:
    """Records on this machine's counter: one file without the user point "mid", one record without
    a gen stamp."""
    dom = native_tsc.domain_id()
    base = native_tsc.now()

    def part(ids: range, points: list[str]) -> pa.Table:
        cols: dict[str, Any] = {"tuple_id": pa.array(ids, pa.int64())}
        for k, p in enumerate(points):
            cols[f"cp_tsc_{p}"] = pa.array([base + 1000 * i + 100 * k for i in ids], pa.int64())
            cols[f"cp_node_{p}"] = pa.array([dom] * len(ids))
        return pa.table(cols)

    records = tmp_path / "records"
    with_mid = part(range(0, 10), ["gen", "factory", "source", "mid", "sink"])
    gen = with_mid["cp_tsc_gen"].to_pylist()
    gen[3] = None
    with_mid = with_mid.set_column(1, "cp_tsc_gen", pa.array(gen, pa.int64()))
    publish(records, 0, {"records-0.parquet": with_mid})
    publish(records, 1, {"records-0.parquet": part(range(10, 20), ["gen", "factory", "source", "sink"])})
    return records


def test_what_is_left_out_is_said_in_the_notes(tmp_path: Path) -> None:
    table = waterfall(_local(tmp_path))
    meta = waterfall_meta(table)
    assert meta["points"] == ["gen", "factory", "source", "sink"] and meta["method"] == "same-domain"
    assert sorted(table["tuple_id"].to_pylist()) == [i for i in range(20) if i != 3]
    assert_stages_add_up(table)
    assert {c for c in table.column_names if c.endswith("bound_ns")} and all(
        float(pc.max(table[c]).as_py()) == 0 for c in table.column_names if c.endswith("bound_ns")
    )
    notes = meta["notes"]
    assert "point mid left out: only 1 of 2 record files hold it" in notes
    assert "1 of 20 records lack a gen stamp: left out" in notes
    assert any(n.startswith("no planned stamp in the records: factory -> source is one stage") for n in notes)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--from", "gen"], "--waterfall takes every stamp point and one table: not with --from"),
        (["--method", "hull,naive"], "--waterfall takes one method: --method hull,naive names 2"),
        (
            [],
            "1 stamp point(s) in every file (gen; in some files only: none): a waterfall needs at least two",
        ),
    ],
)
def test_waterfall_errors_are_one_line(tmp_path: Path, capsys: Any, extra: list[str], message: str) -> None:
    records = tmp_path / "records"
    one = pa.table({"tuple_id": pa.array([1], pa.int64()), "cp_tsc_gen": pa.array([5], pa.int64()),
                    "cp_node_gen": pa.array([native_tsc.domain_id()])})  # fmt: skip
    publish(records, 0, {"records-0.parquet": one})
    args = [
        "translate",
        "--records",
        str(records),
        "--waterfall",
        "--out",
        str(tmp_path / "w.parquet"),
        *extra,
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_translate_reports_put_the_waterfall_first(tmp_path: Path, capsys: Any) -> None:
    """``translate --report`` draws the records' waterfall first on its page (every point, the same
    reference), and ``--waterfall --report`` makes a page of the waterfall alone; a location the
    waterfall cannot use says why on the page."""
    from cloudprofiler.report.waterfall_plot import WATERFALL_FILE

    records, sync, _ = _synthetic(tmp_path)
    base = ["translate", "--records", str(records), "--sync", str(sync)]
    pair = tmp_path / "pair"
    assert main([*base, "--from", "gen", "--to", "sink", "--out", str(tmp_path / "l.parquet"), "--report",
                 str(pair)]) == 0  # fmt: skip
    whole = tmp_path / "whole"
    assert main([*base, "--waterfall", "--out", str(tmp_path / "w.parquet"), "--report", str(whole)]) == 0
    capsys.readouterr()
    for run in (pair, whole):
        page = (run / "report.html").read_text()
        got = pq.read_table(run / WATERFALL_FILE)
        assert json.loads(got.schema.metadata[WATERFALL_KEY])["points"] == POINTS and got.num_rows == N
        assert page.index("data-plot='waterfall") < page.index("Sync quality"), run
    assert pq.read_table(whole / WATERFALL_FILE).equals(pq.read_table(tmp_path / "w.parquet"))
    one = tmp_path / "one"
    dom = pa.array([native_tsc.domain_id()])
    table = pa.table(
        {
            "tuple_id": pa.array([1], pa.int64()),
            "cp_tsc_gen": pa.array([5], pa.int64()),
            "cp_node_gen": dom,
            "cp_tsc_sink": pa.array([9], pa.int64()),
            "cp_node_sink": dom,
        }
    )
    publish(one, 0, {"records-0.parquet": table.drop(["cp_tsc_sink", "cp_node_sink"])})
    publish(one, 1, {"records-0.parquet": table})
    bare = tmp_path / "bare"
    assert main(["translate", "--records", str(one), "--from", "gen", "--to", "sink", "--out",
                 str(tmp_path / "o.parquet"), "--report", str(bare)]) == 0  # fmt: skip
    assert not (bare / WATERFALL_FILE).exists()
    assert "no waterfall: " in (bare / "report.html").read_text()
