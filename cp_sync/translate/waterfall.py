"""The latency waterfall: every record's path split into the stages between its consecutive stamp points.

Points, in pipeline order: intended, gen, factory, planned, source, the user's stamp points (in the
order their columns appear), sink, committed; the ones every record file holds are used. Each point
of a record is translated to the reference domain once (its position: reference cycles after one
anchor reading of the reference) and a stage is the difference of two consecutive positions, so the
stages of a record add up to its end-to-end latency (first point to last) by construction.

A stage's bound is the tighter of two sound ones: the two positions' bounds added, and the bound of
the stage translated as a pair (the relation of the two domains it crosses, cp_sync.translate) plus
the distance between that pair's estimate and the difference of positions. A stage within the
reference domain is two readings of one counter: bound 0. Bounds exclude the reference frequency's
own relative error (given in the notes), as translate's ``bound_ns`` does.

The table: one row per record (``WATERFALL_COLUMNS`` then ``stage_<from>_<to>_ns`` and
``stage_<from>_<to>_bound_ns`` per stage), and under ``WATERFALL_KEY`` in its schema's metadata the
stages (from, to, label), the points, the reference and the notes: whatever was left out (a point
some files lack, records lacking a stamp, records no relation reaches) is said there, never dropped
silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cp_common.faces import deprecated_names
from cp_common.stamp_columns import (
    COMMITTED,
    FACTORY,
    GEN,
    INTENDED,
    PLANNED,
    SINK,
    SOURCE,
    node_column,
    tsc_column,
)
from cp_store.location import Location
from cp_store.published_run import Published, published
from cp_sync.translate.relation import ST_NO_RELATION, ST_OK, STAMP_MARGIN, STATUSES

WATERFALL_KEY = b"cloudprofiler.waterfall"
WATERFALL_COLUMNS = ("tuple_id", "t_s", "e2e_ns", "e2e_bound_ns")
DEFAULT_METHOD = "hull"  # never looser than minrtt on the same probes
# planned (the driver's offer of a batch to Spark) is used when the records hold it: older ones do not
_BEFORE_USER = (INTENDED, GEN, FACTORY, PLANNED, SOURCE)
_AFTER_USER = (SINK, COMMITTED)
_LABELS = {
    (INTENDED, GEN): "held or behind",
    (GEN, FACTORY): "transport and parse",
    (FACTORY, PLANNED): "waiting in the spool",
    (PLANNED, SOURCE): "task start and read",
    (FACTORY, SOURCE): "waiting in the spool, task start and read",
    (SOURCE, SINK): "the query",
    (SINK, COMMITTED): "commit",
}
QUANTILES = (50, 90, 99)


def stage_column(a: str, b: str) -> str:
    """``stage_<a>_<b>_ns``: the column of the stage from point a to point b."""
    return f"stage_{a}_{b}_ns"


def bound_column(a: str, b: str) -> str:
    """``stage_<a>_<b>_bound_ns``: the column of that stage's bound."""
    return f"stage_{a}_{b}_bound_ns"


def order_points(points: Sequence[str]) -> list[str]:
    """The points in pipeline order: the product's before the user's (kept in the order given), sink
    and committed after them."""
    known = set(_BEFORE_USER) | set(_AFTER_USER)
    user = [p for p in points if p not in known]
    return [p for p in _BEFORE_USER if p in points] + user + [p for p in _AFTER_USER if p in points]


def stage_label(a: str, b: str) -> str:
    """What the stage from a to b is, in a reader's words."""
    known = set(_BEFORE_USER) | set(_AFTER_USER)
    if (a, b) in _LABELS:
        return _LABELS[(a, b)]
    if b == SINK and a not in known:
        return "sink"
    if b not in known and (a == SOURCE or a not in known):
        return "the query"
    return f"{a} -> {b}"


@dataclass
class _Positions:
    """Per point: position (reference cycles after the anchor) and its bound; per record the worst
    status; per stage (and end to end) the bound; the frequency and facts of the translation."""

    pos: dict[str, np.ndarray]
    half: dict[str, np.ndarray]
    status: np.ndarray  # int8: the worst of every part a record used
    stage: dict[tuple[str, str], np.ndarray]  # bound of each stage and of end to end (cycles)
    hz: float
    facts: dict[str, Any]
    anchor: int  # the reference's reading at position 0


