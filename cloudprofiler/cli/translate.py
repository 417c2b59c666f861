"""``cloudprofiler translate``: records and sync tables in, latencies with error bounds out."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cp_common.printable import first_line
from cp_store.location import Location

DESCRIPTION = """Translate the duration between two stamp points of every record into reference-TSC
cycles and ns, with an error bound and a status per record. Methods: minrtt (the paper's two MinRTT
probes), hull (convex hull over every probe) and naive (each end translated on its own, the baseline).
Needs sync tables from at least two phases (before and after, or sync run --every); each record is
translated from the two phases that bracket it. Without sync tables (no --sync and none in
<records>/_sync), every record's two stamps must share one TSC domain (one machine): durations are
the counter's difference at its frequency (this machine's calibrated one, or --hz), bound 0, method
same-domain; records across domains are refused in one line naming them.

--by user,region (columns the sink kept with its option keepColumns) breaks the summary down by key
value: the --top (default 10) values with the most records, the rest as "other"; the columns are
carried into --out.

status: ok (the bound is guaranteed: each clock affine over the record's span, checked against the
neighbouring spans), extrapolated (outside the probed window: a widened bound that assumes the clocks
stay affine), drift (no affine relation fits the probes around the span), stamp_domain (the stamp lies
far outside its domain's probed counter range: probably another domain's), no_relation (no probes
relate the domains). --strict exits 1 if any record is not ok.

