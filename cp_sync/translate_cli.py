"""``cloudprofiler translate``: records and sync tables in, latencies with error bounds out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """Translate the duration between two stamp points of every record into reference-TSC
cycles and ns, with an error bound and a status per record. Methods: minrtt (the paper's two MinRTT
probes), hull (convex hull over every probe) and naive (each end translated on its own, the baseline).
Needs sync tables from at least two phases (before and after, or sync run --every); each record is
translated from the two phases that bracket it.

status: ok (the bound is guaranteed: each clock affine over the record's span, checked against the
neighbouring spans), extrapolated (outside the probed window: a widened bound that assumes the clocks
stay affine), drift (no affine relation fits the probes around the span), stamp_domain (the stamp lies
far outside its domain's probed counter range: probably another domain's), no_relation (no probes
relate the domains). --strict exits 1 if any record is not ok.

examples:
  cloudprofiler translate --records out/records --sync sync/ --from gen --to sink --out lat.parquet
  cloudprofiler translate --records out/records --sync sync/ --from source --to sink \\
      --reference node1@1f2e3d4c --out lat.parquet --plot lat.png
  cloudprofiler translate --records r/ --sync s/ --from gen --to sink --out l.parquet --method minrtt,naive
  cloudprofiler translate --records r/ --sync s/ --from gen --to sink --out l.parquet --compare
  cloudprofiler translate --records r/ --sync s/ --from gen --to sink --out l.parquet --strict
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler translate``."""
    p.add_argument("--records", required=True, help="Parquet dataset directory of sink records")
    p.add_argument("--sync", required=True, help="directory of sync tables (cloudprofiler sync run --out)")
    p.add_argument("--from", dest="from_point", required=True, help="start stamp point, e.g. gen")
    p.add_argument("--to", dest="to_point", required=True, help="end stamp point, e.g. sink")
    p.add_argument("--reference", help="reference TSC domain (default: where most end stamps were taken)")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.add_argument("--plot", help="write a latency and error-bound plot (PNG)")
    p.add_argument("--method", default="minrtt,hull,naive", help="comma list of minrtt, hull, naive")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 (after writing) if any record's status is not ok"
    )
    p.add_argument(
        "--stamp-margin",
        type=float,
        default=3.0,
        help="a stamp more than this many probed windows outside its domain's probed range is "
        "stamp_domain (default 3)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also print the return-trip bound (same probes) and NTP's (chrony) to compare",
    )


def run(args: argparse.Namespace) -> int:
    """Translate, write, summarise."""
    import pyarrow.parquet as pq

    from cp_sync.report import latency_table, plot, print_table, status_rows, status_table, summarize
    from cp_sync.translate import METHODS, translate_records
    from native_tsc.stamp_columns import check_point

    methods = tuple(m.strip() for m in args.method.split(",") if m.strip())
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown method {', '.join(bad) or '(none)'}: choose from {', '.join(METHODS)}")
    for name in (args.from_point, args.to_point):
        check_point(name)
    if not args.stamp_margin >= 0:
        raise ValueError(f"--stamp-margin must be >= 0, got {args.stamp_margin}")
    out, facts = translate_records(
        args.records, args.sync, args.from_point, args.to_point, args.reference, methods, args.stamp_margin
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(out, args.out, compression="zstd")
    hz = facts["frequency_hz"]
    title = (
        f"latency in us: {args.from_point} -> {args.to_point}, reference {facts['reference']}, "
        f"{hz / 1e6:.3f} MHz ({facts['frequency_source']})"
    )
    print_table(latency_table(summarize(out), title))
    print_table(status_table(status_rows(out)))
    print(
        f"bound_ns excludes the frequency's error; bound_ns_with_hz_error allows "
        f"{facts['frequency_error']:.2e} of it"
    )
    for pair, why in facts["refused"].items():
        print(f"relation {pair} refused: {why}", file=sys.stderr)
    for pair, notes in facts["drift"].items():
        for note in notes:
            print(f"relation {pair}: {note}", file=sys.stderr)
    if args.compare:
        _compare(args.sync, facts["reference"], hz)
    if args.plot:
        plot(out, args.plot)
        print(f"plot written to {args.plot}")
    print(f"{out.num_rows:,} rows written to {args.out}")
    if args.strict:
        return _strict(facts["status_counts"])
    return 0


def _strict(status_counts: dict[str, dict[str, int]]) -> int:
    """1 with one line on stderr naming the counts if any record is not ok, else 0."""
    not_ok: dict[str, int] = {}
    for counts in status_counts.values():
        for st, n in counts.items():
            if st != "ok" and n:
                not_ok[st] = not_ok.get(st, 0) + n
    if not not_ok:
        return 0
    listed = ", ".join(f"{st} {n:,}" for st, n in sorted(not_ok.items()))
    print(f"translate --strict: {sum(not_ok.values()):,} rows not ok ({listed})", file=sys.stderr)
    return 1


def _compare(sync_dir: str, reference: str, hz: float) -> None:
    """Return-trip's bound on the same probes and NTP's, beside this method's e."""
    import numpy as np

    from cp_sync.ntp import ntp_bound
    from cp_sync.returntrip import probe_returntrip
    from cp_sync.sync_table import minrtt, read_sync

    sync, _ = read_sync(sync_dir)
    best = minrtt(sync).to_pylist()
    for other in sorted({r["responder"] for r in best if r["initiator"] == reference}):
        _, bound = probe_returntrip(sync, reference, other)
        e = min(r["rtt"] for r in best if r["initiator"] == reference and r["responder"] == other) / 2
        print(
            f"{reference} -> {other}: MinRTT e {e / hz * 1e6:.3f} us; return-trip bound median "
            f"{np.median(bound) / hz * 1e6:.3f} us, max {bound.max() / hz * 1e6:.3f} us"
        )
    nb, why = ntp_bound()
    if nb is None:
        print(why)
    else:
        print(
            f"NTP ({why}): {nb.bound_s * 1e6:.1f} us per node, {2 * nb.bound_s * 1e6:.1f} us for a latency "
            "between two such nodes"
        )