def waterfall(
    records: str | os.PathLike[str] | Location | Published,
    sync: str | os.PathLike[str] | Location | None = None,
    reference: str | None = None,
    method: str = DEFAULT_METHOD,
    stamp_margin: float = STAMP_MARGIN,
    hz: float | None = None,
    origin_tsc: int | None = None,
) -> pa.Table:
    """The waterfall table of a records location (see the module): one row per record.

    ``sync``: sync tables (None: ``<records>/_sync`` if there, else every record within one TSC domain,
    at this machine's frequency or ``hz``, as translate). ``reference``, ``method`` (one of minrtt, hull,
    naive) and ``stamp_margin`` as translate's. ``t_s`` counts seconds from ``origin_tsc``, a reading
    of the reference's counter (default: the earliest record's first point); the metadata's
    ``origin_tsc`` gives the one used, so other events on the reference's clock share the axis.
    """
    from cp_store.manifests import batch_gaps, gaps_note
    from cp_sync.translate.records import SYNC_DIR

    run = published(records)  # resolved once, its manifests read once
    root = run.root
    if sync is None and root.join(SYNC_DIR).is_dir():
        sync = root.join(SYNC_DIR)
    points, table, notes = _read(run)
    if sync is None:
        where = root.join(SYNC_DIR).uri
        at = _same_domain(table, points, reference, hz, where)
    else:
        at = _synced(table, points, sync, reference, method, stamp_margin)
    gaps = batch_gaps(run.manifests)
    if gaps:
        notes.append(f"records {gaps_note(root.uri, gaps)}")
    return _table(table, points, at, notes, origin_tsc)


def _read(run: Published) -> tuple[list[str], pa.Table, list[str]]:
    """The points every record file holds (pipeline order), their stamps for every record holding all
    of them, and the notes on what was left out."""
    from cp_sync.translate.record_points import points_in_files, read_stamps

    root = run.root
    files, held = points_in_files(run)
    if not files:
        raise ValueError(f"no record files (Parquet with tuple_id) under {root.uri}")
    ordered = order_points(list(held))
    points = [p for p in ordered if held[p] == files]
    notes = [
        f"point {p} left out: only {held[p]:,} of {files:,} record files hold it"
        for p in ordered
        if p not in points
    ]
    if len(points) < 2:
        partial = ", ".join(p for p in ordered if p not in points) or "none"
        raise ValueError(
            f"records in {root.uri} hold {len(points)} stamp point(s) in every file "
            f"({', '.join(points) or 'none'}; in some files only: {partial}): a waterfall needs at least two"
        )
    if PLANNED not in points and FACTORY in points and SOURCE in points:
        notes.append("no planned stamp in the records: factory -> source is one stage (waiting in the spool, "
                     "task start and read)")  # fmt: skip
    table = read_stamps(run, points)
    complete = np.ones(table.num_rows, bool)
    for p in points:
        valid = pc.is_valid(table[tsc_column(p)]).to_numpy(zero_copy_only=False)
        valid &= pc.is_valid(table[node_column(p)]).to_numpy(zero_copy_only=False)
        if not valid.all():
            notes.append(f"{int((~valid).sum()):,} of {table.num_rows:,} records lack a {p} stamp: left out")
        complete &= valid
    return points, table.filter(pa.array(complete)), notes


def _same_domain(
    table: pa.Table, points: list[str], reference: str | None, hz: float | None, looked: str
) -> _Positions:
    """Positions without sync tables: every stamp of every record in one TSC domain (else one line)."""
    from cp_sync.translate import same_domain

    if not table.num_rows:
        raise ValueError("no record holds every stamp point: no waterfall")
    domains: set[str] = set()
    for a, b in zip(points, points[1:], strict=False):
        domains.update(same_domain.check_one_domain(table, a, b, looked))
    names = sorted(domains)
    if reference is not None and reference not in names:
        raise ValueError(f"--reference {reference}: the records were stamped in {', '.join(names)}")
    freq, source = same_domain.domain_frequency(names, hz)
    first = table[tsc_column(points[0])].to_numpy()
    base = int(first.min())
    pos = {p: (table[tsc_column(p)].to_numpy() - base).astype(np.float64) for p in points}
    zero = np.zeros(table.num_rows)
    bounds = {(a, b): zero for a, b in [*zip(points, points[1:], strict=False), (points[0], points[-1])]}
    facts = {
        "reference": names[0],
        "method": same_domain.METHOD,
        "frequency_hz": freq,
        "frequency_source": source,
        "frequency_error": same_domain.LOCAL_HZ_ERROR,
    }
    status = np.zeros(table.num_rows, np.int8)
    return _Positions(pos, dict.fromkeys(points, zero), status, bounds, freq, facts, base)


