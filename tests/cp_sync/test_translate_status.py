"""Per-record status of the translation: every reason a bound is not guaranteed, each refused alone.

Synthetic probes between virtual domains of one raw counter (cp_sync.compare.synthetic) give the exact truth
for every record; a Drift domain drifts at a known instant.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cloudprofiler.cli import main
from cp_sync.compare.synthetic import DOMAINS, Drift, Paths, synth_phases
from cp_sync.sync_table import write_sync
from cp_sync.translate.relation import STATUSES
from cp_sync.translate.translator import Translator
from native_tsc.domain import make_virtual

T0 = 10**13
SEC = 2_600_000_000
REF, B, C, D = DOMAINS
NAMES = np.array([d.domain for d in DOMAINS])


def _events(rng, doms, lo, hi, n, max_dur=5_000_000):
    """Random events with raw starts in [lo, hi): stamps in random domains, truth in doms[0]."""
    rs = rng.integers(lo, hi, n)
    re_ = rs + rng.integers(0, max_dur, n)
    si, ei = rng.integers(0, len(doms), n), rng.integers(0, len(doms), n)
    ys = np.array([doms[a].apply(int(t)) for a, t in zip(si, rs, strict=True)], np.int64)
    ye = np.array([doms[a].apply(int(t)) for a, t in zip(ei, re_, strict=True)], np.int64)
    truth = np.array([doms[0].apply(int(b)) - doms[0].apply(int(a)) for a, b in zip(rs, re_, strict=True)])
    names = np.array([d.domain for d in doms])
    return ys, names[si], ye, names[ei], truth, rs


def _status(t):
    return np.array([STATUSES[s] for s in t.status])


def test_refused_records_leave_every_other_record_unchanged() -> None:
    rng = np.random.default_rng(21)
    table = synth_phases(DOMAINS, [T0, T0 + SEC], 40, rng)
    ys, ds, ye, de, truth, _ = _events(rng, DOMAINS, T0 + SEC // 10, T0 + SEC - SEC // 10, 3000)
    base = {t.method: t for t in Translator(table, REF.domain).translate(ys, ds, ye, de)}
    for t in base.values():
        assert set(_status(t)) == {"ok"}, t.method
        assert np.all(np.abs(t.duration - truth) <= t.bound)
    # Extrapolated: genuine stamps half a window before the first phase and after the last.
    ex_ys, ex_ds, ex_ye, ex_de, ex_truth, _ = _events(rng, DOMAINS, T0 - SEC // 2, T0 - SEC // 4, 40)
    ex2 = _events(rng, DOMAINS, T0 + SEC + SEC // 4, T0 + SEC + SEC // 2, 40)
    # Wrongly labelled: node-c's stamps labelled node-b (their counters are 8e12 cycles apart).
    raw = T0 + SEC // 2
    wrong = (
        np.array([C.apply(raw)]),
        np.array([B.domain]),
        np.array([REF.apply(raw + 1000)]),
        np.array([REF.domain]),
    )
    # Unrelated: a domain no probe mentions, and a record without a domain id.
    ghost = (
        np.array([REF.apply(raw)]),
        np.array(["ghost"]),
        np.array([REF.apply(raw + 5)]),
        np.array([REF.domain]),
    )
    ys2 = np.concatenate([ys, ex_ys, ex2[0], wrong[0], ghost[0], [REF.apply(raw)]])
    ye2 = np.concatenate([ye, ex_ye, ex2[2], wrong[2], ghost[2], [REF.apply(raw + 7)]])
    ds2 = pa.array([*ds.tolist(), *ex_ds.tolist(), *ex2[1].tolist(), B.domain, "ghost", None], pa.string())
    de2 = pa.array([*de.tolist(), *ex_de.tolist(), *ex2[3].tolist(), REF.domain, REF.domain, REF.domain])
    got = {t.method: t for t in Translator(table, REF.domain).translate(ys2, ds2, ye2, de2)}
    n = len(ys)
    for m, t in got.items():
        assert t.index.tolist() == list(range(len(ys2)))
        # Every other record: bit-identical figures and status.
        assert np.array_equal(t.duration[:n], base[m].duration) and np.array_equal(t.bound[:n], base[m].bound)
        assert np.array_equal(t.status[:n], base[m].status)
        st = _status(t)
        # Extrapolated records are not ok, but their widened bound still holds (the clocks are affine).
        ex = slice(n, n + 80)
        ex_truth_all = np.concatenate([ex_truth, ex2[4]])
        other = (ds2.to_numpy(zero_copy_only=False)[ex] != REF.domain) | (
            de2.to_numpy(zero_copy_only=False)[ex] != REF.domain
        )
        assert set(st[ex][other]) == {"extrapolated"}, m
        assert set(st[ex][~other]) <= {"ok"}  # both ends on the reference: exact wherever they are
        assert np.all(np.abs(t.duration[ex] - ex_truth_all) <= t.bound[ex])
        assert st[n + 80] == "stamp_domain", m
        assert st[n + 81] == "no_relation" and np.isnan(t.duration[n + 81])
        assert st[n + 82] == "no_relation"


def test_extrapolated_bound_is_wider_than_inside() -> None:
    rng = np.random.default_rng(4)
    doms = DOMAINS[:2]
    table = synth_phases(doms, [T0, T0 + 3 * SEC // 2], 60, rng)
    tr = Translator(table, REF.domain)
    inside = T0 + 3 * SEC // 4
    before = T0 - SEC // 2
    ys = np.array([REF.apply(inside), REF.apply(before)])
    ye = np.array([B.apply(inside + 1000), B.apply(before + 1000)])
    (t,) = tr.translate(ys, np.array([REF.domain] * 2), ye, np.array([B.domain] * 2), ("minrtt",))
    assert _status(t).tolist() == ["ok", "extrapolated"]
    assert t.bound[1] > 1.5 * t.bound[0]  # the affine extrapolation's widening: (1 + 2 * 0.5 / 1.5) e
    truth = np.array([1000.0, 1000.0])
    assert np.all(np.abs(t.duration - truth) <= t.bound)


def _drift_run(seed: int, change_ppm: str):
    """Six phases two seconds apart; node-b's skew changes by ``change_ppm`` in the middle span (p2 -> p3)."""
    rng = np.random.default_rng(seed)
    at = T0 + 5 * SEC
    b2 = make_virtual(B.domain, str(float(B.skew_ppm) + float(change_ppm)), B.offset)
    doms = [REF, Drift(B, b2, at), C]
    starts = [T0 + 2 * k * SEC for k in range(6)]
    table = synth_phases(doms, starts, 60, rng)
    n = 6000
    ys, ds, ye, de, truth, rs = _events(rng, doms, T0 + SEC // 100, T0 + 10 * SEC, n)
    res = {t.method: t for t in Translator(table, REF.domain).translate(ys, ds, ye, de)}
    span = (rs - T0) // (2 * SEC)  # the span each record lies in (its phases start 2 s apart) ...
    into = (rs - T0) % (2 * SEC)
    inner = (into > SEC // 10) & (into < 19 * SEC // 10)  # ... away from the phases (whose probes take 20 ms)
    span[~inner] = -1
    touches_b = (ds == B.domain) | (de == B.domain)
    own = table.filter(
        pc.and_(pc.equal(table["initiator"], REF.domain), pc.equal(table["responder"], B.domain))
    )
    rtt = pc.subtract(own["c_k"], own["c_i"]).to_numpy()
    phase = np.array(own["phase"].to_pylist())
    e_max = max(rtt[phase == p].min() / 2 for p in set(phase))  # the paper's e for ref <-> node-b
    return res, truth, span, touches_b, e_max


def test_a_skew_change_mid_run_is_drift_and_the_spans_away_from_it_stay_ok() -> None:
    res, truth, span, touches_b, e_max = _drift_run(8, "40")
    for m, t in res.items():
        st = _status(t)
        err = np.abs(t.duration - truth)
        ok = st == "ok"
        assert np.all(err[ok] <= t.bound[ok]), m  # every ok record holds
        changed = touches_b & (span == 2)
        assert changed.sum() > 300 and not np.any(ok[changed]), m  # the span with the change is not ok
        assert set(st[changed]) == {"drift"}
        # The change matters: these errors are far beyond the paper's bound e for the pair.
        assert np.sum(err[changed] > 2 * e_max) > 50, m
        # Every other span stays ok, the change's neighbours too: each one's phases agree with the
        # phase on its far side.
        for other in (0, 1, 3, 4):
            sel = touches_b & (span == other)
            assert sel.sum() > 300 and np.all(ok[sel]), (m, other, sorted(set(st[sel])))
        assert np.all(ok[~touches_b])  # the other pairs are not affected


def test_many_phases_without_drift_are_all_ok_and_local() -> None:
    rng = np.random.default_rng(30)
    starts = [T0 + k * SEC // 2 for k in range(9)]
    table = synth_phases(DOMAINS, starts, 30, rng)
    ys, ds, ye, de, truth, _ = _events(rng, DOMAINS, T0 + SEC // 50, T0 + 4 * SEC, 4000)
    tr = Translator(table, REF.domain)
    for t in tr.translate(ys, ds, ye, de):
        assert set(_status(t)) == {"ok"}, t.method
        assert np.all(np.abs(t.duration - truth) <= t.bound), t.method
    rel = tr.relation(B.domain, REF.domain, "hull")
    assert rel is not None and rel.spans is not None and len(rel.spans.polygons) == 8
    assert not rel.spans.drift.any() and rel.spans.whole_run_affine


def test_two_nodes_take_the_best_route_and_need_no_direct_probes() -> None:
    rng = np.random.default_rng(12)
    doms = DOMAINS[:3]
    starts = [T0, T0 + SEC]
    fast = Paths(fwd=(26_000, 26_000), back=(26_000, 26_000))  # 20 us round trips... per direction 10 us
    slow = Paths(fwd=(650_000, 660_000), back=(650_000, 660_000))  # 500 us round trips
    to_ref = [(0, 1), (1, 0), (0, 2), (2, 0)]
    direct = [(1, 2), (2, 1)]
    t_fast = synth_phases(doms, starts, 30, rng, fast, to_ref)
    t_slow = synth_phases(doms, [s + SEC // 4 for s in starts], 30, rng, slow, direct)
    ys, ds, ye, de, truth, _ = _events(rng, doms, T0 + SEC // 2, T0 + 3 * SEC // 4, 500)
    two = (ds != de) & (ds != REF.domain) & (de != REF.domain)
    assert two.sum() > 50
    bounds = {}
    for label, table in (("both", pa.concat_tables([t_fast, t_slow])), ("no direct", t_fast)):
        for t in Translator(table, REF.domain).translate(ys, ds, ye, de):
            assert set(_status(t)) == {"ok"}, (label, t.method)
            assert np.all(np.abs(t.duration - truth) <= t.bound)
            bounds[(label, t.method)] = t.bound[two]
    for m in ("minrtt", "hull"):
        # The slow direct path alone would give about 330,000 cycles (e of 500 us round trips).
        assert np.all(bounds[("both", m)] < 60_000), m
        assert np.all(bounds[("both", m)] <= bounds[("no direct", m)] + 1e-6)
    # Probes in one direction only (the nodes initiate, the reference never does) still relate them.
    one_way = synth_phases(doms, starts, 30, rng, fast, [(1, 0), (2, 0)])
    for t in Translator(one_way, REF.domain).translate(ys, ds, ye, de):
        assert set(_status(t)) == {"ok"}, t.method
        assert np.all(np.abs(t.duration - truth) <= t.bound)


def _write(tmp_path, table, recs):
    sync = tmp_path / "sync"
    for name in sorted(set(table["phase"].to_pylist())):
        write_sync(sync, name, [table.filter(pc.equal(table["phase"], name))], {REF.domain: 2.6e9})
    rec = tmp_path / "records"
    rec.mkdir()
    pq.write_table(recs, rec / "part-0.parquet")
    return sync, rec


def test_translate_command_reports_statuses_and_strict_fails_alone(tmp_path, capsys) -> None:
    rng = np.random.default_rng(2)
    table = synth_phases(DOMAINS, [T0, T0 + SEC, T0 + 2 * SEC], 20, rng)
    ys, ds, ye, de, _, _ = _events(rng, DOMAINS, T0 + SEC // 10, T0 + 19 * SEC // 10, 300)
    ys[0], ds[0] = B.apply(T0 - SEC // 2), B.domain  # one record before the first phase
    recs = pa.table({"tuple_id": np.arange(300, dtype=np.int64), "cp_tsc_gen": ys, "cp_node_gen": ds,
                     "cp_tsc_sink": ye, "cp_node_sink": de})  # fmt: skip
    sync, rec = _write(tmp_path, table, recs)
    out = tmp_path / "lat.parquet"
    args = ["translate", "--records", str(rec), "--sync", str(sync), "--from", "gen", "--to", "sink",
            "--reference", REF.domain, "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "extrapolated" in text and "no_relation" in text and "bound_ns_with_hz_error" in text
    got = pq.read_table(out)
    assert got.num_rows == 3 * 300
    st = np.array(got["status"].to_pylist())
    ids = np.array(got["tuple_id"].to_pylist())
    assert set(st[ids == 0]) == {"extrapolated"} and set(st[ids != 0]) == {"ok"}
    assert np.all(got["bound_ns_with_hz_error"].to_numpy() >= got["bound_ns"].to_numpy())
    assert main([*args, "--strict"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["translate --strict: 3 rows not ok (extrapolated 3)"]
    recs_ok = recs.slice(1)
    pq.write_table(recs_ok, rec / "part-0.parquet")
    assert main([*args, "--strict"]) == 0


def test_summaries_count_every_status_and_skip_rows_without_figures() -> None:
    from cloudprofiler.report.summary import status_rows, summarize
    from cp_sync.translate.records import translate_points

    rng = np.random.default_rng(3)
    table = synth_phases(DOMAINS[:2], [T0, T0 + SEC], 10, rng)
    raw = T0 + SEC // 2
    pts = pa.table(
        {
            "tuple_id": np.arange(3, dtype=np.int64),
            "cp_tsc_gen": [REF.apply(raw), REF.apply(raw), REF.apply(T0 - SEC)],
            "cp_node_gen": [REF.domain, "ghost", REF.domain],
            "cp_tsc_sink": [B.apply(raw + 100), B.apply(raw + 100), B.apply(T0 - SEC + 100)],
            "cp_node_sink": [B.domain] * 3,
        }
    )
    out, _ = translate_points(pts, table, "gen", "sink", REF.domain, 2.6e9, ("minrtt",), hz_error=1e-4)
    assert out["status"].to_pylist() == ["ok", "no_relation", "extrapolated"]
    rows = summarize(out)
    assert [(r["scenario"], r["count"], r["ok"]) for r in rows] == [
        ("reference-node", 2, 1),
        ("two-nodes", 1, 0),
    ]
    assert np.isfinite(rows[0]["max_us"]) and np.isnan(rows[1]["max_us"])
    (st,) = status_rows(out)
    assert (st["ok"], st["extrapolated"], st["no_relation"], st["drift"]) == (1, 1, 1, 0)
    b = out["bound_ns"].to_numpy()[0]
    assert b < out["bound_ns_with_hz_error"].to_numpy()[0] < b + 1.0  # the frequency's error adds little
