"""Translation against exact ground truth: synthetic probes between virtual domains of one raw counter."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudprofiler.cli import main
from cp_sync.compare.synthetic import DOMAINS, Paths, stamp, synth_phases, synth_probes
from cp_sync.sync_table import minrtt, read_sync, write_sync
from cp_sync.translate.hull import AssumptionViolated, feasible_polygon
from cp_sync.translate.phase_spans import hull_constraints, pair_phases
from cp_sync.translate.records import reference_hz
from cp_sync.translate.relation import STATUSES, fit_relation
from cp_sync.translate.translator import Translator
from native_tsc.domain import make_virtual

T0 = 10**13
SPAN = 2_600_000_000  # about a second between the phases


def _events(rng: np.random.Generator, domains, n: int, max_dur: int = 5_000_000):
    """Random events between the phases: raw start/end, stamps in random domains, truth in domains[0]."""
    rs = T0 + rng.integers(0, SPAN, n)
    re_ = rs + rng.integers(0, max_dur, n)
    si, ei = rng.integers(0, len(domains), n), rng.integers(0, len(domains), n)
    ys = np.array([domains[a].apply(int(t)) for a, t in zip(si, rs, strict=True)], dtype=np.int64)
    ye = np.array([domains[a].apply(int(t)) for a, t in zip(ei, re_, strict=True)], dtype=np.int64)
    names = np.array([d.domain for d in domains])
    truth = stamp(domains[0], re_) - stamp(domains[0], rs)
    return ys, names[si], ye, names[ei], truth


def _check_all(table: pa.Table, domains, rng, n=4000):
    ys, ds, ye, de, truth = _events(rng, domains, n)
    tr = Translator(table, domains[0].domain)
    res = {t.method: t for t in tr.translate(ys, ds, ye, de)}
    for t in res.values():
        assert sorted(t.index.tolist()) == list(range(n)), t.method
        err = np.abs(t.duration - truth[t.index])
        assert np.all(err <= t.bound), (t.method, float((err - t.bound).max()))
    # Hull is never looser than the two MinRTT points on the same probes, record by record.
    h, m = res["hull"], res["minrtt"]
    hb = np.empty(n)
    hb[h.index] = h.bound
    mb = np.empty(n)
    mb[m.index] = m.bound
    assert np.all(hb <= mb + 1e-6)
    return tr, res, truth


def test_bounds_hold_and_follow_the_paper_ordering() -> None:
    rng = np.random.default_rng(7)
    table = synth_probes(DOMAINS, {"before": T0 - 10**8, "after": T0 + SPAN + 10**8}, 100, rng)
    tr, res, _ = _check_all(table, DOMAINS, rng)
    m = res["minrtt"]
    naive = res["naive"]
    ref = DOMAINS[0].domain
    rel = {d.domain: tr.relation(d.domain, ref, "minrtt") for d in DOMAINS[1:]}
    e = {k: max(r.e_before, r.e_after) for k, r in rel.items()}
    emin = {k: min(r.e_before, r.e_after) for k, r in rel.items()}
    ys, ds, ye, de, _ = _events(np.random.default_rng(7 + 1), DOMAINS, 1)  # shapes only
    del ys, ds, ye, de
    # Scenario 1 (one non-reference node): 2 d/D e, far below e for durations much shorter than D.
    s1 = m.scenario == 1
    assert s1.sum() > 100
    assert np.all(m.bound[s1] < min(emin.values()))
    # Scenario 2 (reference and another node): e, interpolated between the two phases' e.
    s2 = m.scenario == 2
    assert s2.sum() > 100
    lo, hi = min(emin.values()), max(e.values())
    assert np.all((m.bound[s2] >= lo - 1) & (m.bound[s2] <= hi + 2))
    # Scenario 3 (two non-reference nodes): about e, well below the naive 2e.
    s3 = m.scenario == 3
    n3 = naive.scenario == 3
    assert np.median(m.bound[s3]) < 0.7 * np.median(naive.bound[n3])
    assert np.all(naive.bound[naive.scenario == 1] > 1.5 * min(emin.values()))


def test_two_point_bound_is_the_papers_formula() -> None:
    rng = np.random.default_rng(3)
    doms = DOMAINS[:2]
    table = synth_probes(doms, {"before": T0 - 10**8, "after": T0 + SPAN + 10**8}, 50, rng)
    ref, x = doms[0], doms[1]
    rel = fit_relation(table, x.domain, ref.domain, "minrtt")
    assert rel.spans is not None
    j = rel.spans.edges  # each phase's MinRTT probe in x's counter, whichever side initiated it
    tr = Translator(table, ref.domain)
    y = np.linspace(j[0], j[1], 50).astype(np.int64)
    (res,) = tr.translate(
        np.full(50, ref.apply(T0)), np.array([ref.domain] * 50), y, np.array([x.domain] * 50), ("minrtt",)
    )
    lam = (y[res.index] - j[0]) / (j[1] - j[0])
    paper_e = (1 - lam) * rel.e_before + lam * rel.e_after
    # The paper's e, plus the counter quantisation: one cycle for the probe stamps, one for the record's
    # (and, for a probe x initiated, the rate's uncertainty over half its round trip: hundredths).
    assert np.all((res.bound - paper_e >= 0) & (res.bound - paper_e <= 2.05))
    # Scenario 1: 2 d/D e for a duration d on the non-reference node.
    d = np.array([10**6, 10**7, 10**8], dtype=np.int64)
    (s1,) = tr.translate(
        np.full(3, j[0]), np.array([x.domain] * 3), j[0] + d, np.array([x.domain] * 3), ("minrtt",)
    )
    paper_s1 = d * (rel.e_before + rel.e_after) / rel.span_src
    assert np.all(np.abs(s1.bound - paper_s1) <= 2 + 1e-6 * d)
    # The paper's rate lies within (e1 + e2) / D of the true one.
    true_rate = 1 / (1 + float(x.skew_ppm) * 1e-6)
    assert abs(rel.rate - true_rate) <= (rel.e_before + rel.e_after + 2) / rel.span_src


def test_two_point_uses_the_direction_with_the_smaller_minrtt() -> None:
    """The other domain's probes have a 4x smaller MinRTT than the reference's: the bound is half of it."""
    rng = np.random.default_rng(11)
    ref, x = DOMAINS[0], DOMAINS[1]
    starts = [T0 - 10**8, T0 + SPAN + 10**8]
    wide = Paths(fwd=(20_000, 30_000), back=(20_000, 30_000))
    narrow = Paths(fwd=(2_500, 3_500), back=(2_500, 3_500))
    slow = synth_phases([ref, x], starts, 40, rng, wide, [(0, 1)])  # reference-initiated
    fast = synth_phases([ref, x], [s + 10**7 for s in starts], 40, rng, narrow, [(1, 0)])  # x-initiated
    table = pa.concat_tables([slow, fast])
    best = minrtt(table).sort_by("ns_i")
    by_ref = best.filter(pc.equal(best["initiator"], ref.domain))
    by_x = best.filter(pc.equal(best["initiator"], x.domain))
    rtt_ref = (by_ref["c_k"].to_numpy() - by_ref["c_i"].to_numpy()).astype(np.int64)
    rtt_x = (by_x["c_k"].to_numpy() - by_x["c_i"].to_numpy()).astype(np.int64)
    assert np.all(rtt_ref > 4 * rtt_x)
    rate = 1 / (1 + float(x.skew_ppm) * 1e-6)  # reference cycles per cycle of x
    e = rtt_x * rate / 2  # half the smaller MinRTT per phase, in reference cycles
    rel = fit_relation(table, x.domain, ref.domain, "minrtt")
    assert abs(rel.e_before - e[0]) < 0.01 and abs(rel.e_after - e[1]) < 0.01  # rate estimated from probes
    # Records from the reference into x between the phases: the paper's e of the x-initiated probes.
    edges = (by_x["c_i"].to_numpy() + by_x["c_k"].to_numpy()) // 2
    y = np.linspace(edges[0], edges[1], 50).astype(np.int64)
    tr = Translator(table, ref.domain)
    (res,) = tr.translate(
        np.full(50, ref.apply(T0)), np.array([ref.domain] * 50), y, np.array([x.domain] * 50), ("minrtt",)
    )
    assert sorted(res.index.tolist()) == list(range(50))
    lam = (y[res.index] - edges[0]) / (edges[1] - edges[0])
    paper_e = (1 - lam) * e[0] + lam * e[1]
    # Quantisation as in the test above (two cycles), plus hundredths for the rate over half a round trip.
    assert np.all((res.bound - paper_e >= 0) & (res.bound - paper_e <= 2.05)), (res.bound - paper_e).max()
    # Every record of every scenario lies within its bound of the truth.
    _, res_all, _ = _check_all(table, [ref, x], rng)
    s2 = res_all["minrtt"].scenario == 2
    assert s2.sum() > 100
    assert np.all(res_all["minrtt"].bound[s2] <= e.max() + 2.05)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    skews=st.lists(st.decimals(min_value=-500, max_value=500, places=3), min_size=3, max_size=3),
    offsets=st.lists(st.integers(-(10**15), 10**15), min_size=3, max_size=3),
    asym=st.integers(0, 200_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_bounds_hold_for_any_skew_offset_and_asymmetry(skews, offsets, asym, seed) -> None:
    doms = [make_virtual(f"d{i}", s, o) for i, (s, o) in enumerate(zip(skews, offsets, strict=True))]
    rng = np.random.default_rng(seed)
    table = synth_probes(
        doms,
        {"before": T0 - 10**8, "after": T0 + SPAN + 10**8},
        20,
        rng,
        fwd_cycles=(8_000 + asym, 30_000 + asym),
    )
    _check_all(table, doms, rng, n=500)


def test_crossing_hull_lines_are_detected() -> None:
    rng = np.random.default_rng(11)
    doms = DOMAINS[:2]
    table = synth_probes(doms, {"before": T0 - 10**8, "after": T0 + SPAN + 10**8}, 30, rng)
    # A step in node-b's "after" receipts (2 ms) that its own sends do not show: no affine relation fits.
    jump = pc.and_(pc.equal(table["phase"], "after"), pc.equal(table["responder"], "node-b"))
    cj = pc.if_else(jump, pc.add(table["c_j"], 5_000_000), table["c_j"])
    bad = table.set_column(table.schema.get_field_index("c_j"), "c_j", cj)
    # The hull of every probe has no relation; the two MinRTT probes alone always fit a line, so only
    # the hull can see it: the span is drift for every method, and its records are not ok.
    rel = fit_relation(bad, "node-b", "ref-node", "hull")
    assert rel.spans is not None and rel.spans.drift.tolist() == [True]
    assert fit_relation(bad, "node-b", "ref-node", "minrtt").spans.drift.tolist() == [True]
    tr = Translator(bad, "ref-node")
    b, r = doms[1], doms[0]
    out = tr.translate(
        np.array([b.apply(T0), r.apply(T0)]),
        np.array(["node-b", "ref-node"]),
        np.array([r.apply(T0 + 1000), r.apply(T0 + 2)]),
        np.array(["ref-node", "ref-node"]),
    )
    for t in out:  # every record keeps its row; only the one that needs node-b is refused
        assert t.index.tolist() == [0, 1]
        assert [STATUSES[s] for s in t.status] == ["drift", "ok"], t.method
        assert t.duration[1] == 2 and t.bound[1] < 0.01
    with pytest.raises(AssumptionViolated, match="cross"):
        feasible_polygon(hull_constraints(pair_phases(bad, "node-b", "ref-node")), 0, 0)
    # And the consistent probes are accepted.
    assert fit_relation(table, "node-b", "ref-node", "hull").spans.drift.tolist() == [False]


def _records(tmp_path, rng, n=3000):
    ys, ds, ye, de, truth = _events(rng, DOMAINS, n)
    ids = np.arange(10_000, 10_000 + n, dtype=np.int64)
    t = pa.table(
        {
            "tuple_id": ids,
            "cp_tsc_gen": ys,
            "cp_node_gen": ds,
            "cp_tsc_sink": ye,
            "cp_node_sink": de,
            "batch_id": np.zeros(n, np.int64),
            "partition": np.zeros(n, np.int32),
        }
    )
    rec = tmp_path / "records"
    # The sink's layout: two published batches (files and a manifest each), and a file beside them
    # that no manifest lists (a failed task attempt's).
    from cp_store.batch_log import publish

    second = t.slice(n // 2)
    for col in ("cp_node_gen", "cp_node_sink"):  # one file with dictionary-encoded domain columns
        i = second.schema.get_field_index(col)
        second = second.set_column(i, col, pc.dictionary_encode(second[col]))
    for b, part in ((0, t.slice(0, n // 2)), (1, second)):
        periods = pa.table({"partition": [0], "period": [1], "count": [5]})  # not records: no tuple_id
        files = {"records-0.parquet": part.drop_columns(["batch_id"]), "periods-0.parquet": periods}
        assert publish(rec, b, files, [{"seen": n}])
    pq.write_table(t.slice(0, 5), rec / "batch=1" / "records-p0-a9-failed.parquet")  # unlisted: ignored
    return dict(zip(ids.tolist(), truth.tolist(), strict=True))


def test_translate_command_end_to_end(tmp_path, capsys) -> None:
    rng = np.random.default_rng(5)
    table = synth_probes(DOMAINS, {"before": T0 - 10**8, "after": T0 + SPAN + 10**8}, 40, rng)
    sync = tmp_path / "sync"
    for phase in ("before", "after"):
        write_sync(
            sync,
            phase,
            [table.filter(pc.equal(table["phase"], phase))],
            {d.domain: 2.6e9 * d.rate() for d in DOMAINS},
        )
    truth = _records(tmp_path, rng)
    out, png = tmp_path / "lat.parquet", tmp_path / "lat.png"
    rc = main(
        [
            "translate",
            "--records",
            str(tmp_path / "records"),
            "--sync",
            str(sync),
            "--from",
            "gen",
            "--to",
            "sink",
            "--reference",
            "ref-node",
            "--out",
            str(out),
            "--plot",
            str(png),
            "--compare",
        ]
    )
    assert rc == 0
    got = pq.read_table(out)
    stdout = capsys.readouterr().out
    assert "same-node" in stdout and "two-nodes" in stdout and "p99" in stdout
    assert "ref-node -> node-b: MinRTT e" in stdout and "return-trip bound median" in stdout
    assert "NTP" in stdout
    assert png.stat().st_size > 10_000
    for method in ("minrtt", "hull", "naive"):
        sub = got.filter(pc.equal(got["method"], method))
        ids = sub["tuple_id"].to_pylist()
        assert sorted(ids) == sorted(truth)  # every committed record once; the staging file is not read
        tr = np.array([truth[i] for i in ids])
        assert np.all(np.abs(sub["duration_cycles"].to_numpy() - tr) <= sub["bound_cycles"].to_numpy())
    synced, hz = read_sync(sync)
    f, source = reference_hz(synced, "ref-node", hz)
    ns = got["duration_ns"].to_numpy()
    assert np.allclose(ns, got["duration_cycles"].to_numpy() * 1e9 / f)
    assert set(got.column_names) >= {
        "tuple_id",
        "duration_cycles",
        "bound_cycles",
        "duration_ns",
        "bound_ns",
        "scenario",
        "method",
        "from_point",
        "to_point",
        "reference",
    }


def test_translate_command_errors_are_one_line(tmp_path, capsys) -> None:
    rng = np.random.default_rng(1)
    _records(tmp_path, rng, 10)
    rc = main(
        [
            "translate",
            "--records",
            str(tmp_path / "records"),
            "--sync",
            str(tmp_path / "nosync"),
            "--from",
            "gen",
            "--to",
            "sink",
            "--out",
            str(tmp_path / "o.parquet"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "sync directory" in err and len(err.strip().splitlines()) == 1
    table = synth_probes(DOMAINS[:2], {"before": T0}, 5, rng)
    write_sync(tmp_path / "s1", "before", [table], {})
    rc = main(
        [
            "translate",
            "--records",
            str(tmp_path / "records"),
            "--sync",
            str(tmp_path / "s1"),
            "--from",
            "gen",
            "--to",
            "factory",
            "--out",
            str(tmp_path / "o.parquet"),
        ]
    )
    assert rc == 2
    assert "cp_tsc_factory" in capsys.readouterr().err