def _synced(
    table: pa.Table,
    points: list[str],
    sync: str | os.PathLike[str] | Location,
    reference: str | None,
    method: str,
    stamp_margin: float,
) -> _Positions:
    """Positions with sync tables: each point translated from one anchor reading of the reference
    (cp_sync.translate's kernel), each stage's bound from the pair it spans."""
    from cp_sync.sync_table import read_sync
    from cp_sync.translate.records import default_reference, reference_hz_estimate
    from cp_sync.translate.relation import METHODS
    from cp_sync.translate.translator import Translator

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if not table.num_rows:
        raise ValueError("no record holds every stamp point: no waterfall")
    probes, reported = read_sync(sync)
    ref = reference or default_reference(table, points[-1])
    freq, source, hz_err = reference_hz_estimate(probes, ref, reported)
    tr = Translator(probes, ref, stamp_margin)
    n = table.num_rows
    anchor = np.full(n, _anchor(table, points, ref, probes), np.int64)
    refs = pa.repeat(pa.scalar(ref, pa.string()), n)
    pos, half, status = {}, {}, np.zeros(n, np.int8)
    for p in points:
        (res,) = tr.translate(anchor, refs, _tsc(table, p), table[node_column(p)], (method,))
        pos[p], half[p] = res.duration, res.bound
        status = np.maximum(status, res.status)
    bounds = {}
    for a, b in [*zip(points, points[1:], strict=False), (points[0], points[-1])]:
        (res,) = tr.translate(
            _tsc(table, a), table[node_column(a)], _tsc(table, b), table[node_column(b)], (method,)
        )
        status = np.maximum(status, res.status)
        est = pos[b] - pos[a]
        bound = np.minimum(half[a] + half[b], res.bound + np.abs(est - res.duration))
        # two readings of the reference's own counter: their difference is exact
        on_ref = _is(table, a, ref) & _is(table, b, ref)
        bounds[(a, b)] = np.where(on_ref, 0.0, bound)
    refused = {f"{m} {s} -> {d}": why for (s, d, m), why in sorted(tr.violations.items())}
    facts = {
        "reference": ref,
        "method": method,
        "frequency_hz": freq,
        "frequency_source": source,
        "frequency_error": hz_err,
        "refused": refused,
        "drift": tr.drift_notes(),
    }
    return _Positions(pos, half, status, bounds, freq, facts, int(anchor[0]))


def _tsc(table: pa.Table, point: str) -> np.ndarray:
    return table[tsc_column(point)].to_numpy().astype(np.int64, copy=False)


def _is(table: pa.Table, point: str, domain: str) -> np.ndarray:
    return pc.equal(table[node_column(point)], domain).to_numpy(zero_copy_only=False).astype(bool)


def _anchor(table: pa.Table, points: list[str], ref: str, probes: pa.Table) -> int:
    """One reading of the reference the positions count from: its earliest stamp in the records, else
    its earliest probe (a reading its relations cover either way)."""
    on_ref = [_tsc(table, p)[_is(table, p, ref)] for p in points]
    found = [int(v.min()) for v in on_ref if len(v)]
    if found:
        return min(found)
    own = [
        probes.filter(pc.equal(probes[d], ref))[c]
        for d, c in (("initiator", "c_i"), ("initiator", "c_k"), ("responder", "c_j"))
    ]
    mins = [pc.min(c).as_py() for c in own if len(c)]
    if not mins:
        raise ValueError(f"reference domain {ref!r}: no record stamp and no probe of it in the sync tables")
    return int(min(mins))


