"""Klink's measures for one windowed query, from what the run left on disk.

Three inputs, all written anyway by a profiled windowed query:

* the **ingest log** (the source's ``progressLog``, ``cp_source.reader.ingest_log``): per bucket, the
  micro-batch (by end-offset digest), tuple count, event time and the ``gen``, ``factory`` and
  ``source`` stamps;
* the **checkpoint** Spark keeps for the query: ``offsets/<batchId>`` holds each batch's end
  offset (whose digest joins the log) and the watermark the batch used; ``commits/<batchId>``
  marks it done;
* the **window results** (``cp_sink.records.read_windows``: the cloudprofiler sink's
  ``windowColumn`` mode, or ``record_windows`` in ``foreachBatch``): each window row with the
  sink stamp.

Stamps from several TSC domains go onto one reference clock through the sync tables
(``cp_sync.translate``), each with its error bound and status; with one domain and no sync tables
they are converted at this machine's TSC frequency.

**Window output latency** (Klink, Section 2): the sink's stamp of the window's result minus the
window's deadline mapped to generation time. The deadline ``e`` (the window's end) is crossed by
the first generated tuple with event time ``>= e``: the bucket holding the smallest event time at
or past ``e`` (the earliest generated on ties), whose ``gen`` stamp is the deadline's time. A window
emitted over several rows or batches (several keys; update mode) counts from its last row: the
moment its result is complete. The latency therefore includes the watermark delay, which is what the
watermark advice can save.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from cp_common.stamp_columns import FACTORY, GEN, SINK, SOURCE, node_column, tsc_column
from cp_source.klink import progress_model as pm
from cp_store.location import Location, resolve

MAX_CHECKPOINT_BATCHES = 10_000_000
MAX_OFFSET_FILE_BYTES = 1 << 20


# ---- the checkpoint ---------------------------------------------------------------------------
def _source_offset(lines: list[str], path: str) -> dict[str, Any] | None:
    """The cloudprofiler source's end offset among a batch's source lines (None: not in this batch)."""
    found = []
    for line in lines:
        if line.strip() in ("", "-"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "spool" in value:
            found.append(value)
    if len(found) > 1:
        raise ValueError(
            f"{path}: {len(found)} cloudprofiler sources in one query; give one query per source"
        )
    return found[0] if found else None


def _batch_files(loc: Location) -> dict[int, pafs.FileInfo]:
    """The files of a checkpoint log (``offsets/``, ``commits/``) named by batch id."""
    return {
        int(i.base_name): i for i in loc.children() if i.base_name.isdigit() and i.type == pafs.FileType.File
    }


def read_checkpoint(checkpoint: str | os.PathLike[str] | Location) -> pa.Table:
    """Per committed micro-batch: batch_id, batch_key (its end offset's digest), the watermark it used
    (ms) and its trigger time (ms), from Spark's offset and commit logs (a path or URI)."""
    from cp_source.reader.ingest_log import batch_key

    root = resolve(checkpoint)
    offsets, commits = root.join("offsets"), root.join("commits")
    if not offsets.is_dir():
        raise ValueError(f"{root.uri} is not a streaming checkpoint (no offsets/ directory)")
    done = set(_batch_files(commits))
    entries = {i: f for i, f in _batch_files(offsets).items() if i in done}
    if len(entries) > MAX_CHECKPOINT_BATCHES:
        raise ValueError(f"{root.uri}: {len(entries)} batches, more than {MAX_CHECKPOINT_BATCHES}")
    rows: dict[str, list[Any]] = {"batch_id": [], "batch_key": [], "watermark_ms": [], "timestamp_ms": []}
    for i, info in sorted(entries.items()):
        path = offsets.join(str(i)).uri
        if (info.size or 0) > MAX_OFFSET_FILE_BYTES:
            raise ValueError(f"{path}: larger than {MAX_OFFSET_FILE_BYTES} bytes, not an offset log entry")
        lines = offsets.join(str(i)).read_bytes().decode("utf-8", "replace").splitlines()
        if len(lines) < 3 or not lines[0].startswith("v"):
            raise ValueError(f"{path}: not a Spark offset log entry (version, metadata, offsets)")
        try:
            meta = json.loads(lines[1])
        except ValueError as e:
            raise ValueError(f"{path}: metadata line is not JSON ({e})") from None
        end = _source_offset(lines[2:], path)
        if end is None:
            continue
        rows["batch_id"].append(i)
        rows["batch_key"].append(batch_key(end))
        rows["watermark_ms"].append(int(meta.get("batchWatermarkMs", 0)))
        rows["timestamp_ms"].append(int(meta.get("batchTimestampMs", 0)))
    return pa.table(
        rows,
        schema=pa.schema(
            [("batch_id", pa.int64()), ("batch_key", pa.string()), ("watermark_ms", pa.int64()),
             ("timestamp_ms", pa.int64())]
        ),
    )  # fmt: skip


# ---- one clock --------------------------------------------------------------------------------
@dataclass
class RefClock:
    """Maps (TSC, domain) stamps onto one reference clock, in ns from an origin, with bounds."""

    reference: str
    hz: float
    origin: int  # a reference-domain TSC value: ns are counted from it
    translator: Any = None  # cp_sync.translate.translator.Translator, None for one domain without sync tables
    method: str = "minrtt"

    def to_ns(self, tsc: np.ndarray, domains: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ns, bound ns, ok) per stamp."""
        tsc = np.asarray(tsc, np.int64)
        doms = [str(d) for d in domains]
        to_ns = 1e9 / self.hz
        if self.translator is None:
            other = sorted(set(doms) - {self.reference})
            if other:
                raise ValueError(
                    f"stamps from domains {other} besides {self.reference}: give the sync tables (--sync)"
                )
            return (tsc - self.origin) * to_ns, np.zeros(len(tsc)), np.ones(len(tsc), bool)
        start = np.full(len(tsc), self.origin, np.int64)
        (res,) = self.translator.translate(start, [self.reference] * len(tsc), tsc, doms, (self.method,))
        return res.duration * to_ns, res.bound * to_ns, res.status == 0


def reference_clock(stamps: list[tuple[np.ndarray, list[str]]], sync_dir: str | None,
                    reference: str | None = None) -> tuple[RefClock, dict[str, Any]]:  # fmt: skip
    """The clock every stamp is put on: the sync tables' (with bounds) or, without them, this machine's
    TSC for a run in one domain."""
    domains: dict[str, int] = {}
    for _tsc, doms in stamps:
        for d in doms:
            domains[d] = domains.get(d, 0) + 1
    if not domains:
        raise ValueError("no stamps: the ingest log and the window results are empty")
    ref = reference or max(domains, key=lambda d: (domains[d], d))
    first = next(int(t[0]) for t, d in stamps if len(t))
    if sync_dir is None:
        import native_tsc

        hz = float(native_tsc.frequency_hz())
        facts = {"reference": ref, "frequency_hz": hz, "frequency_source": "this machine", "domains": domains}
        return RefClock(ref, hz, first), facts
    from cp_sync.sync_table import read_sync
    from cp_sync.translate.records import reference_hz_estimate
    from cp_sync.translate.translator import Translator

    sync, reported = read_sync(sync_dir)
    hz, source, err = reference_hz_estimate(sync, ref, reported)
    own = np.concatenate([t[np.asarray(d) == ref] for t, d in stamps])
    origin = int(own[0]) if len(own) else first
    facts = {"reference": ref, "frequency_hz": hz, "frequency_source": source, "frequency_error": err,
             "domains": domains}  # fmt: skip
    return RefClock(ref, hz, origin, Translator(sync, ref)), facts


# ---- window output latency --------------------------------------------------------------------
def deadline_crossings(
    ev_min: np.ndarray, ev_max: np.ndarray, gen_ns: np.ndarray, deadlines: np.ndarray
) -> np.ndarray:
    """Per deadline e: the index of the bucket holding the smallest event time >= e (earliest generated
    on ties), or -1 when no bucket reaches e."""
    ev_min, ev_max = np.asarray(ev_min, np.int64), np.asarray(ev_max, np.int64)
    gen = np.asarray(gen_ns, np.float64)
    dl = np.asarray(deadlines, np.int64)
    if not len(ev_min):
        return np.full(len(dl), -1, np.int64)
    # a bucket starting at or past e offers its first event time; the first such in (event, gen) order
    order = np.lexsort((gen, ev_min))
    at = np.searchsorted(ev_min[order], dl, side="left")
    has = at < len(order)
    out = np.where(has, order[np.minimum(at, len(order) - 1)], -1).astype(np.int64)
    best_ev = np.where(has, ev_min[np.maximum(out, 0)], np.iinfo(np.int64).max)
    best_gen = np.where(has, gen[np.maximum(out, 0)], np.inf)
    # a bucket straddling e (ev_min < e <= ev_max) offers e itself: only those need a look each
    by_dl = np.argsort(dl, kind="stable")
    sorted_dl = dl[by_dl]
    for b in np.flatnonzero(ev_min < ev_max).tolist():
        lo = np.searchsorted(sorted_dl, ev_min[b], side="right")
        hi = np.searchsorted(sorted_dl, ev_max[b], side="right")
        for i in by_dl[lo:hi].tolist():
            if (dl[i], gen[b]) < (best_ev[i], best_gen[i]):
                out[i], best_ev[i], best_gen[i] = b, dl[i], gen[b]
    return out


def window_output_latency(windows: pa.Table, ingest: pa.Table, clock: RefClock) -> pa.Table:
    """One row per window: its deadline's crossing bucket and generation time, its last output row's
    sink time and batch, the latency and its bound, and whether both stamps are guaranteed (ok)."""
    if not windows.num_rows:
        raise ValueError("no window results: run the sink with windowColumn (or record_windows)")
    sink_ns, sink_b, sink_ok = clock.to_ns(
        windows[tsc_column(SINK)].to_numpy(), windows[node_column(SINK)].to_pylist()
    )
    gen_ns, gen_b, gen_ok = clock.to_ns(
        ingest[tsc_column(GEN)].to_numpy(), ingest[node_column(GEN)].to_pylist()
    )
    start = windows["window_start_ms"].to_numpy()
    end = windows["window_end_ms"].to_numpy()
    # per window (start, end): its last output row (latest batch, then latest sink time)
    order = np.lexsort((sink_ns, windows["batch_id"].to_numpy(), end, start))
    key = np.stack([start[order], end[order]], axis=1)
    last = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1)).tolist() + [len(order) - 1]
    rows = order[np.asarray(last, np.int64)]
    counts = np.diff(np.concatenate(([-1], np.asarray(last))))
    cross = deadline_crossings(
        ingest["event_ms_min"].to_numpy(), ingest["event_ms_max"].to_numpy(), gen_ns, end[rows]
    )
    has = cross >= 0
    c = np.where(has, cross, 0)
    lat = np.where(has, sink_ns[rows] - gen_ns[c], np.nan)
    bound = np.where(has, sink_b[rows] + gen_b[c], np.nan)
    return pa.table(
        {
            "window_start_ms": start[rows],
            "window_end_ms": end[rows],
            "batch_id": windows["batch_id"].to_numpy()[rows],
            "rows": counts.astype(np.int64),
            "crossing_event_ms": np.where(
                has, np.maximum(ingest["event_ms_min"].to_numpy()[c], end[rows]), -1
            ),
            "deadline_gen_ns": np.where(has, gen_ns[c], np.nan),
            "output_ns": sink_ns[rows],
            "latency_ns": lat,
            "bound_ns": bound,
            "ok": has & sink_ok[rows] & gen_ok[c],
        }
    )


# ---- batches, epochs, prediction, advice ------------------------------------------------------
@dataclass
class QueryRun:
    """One query's batches and buckets on the reference clock, ready for cp_source.klink.progress_model."""

    batches: pm.Batches
    tuples: pm.Tuples
    arrival_ns: np.ndarray  # per bucket: the factory's stamp (the order the buckets arrived in)
    arrival: pm.Tuples  # the buckets with the factory's stamp as their ingestion time
    delay_ms: int  # the query's watermark delay
    unmatched_buckets: int  # logged by a batch the checkpoint does not show committed


def _assign_batches(ckpt: pa.Table, ingest: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket: the batch that read it (the first batch with its end offset: a later no-data batch
    has the same one), -1 when that batch is not committed."""
    first: dict[str, int] = {}
    for bid, key in zip(ckpt["batch_id"].to_pylist(), ckpt["batch_key"].to_pylist(), strict=True):
        first.setdefault(key, bid)
    bid = np.array([first.get(k, -1) for k in ingest["batch_key"].to_pylist()], np.int64)
    return bid, bid >= 0


def infer_watermark_delay(ckpt: pa.Table, bucket_batch: np.ndarray, ev_max: np.ndarray) -> int:
    """The delay Spark applied: at each watermark advance, the newest event time of the batches
    before it minus the new watermark (the most common value)."""
    ids = ckpt["batch_id"].to_numpy()
    wm = ckpt["watermark_ms"].to_numpy()
    newest = np.full(len(ids), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(newest, np.searchsorted(ids, bucket_batch), ev_max)
    before = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], newest[:-1])))
    adv = np.flatnonzero((np.diff(wm, prepend=0) > 0) & (before > np.iinfo(np.int64).min))
    if not adv.size:
        raise ValueError("the watermark never advanced in the checkpoint: give the watermark delay")
    values, counts = np.unique(before[adv] - wm[adv], return_counts=True)
    return int(values[np.argmax(counts)])


def query_run(ckpt: pa.Table, ingest: pa.Table, clock: RefClock, delay_ms: int | None = None) -> QueryRun:
    """Join the ingest log to the checkpoint's batches and put every stamp on the reference clock."""
    bucket_batch, known = _assign_batches(ckpt, ingest)
    log = ingest.filter(pa.array(known))
    bb = bucket_batch[known]
    if not len(bb):
        raise ValueError("no logged bucket belongs to a committed batch of this checkpoint")
    ev_min, ev_max = log["event_ms_min"].to_numpy(), log["event_ms_max"].to_numpy()
    delay = infer_watermark_delay(ckpt, bb, ev_max) if delay_ms is None else int(delay_ms)
    gen, _, _ = clock.to_ns(log[tsc_column(GEN)].to_numpy(), log[node_column(GEN)].to_pylist())
    src, _, _ = clock.to_ns(log[tsc_column(SOURCE)].to_numpy(), log[node_column(SOURCE)].to_pylist())
    fac, _, _ = clock.to_ns(log[tsc_column(FACTORY)].to_numpy(), log[node_column(FACTORY)].to_pylist())
    ids, inv = np.unique(bb, return_inverse=True)
    ingest_ns = np.full(len(ids), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(ingest_ns, inv, np.rint(src).astype(np.int64))
    max_ev = np.full(len(ids), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(max_ev, inv, ev_max)
    # the watermark after a batch: the one the next committed batch used, or computed for the last
    c_ids, c_wm = ckpt["batch_id"].to_numpy(), ckpt["watermark_ms"].to_numpy()
    nxt = np.searchsorted(c_ids, ids, side="right")
    own = c_wm[np.searchsorted(c_ids, ids)]
    computed = np.maximum(own, np.maximum(np.maximum.accumulate(max_ev) - delay, 0))
    wm_after = np.where(nxt < len(c_ids), c_wm[np.minimum(nxt, len(c_ids) - 1)], computed)
    batches = pm.Batches.of(ids, np.maximum.accumulate(ingest_ns), wm_after, max_ev)
    tuples = pm.Tuples.of(
        bb, np.rint(gen).astype(np.int64), np.rint(src).astype(np.int64), ev_min, log["count"].to_numpy()
    )
    fac_ns = np.rint(fac).astype(np.int64)
    arrival = pm.Tuples.of(tuples.batch_id, tuples.gen_ns, fac_ns, ev_min, tuples.count)
    return QueryRun(batches, tuples, fac, arrival, delay, int((~known).sum()))


def infer_window(windows: pa.Table) -> tuple[int, int]:
    """(size, slide) in ms from the window results: every window's length, the starts' spacing."""
    if not windows.num_rows:
        raise ValueError("no window results to infer the window size from: give it")
    size = np.unique(windows["window_end_ms"].to_numpy() - windows["window_start_ms"].to_numpy())
    if len(size) != 1:
        raise ValueError(f"windows of several sizes {size.tolist()[:5]} ms: give the window size and slide")
    starts = np.unique(windows["window_start_ms"].to_numpy())
    steps = np.diff(starts)
    slide = int(np.gcd.reduce(steps)) if steps.size else int(size[0])
    return int(size[0]), min(slide, int(size[0]))


def _ms(ns: float) -> float:
    return float(ns) / 1e6


def _epochs(stats: pm.EpochStats, arrival: pm.EpochStats) -> list[dict[str, Any]]:
    """Per epoch: delays to Spark (gen -> source) and to the factory (gen -> factory: the network's)."""
    return [
        {
            "epoch": int(stats.epoch[i]),
            "swm_batch": int(stats.swm_batch_id[i]),
            "tuples": int(stats.count[i]),
            "delay_mean_ms": _ms(stats.mean_ns[i]),
            "delay_sd_ms": _ms(float(np.sqrt(stats.var_ns2[i]))),
            "delay_p50_ms": _ms(stats.p50_ns[i]),
            "delay_p99_ms": _ms(stats.p99_ns[i]),
            "arrival_delay_mean_ms": _ms(arrival.mean_ns[i]),
            "arrival_delay_sd_ms": _ms(float(np.sqrt(arrival.var_ns2[i]))),
            "watermark_lag_ms": int(stats.wm_lag_ms[i]),
            "swm_delay_ms": _ms(stats.swm_delay_ns[i]),
            "w_ms": _ms(stats.w_ns[i]),
        }
        for i in range(len(stats.epoch))
    ]


def _prediction_rows(table: pm.PredictionTable) -> list[dict[str, Any]]:
    """Each prediction beside the actual SWM (ms on the report's clock)."""
    return [
        {
            "epoch": int(e),
            "mean_ms": _ms(m),
            "t_min_ms": _ms(lo),
            "t_max_ms": _ms(hi),
            "actual_ms": _ms(a),
            "covered": bool(c),
        }  # fmt: skip
        for e, m, lo, hi, a, c in zip(
            table.epoch,
            table.mean_ns,
            table.t_min_ns,
            table.t_max_ns,
            table.actual_ns,
            table.covered,
            strict=True,
        )  # fmt: skip
    ]


def _latency_summary(lat: pa.Table) -> dict[str, Any]:
    v = lat["latency_ns"].to_numpy()
    b = lat["bound_ns"].to_numpy()
    has = ~np.isnan(v)
    out: dict[str, Any] = {"windows": lat.num_rows, "measured": int(has.sum()),
                           "ok": int(lat["ok"].to_numpy().sum())}  # fmt: skip
    if has.any():
        out.update(
            mean_ms=_ms(v[has].mean()),
            p50_ms=_ms(np.percentile(v[has], 50)),
            p99_ms=_ms(np.percentile(v[has], 99)),
            max_ms=_ms(v[has].max()),
            max_bound_us=float(b[has].max()) / 1e3,
        )
    return out


def progress_report(
    records: str,
    ingest_dir: str,
    checkpoint: str,
    sync_dir: str | None = None,
    window: tuple[int, int] | None = None,
    delay_ms: int | None = None,
    h: int = 10,
    f: float = 0.95,
    max_drop_share: float = 1e-4,
) -> tuple[dict[str, Any], pa.Table, Any]:
    """(report, per-window latency table, prediction table or None) of one windowed query.

    ``records``, ``ingest_dir`` (the source's progressLog), ``checkpoint`` and ``sync_dir`` are
    paths or URIs."""
    from cp_sink.records import read_windows
    from cp_source.reader.ingest_log import read_ingest_log

    windows = read_windows(records)
    ingest = read_ingest_log(ingest_dir)
    ckpt = read_checkpoint(checkpoint)
    clock, facts = reference_clock(
        [
            (windows[tsc_column(SINK)].to_numpy(), windows[node_column(SINK)].to_pylist()),
            (ingest[tsc_column(GEN)].to_numpy(), ingest[node_column(GEN)].to_pylist()),
            (ingest[tsc_column(SOURCE)].to_numpy(), ingest[node_column(SOURCE)].to_pylist()),
        ],
        sync_dir,
    )
    size, slide = window or infer_window(windows)
    run = query_run(ckpt, ingest, clock, delay_ms)
    lat = window_output_latency(windows, ingest, clock)
    ev = run.tuples.event_ms
    swms = pm.sweeping_watermarks(run.batches, pm.window_deadlines(size, slide, int(ev.min()), int(ev.max())))
    stats = pm.epoch_delay_stats(run.batches, swms, run.tuples, run.delay_ms)
    report: dict[str, Any] = {
        "clock": facts,
        "window_ms": size,
        "slide_ms": slide,
        "watermark_delay_ms": run.delay_ms,
        "batches": len(run.batches.batch_id),
        "tuples": int(run.tuples.count.sum()),
        "unmatched_buckets": run.unmatched_buckets,
        "window_output_latency": _latency_summary(lat),
        "windows": [
            {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
            for row in lat.to_pylist()
        ],
        "epochs": _epochs(stats, pm.epoch_delay_stats(run.batches, swms, run.arrival, run.delay_ms)),
    }
    table = None
    if len(stats.epoch) > h:
        table = pm.prediction_table(stats, h, f)
        nxt = pm.predict_next_swm(stats, h, f)
        report["prediction"] = {
            "h": h, "f": f, "predictions": len(table.epoch), "coverage": table.coverage,
            "mae_ms": _ms(table.mae_ns), "next_mean_ms": _ms(nxt.mean_ns),
            "next_interval_ms": [_ms(nxt.t_min_ns), _ms(nxt.t_max_ns)],
            "rows": _prediction_rows(table),
        }  # fmt: skip
    else:
        why = f"{len(stats.epoch)} complete epochs, need more than h={h}"
        report["prediction"] = {"h": h, "f": f, "predictions": 0, "why": why}
    arrival = np.repeat(np.rint(run.arrival_ns).astype(np.int64), run.tuples.count)
    adv = pm.watermark_advice(np.repeat(ev, run.tuples.count), arrival, run.delay_ms, max_drop_share)
    report["watermark_advice"] = {
        "max_drop_share": max_drop_share, "delay_ms": adv.delay_ms, "would_drop": adv.would_drop,
        "tuples": adv.tuples, "current_delay_ms": run.delay_ms, "saving_ms": adv.saving_ms,
    }  # fmt: skip
    return report, lat, table
