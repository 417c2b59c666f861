"""``cloudprofiler progress``: Klink's measures of windowed queries (docs/progress.md)."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from cp_store.location import Location, resolve

DESCRIPTION = """Window output latency, per-epoch delay statistics, the next sweeping watermark's
prediction against the actual one, and watermark advice, for each windowed query given.

A query is given by three directories: --records (its window results: the cloudprofiler sink with
option windowColumn, or record_windows in foreachBatch), --ingest (its source's progressLog) and
--checkpoint (its checkpointLocation). Repeat the three, in the same order, for several queries.
Every directory and output (--json, --plot) is a path or a URI (s3://, Hadoop's s3a://, gs://,
hdfs://, abfs://, file://), with credentials from the store's usual chain.
Stamps from several TSC domains need --sync (cloudprofiler sync run --out); each latency then has an
error bound. The window size, slide and watermark delay are read from the results and the
checkpoint unless given.

examples:
  cloudprofiler progress --records out/win --ingest out/plog --checkpoint out/ckpt
  cloudprofiler progress --records a/win --ingest a/plog --checkpoint a/ckpt \\
      --records b/win --ingest b/plog --checkpoint b/ckpt --sync sync/ --plot progress.png --json p.json
  cloudprofiler progress --records s3a://bucket/run1/win --ingest s3a://bucket/run1/plog \\
      --checkpoint s3a://bucket/run1/ckpt --json s3://bucket/run1/progress.json
"""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")


def duration_ms(text: str, zero: bool = False) -> int:
    """``500ms``, ``10s``, ``1m`` or a number of ms (positive, or 0 when ``zero``)."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration: use e.g. 500ms, 10s, 1m")
    value = float(m.group(1)) * {"ms": 1, None: 1, "s": 1000, "m": 60_000}[m.group(2)]
    if value < 0 or (value == 0 and not zero) or value != int(value):
        raise ValueError(f"{text!r}: a duration must be a {'' if zero else 'positive '}whole number of ms")
    return int(value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler progress``."""
    p.add_argument("--records", action="append", required=True, help="window results: a directory or URI")
    p.add_argument("--ingest", action="append", required=True, help="the source's progressLog: dir or URI")
    p.add_argument("--checkpoint", action="append", required=True, help="the query's checkpoint: dir or URI")
    p.add_argument("--sync", help="sync tables: a directory or URI (needed when stamps span TSC domains)")
    p.add_argument("--window", help="window size, e.g. 10s (default: from the results)")
    p.add_argument("--slide", help="window slide (default: from the results; the size for tumbling)")
    p.add_argument("--watermark-delay", help="the query's watermark delay (default: from the checkpoint)")
    p.add_argument("--history", type=int, default=10, help="h: epochs the prediction uses (default 10)")
    p.add_argument("--confidence", type=float, default=0.95, help="f: the interval's probability (0.95)")
    p.add_argument("--max-drop-share", type=float, default=1e-4, help="watermark advice's drop share (1e-4)")
    p.add_argument("--json", help="write every figure as JSON here (a path or URI)")
    p.add_argument("--plot", help="write output latency and SWM prediction over time (PNG; a path or URI)")


def _window(args: argparse.Namespace) -> tuple[int, int] | None:
    if args.window is None:
        if args.slide is not None:
            raise ValueError("--slide needs --window")
        return None
    size = duration_ms(args.window)
    slide = duration_ms(args.slide) if args.slide else size
    if slide > size:
        raise ValueError(f"--slide {args.slide} is longer than --window {args.window}")
    return size, slide


def _print(name: str, r: dict[str, Any]) -> None:
    lat, pred, adv = r["window_output_latency"], r["prediction"], r["watermark_advice"]
    print(f"query {name}: window {r['window_ms']} ms, slide {r['slide_ms']} ms, watermark delay "
          f"{r['watermark_delay_ms']} ms; {r['batches']} batches, {r['tuples']:,} tuples, "
          f"{len(r['epochs'])} epochs; clock {r['clock']['reference']}")  # fmt: skip
    if r["unmatched_buckets"]:
        print(f"  {r['unmatched_buckets']:,} logged buckets belong to batches the checkpoint does not list "
              f"as committed: a batch cut short, or older than the last "
              f"spark.sql.streaming.minBatchesToRetain (default 100) batches Spark keeps; set it higher to "
              f"measure a longer run")  # fmt: skip
    if lat.get("measured"):
        print(f"  window output latency over {lat['measured']} windows ({lat['ok']} ok): mean "
              f"{lat['mean_ms']:.1f} ms, p50 {lat['p50_ms']:.1f}, p99 {lat['p99_ms']:.1f}, max "
              f"{lat['max_ms']:.1f}; largest bound {lat['max_bound_us']:.1f} us")  # fmt: skip
    print(
        f"  {'epoch':>5} {'tuples':>9} {'delay mean':>11} {'sd':>8} {'p99':>9} {'network':>9} {'wm lag':>7}"
    )
    for e in r["epochs"][-12:]:
        print(f"  {e['epoch']:>5} {e['tuples']:>9,} {e['delay_mean_ms']:>9.1f}ms {e['delay_sd_ms']:>6.1f}ms "
              f"{e['delay_p99_ms']:>7.1f}ms {e['arrival_delay_mean_ms']:>7.1f}ms "
              f"{e['watermark_lag_ms']:>5}ms")  # fmt: skip
    if pred["predictions"]:
        lo, hi = pred["next_interval_ms"]
        print(f"  next SWM (h={pred['h']}, f={pred['f']}): {pred['predictions']} predictions, coverage "
              f"{pred['coverage']:.3f}, MAE {pred['mae_ms']:.1f} ms; "
              f"next interval width {hi - lo:.1f} ms")  # fmt: skip
    else:
        print(f"  next SWM: no prediction ({pred['why']})")
    print(f"  watermark advice: {adv['delay_ms']} ms would drop {adv['would_drop']:,} of {adv['tuples']:,} "
          f"tuples (at most {adv['max_drop_share']:g}); the query uses {adv['current_delay_ms']} ms, "
          f"saving {adv['saving_ms']} ms of output latency")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Report every query given."""
    from cloudprofiler.progress.report import progress_report
    from cp_store.tables import input_dir, output_file, resolve_option

    n = len(args.records)
    if not len(args.ingest) == len(args.checkpoint) == n:
        raise ValueError("give --records, --ingest and --checkpoint once per query, in the same order")
    if args.history < 2:
        raise ValueError(f"--history must be at least 2, got {args.history}")
    delay = duration_ms(args.watermark_delay, zero=True) if args.watermark_delay is not None else None
    window = _window(args)
    # every location checked before the work: a typo or a missing bucket fails now, in one line
    for opt in ("records", "ingest", "checkpoint"):
        for where in getattr(args, opt):
            input_dir(f"--{opt}", where)
    if args.sync is not None:
        input_dir("--sync", args.sync)
    json_loc = output_file("--json", args.json) if args.json else None
    plot_loc = output_file("--plot", args.plot) if args.plot else None
    out: dict[str, Any] = {}
    plots = []
    for rec, ing, ckpt in zip(args.records, args.ingest, args.checkpoint, strict=True):
        r, lat, table = progress_report(
            rec, ing, ckpt, args.sync, window, delay, args.history, args.confidence, args.max_drop_share
        )
        where = resolve_option("--records", rec)
        name = where.name or where.uri
        out[where.uri] = r  # the URI without credentials
        plots.append((name, lat, table))
        _print(name, r)
    if json_loc is not None:
        json_loc.write_bytes(json.dumps(out, indent=1).encode())
        print(f"figures written to {json_loc.uri}")
    if plot_loc is not None:
        plot_progress(plots, plot_loc)
        print(f"plot written to {plot_loc.uri}")
    return 0


def plot_progress(queries: list[tuple[str, Any, Any]], path: str | Location) -> None:
    """Per query: window output latency (with bounds) by window end, and the SWM interval vs actual."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from cp_store.tables import write_figure

    fig, axes = plt.subplots(len(queries), 2, figsize=(12, 3.2 * len(queries)), squeeze=False)
    for row, (name, lat, table) in zip(axes, queries, strict=True):
        end = lat["window_end_ms"].to_numpy()
        t = (end - end.min()) / 1000
        row[0].errorbar(t, lat["latency_ns"].to_numpy() / 1e6, yerr=lat["bound_ns"].to_numpy() / 1e6, fmt=".")
        row[0].set(title=f"{name}: window output latency", xlabel="window end (s)", ylabel="ms")
        if table is not None:
            x, mean = table.epoch, table.mean_ns
            row[1].fill_between(x, (table.t_min_ns - mean) / 1e6, (table.t_max_ns - mean) / 1e6, alpha=0.3,
                                label="predicted interval")  # fmt: skip
            row[1].plot(x, (np.asarray(table.actual_ns) - mean) / 1e6, ".", label="actual SWM")
            row[1].legend()
        row[1].set(title=f"{name}: next SWM, actual minus predicted mean", xlabel="epoch", ylabel="ms")
    fig.tight_layout()
    write_figure(resolve(path), fig, dpi=100)