def _table(
    table: pa.Table, points: list[str], at: _Positions, notes: list[str], origin_tsc: int | None
) -> pa.Table:
    """The output table and its metadata, from every point's position."""
    keep = at.status < ST_NO_RELATION
    if not keep.all():
        notes.append(f"{int((~keep).sum()):,} records left out: no relation relates their stamps' domains")
        for pair, why in at.facts.get("refused", {}).items():
            notes.append(f"relation {pair} refused: {why}")
    counts = np.bincount(at.status[keep], minlength=len(STATUSES))
    not_ok = [f"{STATUSES[i]} {int(c):,}" for i, c in enumerate(counts) if i != ST_OK and c]
    if not_ok:
        notes.append(f"records whose bound is not guaranteed (status, docs/sync.md): {', '.join(not_ok)}")
    for pair, lines in at.facts.get("drift", {}).items():
        notes.extend(f"relation {pair}: {line}" for line in lines)
    notes.append(
        f"bounds exclude the reference frequency's own error ({at.facts['frequency_error']:.2e} of it, "
        f"{at.facts['frequency_source']})"
    )
    to_ns = 1e9 / at.hz
    first, last = points[0], points[-1]
    start = at.pos[first][keep]
    if origin_tsc is not None:
        origin = float(origin_tsc - at.anchor)
    else:
        origin = float(start.min()) if len(start) else 0.0
    cols: dict[str, Any] = {
        "tuple_id": table["tuple_id"].filter(pa.array(keep)).cast(pa.int64()),
        "t_s": pa.array((at.pos[last][keep] - origin) / at.hz),
        "e2e_ns": pa.array((at.pos[last][keep] - start) * to_ns),
        "e2e_bound_ns": pa.array(at.stage[(first, last)][keep] * to_ns),
    }
    stages = []
    for a, b in zip(points, points[1:], strict=False):
        cols[stage_column(a, b)] = pa.array((at.pos[b][keep] - at.pos[a][keep]) * to_ns)
        cols[bound_column(a, b)] = pa.array(at.stage[(a, b)][keep] * to_ns)
        stages.append({"from": a, "to": b, "label": stage_label(a, b)})
    meta = {
        "stages": stages,
        "points": points,
        "reference": at.facts["reference"],
        "origin_tsc": at.anchor + round(origin),
        "method": at.facts["method"],
        "frequency_hz": at.hz,
        "frequency_source": at.facts["frequency_source"],
        "notes": notes,
    }
    out = pa.table(cols).sort_by([("t_s", "ascending"), ("tuple_id", "ascending")])
    return out.replace_schema_metadata({WATERFALL_KEY: json.dumps(meta).encode()})


def waterfall_meta(table: pa.Table) -> dict[str, Any]:
    """The stages, points, reference and notes a waterfall table carries in its metadata."""
    raw = (table.schema.metadata or {}).get(WATERFALL_KEY)
    if raw is None:
        raise ValueError("not a waterfall table: no cloudprofiler.waterfall metadata")
    meta: dict[str, Any] = json.loads(raw)
    return meta


def waterfall_summary(table: pa.Table) -> list[dict[str, Any]]:
    """One row per stage, then end to end: from_point, to_point, label, count and the duration's
    p50/p90/p99/max and the bound's max (ns), from the table's columns."""
    meta = waterfall_meta(table)
    rows = [
        _summary_row(table, s["from"], s["to"], s["label"], stage_column(s["from"], s["to"]),
                     bound_column(s["from"], s["to"]))
        for s in meta["stages"]
    ]  # fmt: skip
    pts = meta["points"]
    rows.append(_summary_row(table, pts[0], pts[-1], "end to end", "e2e_ns", "e2e_bound_ns"))
    return rows


def _summary_row(table: pa.Table, a: str, b: str, label: str, col: str, bcol: str) -> dict[str, Any]:
    ns = table[col].to_numpy()
    bound = table[bcol].to_numpy()
    row: dict[str, Any] = {"from_point": a, "to_point": b, "label": label, "count": len(ns)}
    figures = [*np.percentile(ns, QUANTILES), ns.max(), bound.max()] if len(ns) else [np.nan] * 5
    keys = [*(f"p{q}_ns" for q in QUANTILES), "max_ns", "bound_max_ns"]
    row.update({k: float(v) for k, v in zip(keys, figures, strict=True)})
    return row


STAGE_HEADS = ("stage", "points", "count", "p50", "p90", "p99", "max", "bound max")


def stage_cells(row: dict[str, Any]) -> list[str]:
    """A waterfall_summary row as the stage table prints it (STAGE_HEADS)."""
    from cp_common.printable import format_duration

    figures = [row[f"p{q}_ns"] for q in QUANTILES] + [row["max_ns"], row["bound_max_ns"]]
    return [
        row["label"],
        f"{row['from_point']} -> {row['to_point']}",
        f"{row['count']:,}",
        *(format_duration(v) for v in figures),
    ]


def stage_table(table: pa.Table) -> Any:
    """The stage table (a rich Table) of a waterfall table: one line per stage, then end to end."""
    from rich.table import Table

    meta = waterfall_meta(table)
    t = Table(title=f"waterfall: reference {meta['reference']}, method {meta['method']}")
    for head in STAGE_HEADS:
        t.add_column(head, justify="left" if head in STAGE_HEADS[:2] else "right")
    rows = waterfall_summary(table)
    for i, row in enumerate(rows):
        t.add_row(*stage_cells(row), end_section=i == len(rows) - 2)
    return t


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["stage_table", "waterfall"])