--waterfall (instead of --from/--to) splits every record into the stages between its consecutive
stamp points (intended, gen, factory, planned, source, the user's points, sink, committed: those
every record file holds), each point translated to the reference once so that a record's stages add
up to its end to end, each stage with its bound (0 on the reference's own counter); it prints the
stage table and writes one row per record to --out (docs/sync.md, "The waterfall").

--records, --sync, --out and --plot take a path or a URI (s3://, Hadoop's s3a://, gs://, hdfs://,
abfs://, file://); credentials come from the store's usual chain (AWS_* variables, instance roles).
Without --sync, the sync tables are looked for in <records>/_sync, where the sink's option sync=auto
writes them. --out is one Parquet file, written whole or not at all.

examples:
  cloudprofiler translate --records out/records --sync sync/ --from gen --to sink --out lat.parquet
  cloudprofiler translate --records out/records --sync sync/ --from source --to sink \\
      --reference node1@1f2e3d4c --out lat.parquet --plot lat.png
  cloudprofiler translate --records r/ --sync s/ --from gen --to sink --out l.parquet --method minrtt,naive
  cloudprofiler translate --records r/ --sync s/ --from gen --to sink --out l.parquet --compare
  cloudprofiler translate --records r/ --sync s/ --from gen --to sink --out l.parquet --strict
  cloudprofiler translate --records s3a://bucket/run1/records --from gen --to sink \\
      --out s3://bucket/run1/latency.parquet                  # sync tables from .../records/_sync
  cloudprofiler translate --records r/ --from gen --to sink --out l.parquet   # one machine: no sync
  cloudprofiler translate --records r/ --from gen --to sink --out l.parquet --by user,region --top 5
  cloudprofiler translate --records r/ --sync s/ --waterfall --out waterfall.parquet
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler translate``."""
    p.add_argument("--records", required=True, help="sink records: a directory or URI")
    p.add_argument(
        "--sync",
        help="sync tables: a directory or URI (cloudprofiler sync run --out; default: <records>/_sync)",
    )
    p.add_argument("--from", dest="from_point", help="start stamp point, e.g. gen (not with --waterfall)")
    p.add_argument("--to", dest="to_point", help="end stamp point, e.g. sink (not with --waterfall)")
    p.add_argument(
        "--waterfall",
        action="store_true",
        help="every record split into the stages between its consecutive stamp points (intended, gen, "
        "factory, planned, source, user points, sink, committed): the stage table, and one row per "
        "record in --out",
    )
    p.add_argument("--reference", help="reference TSC domain (default: where most end stamps were taken)")
    p.add_argument("--out", required=True, help="output Parquet file: a path or URI")
    p.add_argument("--plot", help="write a latency and error-bound plot (PNG) here: a path or URI")
    p.add_argument(
        "--report",
        metavar="DIR",
        help="also make DIR a run directory: run.json, latency.parquet, waterfall.parquet and "
        "report.html (one self-contained page: the waterfall first, table, plots, statuses, sync, "
        "machine; with --waterfall, the waterfall alone); a path or URI",
    )
    p.add_argument(
        "--method", help="comma list of minrtt, hull, naive (default: all three; with sync tables only)"
    )
    p.add_argument("--by", help="comma list of record columns (the sink's keepColumns) to summarise by")
    p.add_argument(
        "--top", type=int, default=10, help="with --by: key values shown, most records first (default 10)"
    )
    p.add_argument(
        "--hz",
        type=float,
        help="without sync tables, for records stamped on another machine: its TSC frequency "
        "(cloudprofiler tsc prints it there)",
    )
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
    from cloudprofiler.report.summary import (
        box_figure,
        latency_series,
        print_table,
        status_rows,
        status_table,
    )
    from cp_common.stamp_columns import check_point
    from cp_store.tables import output_file, write_figure, write_parquet
    from cp_sync.translate.records import translate_records

    if args.waterfall:
        return _waterfall(args)
    if args.from_point is None or args.to_point is None:
        raise ValueError("--from and --to are required (or --waterfall for every stage)")
    methods = _methods(args.method)
    for name in (args.from_point, args.to_point):
        check_point(name)
    if not args.stamp_margin >= 0:
        raise ValueError(f"--stamp-margin must be >= 0, got {args.stamp_margin}")
    by = _by(args.by, args.top)
    # every location checked before the work: a typo or a missing bucket fails now, in one line
    records, sync = inputs(args.records, args.sync)
    if sync is None and (args.method or args.compare):
        raise ValueError(f"--{'method' if args.method else 'compare'} needs sync tables (--sync)")
    if sync is not None and args.hz is not None:
        raise ValueError("--hz is for records without sync tables: with them the frequency is measured")
    out_loc = output_file("--out", args.out)
    plot_loc = output_file("--plot", args.plot) if args.plot else None
    report_loc = _report_dir(args.report) if args.report else None
    out, facts = translate_records(
        records, sync, args.from_point, args.to_point, args.reference, methods, args.stamp_margin, by, args.hz
    )
    write_parquet(out, out_loc)
    _summary(args, out, facts, by)
    print_table(status_table(status_rows(out)))
    if sync is None:
        print(
            "one TSC domain, no sync tables: bound 0 (method same-domain); bound_ns_with_hz_error "
            f"allows {facts['frequency_error']:.2e} of the frequency"
        )
    else:
        print(
            f"bound_ns excludes the frequency's error; bound_ns_with_hz_error allows "
            f"{facts['frequency_error']:.2e} of it"
        )
    for pair, why in facts["refused"].items():
        print(f"relation {pair} refused: {why}", file=sys.stderr)
    for pair, notes in facts["drift"].items():
        for note in notes:
            print(f"relation {pair}: {note}", file=sys.stderr)
    if args.compare and sync is not None:
        _compare(sync, facts["reference"], facts["frequency_hz"])
    if plot_loc is not None:
        write_figure(plot_loc, box_figure(latency_series(out)))
        print(f"plot written to {plot_loc.uri}")
    print(f"{out.num_rows:,} rows written to {out_loc.uri}")
    if report_loc is not None:
        note = _write_waterfall(report_loc, args, records, sync, facts["reference"])
        print(f"report: {_write_report(report_loc, args, out, facts, sync, note).uri}")
    if args.strict:
        return _strict(facts["status_counts"])
    return 0


# Options that belong to one pair of points: refused with --waterfall rather than ignored.
_NOT_WITH_WATERFALL = (
    ("from_point", "--from"),
    ("to_point", "--to"),
    ("plot", "--plot"),
    ("by", "--by"),
    ("compare", "--compare"),
    ("strict", "--strict"),
)


def _waterfall(args: argparse.Namespace) -> int:
    """``translate --waterfall``: the stage table printed, the waterfall table written to --out."""
    from cloudprofiler.report.summary import print_table
    from cp_store.tables import output_file, write_parquet
    from cp_sync.translate.waterfall import DEFAULT_METHOD, stage_table, waterfall, waterfall_meta

    given = [flag for attr, flag in _NOT_WITH_WATERFALL if getattr(args, attr)]
    if given:
        raise ValueError(f"--waterfall takes every stamp point and one table: not with {', '.join(given)}")
    methods = _methods(args.method) if args.method else (DEFAULT_METHOD,)
    if len(methods) != 1:
        raise ValueError(f"--waterfall takes one method: --method {args.method} names {len(methods)}")
    if not args.stamp_margin >= 0:
        raise ValueError(f"--stamp-margin must be >= 0, got {args.stamp_margin}")
    records, sync = inputs(args.records, args.sync)
    if sync is not None and args.hz is not None:
        raise ValueError("--hz is for records without sync tables: with them the frequency is measured")
    if sync is None and args.method:
        raise ValueError("--method needs sync tables (--sync)")
    out_loc = output_file("--out", args.out)
    report_loc = _report_dir(args.report) if args.report else None
    table = waterfall(records, sync, args.reference, methods[0], args.stamp_margin, args.hz)
    write_parquet(table, out_loc)
    print_table(stage_table(table))
    _print_quantile_records(table)
    for note in waterfall_meta(table)["notes"]:
        print(note)
    print(f"{table.num_rows:,} rows written to {out_loc.uri}")
    if report_loc is not None:
        print(f"report: {_waterfall_report(report_loc, table, sync).uri}")
    return 0


def _waterfall_report(run: Location, table: Any, sync: Location | None) -> Location:
    """``--waterfall --report DIR``: DIR a run directory whose page is the waterfall (its notes as
    the verdicts), from the table just written to --out."""
    from cloudprofiler.report.run_page import build, new_doc, write_doc
    from cloudprofiler.report.waterfall_plot import WATERFALL_FILE
    from cp_store.tables import write_parquet
    from cp_sync.translate.waterfall import waterfall_meta

    meta = waterfall_meta(table)
    write_parquet(table, run.join(WATERFALL_FILE))
    doc = new_doc(
        "translate", f"translate --waterfall: {table.num_rows:,} records, reference {meta['reference']}"
    )
    doc["verdicts"] = [{"text": note, "good": None} for note in meta["notes"]]
    doc["sync"] = {
        "sync tables": "none (one TSC domain)" if sync is None else sync.uri,
        "reference TSC domain": meta["reference"],
        "method": meta.get("method"),
    }
    write_doc(run, doc)
    return build(run)


def _print_quantile_records(table: Any) -> None:
    """The report's waterfall table (report.waterfall_plot): the record at p50, p90, p99 and max of
    end to end with its stages, which add up to it; then the line naming the stage that dominates."""
    from rich.table import Table

    from cloudprofiler.report.summary import format_duration, print_table
    from cloudprofiler.report.waterfall_plot import dominance_line, quantile_rows, waterfall_of

    wf = waterfall_of(table)
    rows = quantile_rows(wf)
    # one column per quantile (the report's rows, turned to fit a terminal's width)
    t = Table(title="the record at each quantile of end to end, its stages")
    t.add_column("")
    for r in rows:
        t.add_column(r.quantile, justify="right")
    t.add_row("record", *(str(r.tuple_id) for r in rows))
    t.add_row("end to end", *(format_duration(r.e2e_ns) for r in rows))
    t.add_row("its bound", *(format_duration(r.e2e_bound_ns) for r in rows), end_section=True)
    for i, stage in enumerate(wf.stages):
        t.add_row(stage.name, *(format_duration(r.stage_ns[i]) for r in rows))
    print_table(t)
    print(dominance_line(wf, rows))


def _report_dir(given: str) -> Location:
    """The --report directory, created and checked writable before any work."""
    from cp_store.location import check_writable
    from cp_store.tables import resolve_option

    loc = resolve_option("--report", given)
    try:
        check_writable(loc)
    except OSError as e:
        raise ValueError(f"--report {e}") from None
    return loc


def _write_waterfall(
    run: Location, args: argparse.Namespace, records: Location, sync: Location | None, reference: str
) -> str | None:
    """The report's centre: the records' waterfall (every stamp point they hold, on the same
    reference) written to the run directory, where the page draws it first; why not, when it cannot
    be made (fewer than two points, say), as a line for the page's verdicts."""
    from cloudprofiler.report.waterfall_plot import WATERFALL_FILE
    from cp_store.tables import write_parquet
    from cp_sync.translate.waterfall import DEFAULT_METHOD, waterfall

    method = DEFAULT_METHOD if sync is not None else None
    try:
        table = waterfall(records, sync, reference, method or DEFAULT_METHOD, args.stamp_margin, args.hz)
    except ValueError as e:
        return f"no waterfall: {first_line(e)}"
    write_parquet(table, run.join(WATERFALL_FILE))
    return None


def _write_report(
    run: Location,
    args: argparse.Namespace,
    out: Any,
    facts: dict[str, Any],
    sync: Location | None,
    waterfall_note: str | None = None,
) -> Location:
    """Make ``run`` a run directory (report.run_page): latency.parquet, run.json, report.html (and
    waterfall.parquet, written before: ``waterfall_note`` says why there is none)."""
    from cloudprofiler.report.run_page import LATENCY_FILE, build, new_doc, write_doc
    from cp_store.manifests import gaps_note
    from cp_store.tables import write_parquet

    write_parquet(out, run.join(LATENCY_FILE))
    doc = new_doc(
        "translate", f"translate: {args.from_point} -> {args.to_point}, reference {facts['reference']}"
    )
    not_ok = {
        st: n for counts in facts["status_counts"].values() for st, n in counts.items() if st != "ok" and n
    }
    verdicts = (
        [{"text": f"every record's status is ok ({out.num_rows:,} rows)", "good": True}]
        if not not_ok
        else [
            {
                "text": f"rows not ok: {', '.join(f'{st} {n:,}' for st, n in sorted(not_ok.items()))}",
                "good": False,
            }
        ]
    )
    verdicts += [
        {"text": f"relation {pair} refused: {why}", "good": False} for pair, why in facts["refused"].items()
    ]
    if waterfall_note is not None:
        verdicts.append({"text": waterfall_note, "good": None})
    if facts.get("batch_gaps"):  # records of the missing batches are in no output
        gaps = gaps_note(facts["records"], facts["batch_gaps"])
        verdicts.append({"text": f"records {gaps}", "good": False})
    doc["verdicts"] = verdicts
    doc["ledger"] = {
        "title": "records per method and status",
        "rows": [
            [f"{m}: {st}", n]
            for m, counts in sorted(facts["status_counts"].items())
            for st, n in counts.items()
        ],
    }
    doc["latency"] = {
        "title": f"latency: {args.from_point} -> {args.to_point}",
        "unit": "ms",
        "xlabel": "record",
    }
    doc["sync"] = {
        "sync tables": "none (one TSC domain)" if sync is None else sync.uri,
        "reference TSC domain": facts["reference"],
        "frequency (MHz)": round(float(facts["frequency_hz"]) / 1e6, 3),
        "frequency source": facts["frequency_source"],
        "frequency error": f"{facts['frequency_error']:.2e}",
        **{f"drift {pair}": "; ".join(notes) for pair, notes in facts["drift"].items()},
    }
    write_doc(run, doc)
    return build(run)


def _methods(given: str | None) -> tuple[str, ...]:
    """The --method list, checked (default: every method)."""
    from cp_sync.translate.relation import METHODS

    if given is None:
        return METHODS
    methods = tuple(m.strip() for m in given.split(",") if m.strip())
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown method {', '.join(bad) or '(none)'}: choose from {', '.join(METHODS)}")
    return methods


def _by(given: str | None, top: int) -> tuple[str, ...]:
    """The --by columns, checked with --top."""
    from cloudprofiler.report.summary import MAX_TOP

    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"--top must be between 1 and {MAX_TOP}, got {top}")
    if given is None:
        return ()
    by = tuple(c.strip() for c in given.split(","))
    if not all(by) or len(set(by)) != len(by):
        raise ValueError(f"--by {given!r}: expected a comma list of distinct column names")
    return by


def _summary(args: argparse.Namespace, out: Any, facts: dict[str, Any], by: tuple[str, ...]) -> None:
    """The latency table (by key with --by, and the line saying which keys it shows), then what the
    distinct stamps of every record (not per key: the keys share them) mean for its resolution."""
    from cloudprofiler.report.summary import (
        key_note,
        latency_table,
        print_table,
        stamp_notes,
        summarize,
        top_keys,
    )
    from cp_store.manifests import gaps_note

    hz = facts["frequency_hz"]
    title = (
        f"latency: {args.from_point} -> {args.to_point}, reference {facts['reference']}, "
        f"{hz / 1e6:.3f} MHz ({facts['frequency_source']})"
    )
    print_table(latency_table(summarize(out, by, args.top), title, by=by))
    if by:
        _, kept, others = top_keys(out, by, args.top)
        print(key_note(by, kept, others))
    for line in stamp_notes(summarize(out)):
        print(line)
    if facts.get("batch_gaps"):
        print(f"records {gaps_note(facts['records'], facts['batch_gaps'])}")


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


def inputs(records: str, sync: str | None) -> tuple[Location, Location | None]:
    """The records' and the sync tables' locations; without ``sync``, ``<records>/_sync`` if it is
    there, else None (every record within one TSC domain, cp_sync.translate.same_domain)."""
    from cp_store.tables import input_dir, resolve_option
    from cp_sync.translate.records import SYNC_DIR

    rec = input_dir("--records", records)
    if sync is not None:
        return rec, resolve_option("--sync", sync)
    found = rec.join(SYNC_DIR)
    return rec, (found if found.is_dir() else None)


def _compare(sync_dir: Location, reference: str, hz: float) -> None:
    """Return-trip's bound on the same probes and NTP's, beside this method's e."""
    import numpy as np

    from cloudprofiler.report.summary import format_duration
    from cp_sync.compare.ntp import ntp_bound
    from cp_sync.compare.returntrip import probe_returntrip
    from cp_sync.sync_table import minrtt, read_sync

    sync, _ = read_sync(sync_dir)
    best = minrtt(sync).to_pylist()
    for other in sorted({r["responder"] for r in best if r["initiator"] == reference}):
        _, bound = probe_returntrip(sync, reference, other)
        e = min(r["rtt"] for r in best if r["initiator"] == reference and r["responder"] == other) / 2
        print(
            f"{reference} -> {other}: MinRTT e {format_duration(e / hz * 1e9)}; return-trip bound median "
            f"{format_duration(np.median(bound) / hz * 1e9)}, max {format_duration(bound.max() / hz * 1e9)}"
        )
    nb, why = ntp_bound()
    if nb is None:
        print(why)
    else:
        node = nb.bound_s * 1e9
        print(
            f"NTP ({why}): {format_duration(node)} per node, {format_duration(2 * node)} for a latency "
            "between two such nodes"
        )
