"""Records and sync tables in, one row per record and method out: the reference's frequency, the output
table and the facts of a run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cp_common.stamp_columns import node_column, tsc_column
from cp_store.location import Location
from cp_store.manifests import batch_gaps
from cp_store.published_run import Published, published
from cp_sync.sync_table import minrtt
from cp_sync.translate.record_points import read_points
from cp_sync.translate.relation import METHODS, SCENARIOS, STAMP_MARGIN, STATUSES
from cp_sync.translate.translator import Translator

SYNC_DIR = "_sync"  # where the sink's option sync=auto writes the probe tables, under its path
# The columns translate writes; a key column (--by) of one of these names is refused.
OUTPUT_COLUMNS = (
    "tuple_id",
    "from_point",
    "to_point",
    "from_domain",
    "to_domain",
    "from_tsc",
    "to_tsc",
    "reference",
    "method",
    "scenario",
    "status",
    "duration_cycles",
    "bound_cycles",
    "duration_ns",
    "bound_ns",
    "bound_ns_with_hz_error",
)


def reference_hz(table: pa.Table, reference: str, reported: dict[str, float]) -> tuple[float, str]:
    """Reference counts per second from its MinRTT probes of the first and last phase (else reported)."""
    hz, source, _ = reference_hz_estimate(table, reference, reported)
    return hz, source


REPORTED_HZ_ERROR = 1e-4  # relative error assumed for a frequency an agent reported (not measured here)


def reference_hz_estimate(
    table: pa.Table, reference: str, reported: dict[str, float]
) -> tuple[float, str, float]:
    """(counts per second, source, relative error) of the reference's counter.

    From its own MinRTT probes of the first and last phase: the cycles between their sends over the
    CLOCK_MONOTONIC_RAW ns read just before each send. The relative error allowed for is both probes'
    round trips (in cycles) over the cycles between them: the ns and the counter are read a moment
    apart, and a send that waited shows in its round trip. The rate of CLOCK_MONOTONIC_RAW itself
    against true seconds cannot be seen from the probes and is not included.
    """
    own = table.filter(pc.equal(table["initiator"], reference))
    if own.num_rows:
        best = minrtt(own).sort_by("ns_i")
        if best.num_rows >= 2:
            c = _np(best, "c_i")
            ns = _np(best, "ns_i")
            rtt = _np(best, "rtt")
            if ns[-1] - ns[0] >= 10_000_000:  # 10 ms: the ns reads' jitter stays below 1e-4
                err = float(rtt[0] + rtt[-1]) / float(c[-1] - c[0])
                return float(c[-1] - c[0]) * 1e9 / float(ns[-1] - ns[0]), "minrtt", err
    if reference in reported:
        return reported[reference], "agent", REPORTED_HZ_ERROR
    raise ValueError(f"no frequency for reference domain {reference!r}: no probes from it and none reported")


def _np(t: pa.Table, col: str) -> np.ndarray:
    return t[col].to_numpy().astype(np.int64)


# -- records -------------------------------------------------------------------------------------
# read_points (cp_sync.translate.record_points) reads them from a path or URI.


def default_reference(points: pa.Table, to_point: str) -> str:
    """The domain most end stamps were taken in."""
    counts = pc.value_counts(points[node_column(to_point)]).to_pylist()
    if not counts:
        raise ValueError("no records to translate")
    return str(max(counts, key=lambda c: (c["counts"], c["values"]))["values"])


def translate_points(
    points: pa.Table,
    sync: pa.Table,
    from_point: str,
    to_point: str,
    reference: str,
    hz: float,
    methods: tuple[str, ...] = METHODS,
    hz_error: float = 0.0,
    stamp_margin: float = STAMP_MARGIN,
    keys: Sequence[str] = (),
) -> tuple[pa.Table, Translator]:
    """The output table: one row per record and method with duration, bound and status.

    ``bound_ns`` is ``bound_cycles`` converted at ``hz`` (the frequency's own error excluded);
    ``bound_ns_with_hz_error`` also covers a relative error ``hz_error`` of ``hz``. ``from_tsc`` and
    ``to_tsc`` are the raw stamps, each in its own domain (their distinct values are the durations'
    resolution: cloudprofiler.report.summary.LatencySeries). The ``keys``
    columns of ``points`` are carried as they are, after the others.
    """
    ys = points[tsc_column(from_point)].to_numpy()
    ye = points[tsc_column(to_point)].to_numpy()
    ds_ = points[node_column(from_point)]
    de = points[node_column(to_point)]
    tr = Translator(sync, reference, stamp_margin)
    parts = []
    scen_dict = pa.array([SCENARIOS[k] for k in sorted(SCENARIOS)])
    status_dict = pa.array(list(STATUSES))
    to_ns = 1e9 / hz
    for res in tr.translate(ys, ds_, ye, de, methods):
        n = len(res.index)
        with_hz = (res.bound + (np.abs(res.duration) + res.bound) * hz_error) * to_ns / (1.0 - hz_error)
        parts.append(
            pa.table(
                {
                    "tuple_id": points["tuple_id"],
                    "from_point": pa.array([from_point] * n, pa.string()),
                    "to_point": pa.array([to_point] * n, pa.string()),
                    "from_domain": ds_,
                    "to_domain": de,
                    "from_tsc": points[tsc_column(from_point)],
                    "to_tsc": points[tsc_column(to_point)],
                    "reference": pa.array([reference] * n, pa.string()),
                    "method": pa.array([res.method] * n, pa.string()),
                    "scenario": pa.DictionaryArray.from_arrays(pa.array(res.scenario), scen_dict).cast(
                        pa.string()
                    ),
                    "status": pa.DictionaryArray.from_arrays(pa.array(res.status), status_dict).cast(
                        pa.string()
                    ),
                    "duration_cycles": pa.array(res.duration),
                    "bound_cycles": pa.array(res.bound),
                    "duration_ns": pa.array(res.duration * to_ns),
                    "bound_ns": pa.array(res.bound * to_ns),
                    "bound_ns_with_hz_error": pa.array(with_hz),
                    **{k: points[k] for k in keys},
                }
            )
        )
    return pa.concat_tables(parts), tr


def translate_records(
    records_dir: str | os.PathLike[str] | Location | Published,
    sync_dir: str | os.PathLike[str] | Location | None,
    from_point: str,
    to_point: str,
    reference: str | None = None,
    methods: tuple[str, ...] = METHODS,
    stamp_margin: float = STAMP_MARGIN,
    keys: Sequence[str] = (),
    hz: float | None = None,
) -> tuple[pa.Table, dict[str, Any]]:
    """Read records and sync tables (paths or URIs), translate, and return the output table and facts.

    Without sync tables (``sync_dir`` None) every record's two stamps must share one TSC domain:
    durations at that domain's frequency (this machine's, else ``hz``), bound 0, method
    ``same-domain`` (cp_sync.translate.same_domain). ``keys``: record columns (the sink's
    ``keepColumns``) carried into the output, for summaries by key.

    Facts: reference, frequency_hz, its source and relative error (frequency_error), the relations
    that could not be formed (refused: why), the spans found not affine (drift), the number of
    records per method and status (status_counts), the records' printable URI (records) and, for a
    sink path, the batch ids its committed ones skip (batch_gaps: (first, last) ranges; their
    records are in no output).
    """
    from cp_sync.sync_table import read_sync

    clash = [k for k in keys if k in OUTPUT_COLUMNS]
    if clash:
        raise ValueError(
            f"cannot group by {', '.join(clash)}: translate's output has a column of that name "
            f"(rename it in the query before the sink)"
        )
    run = published(records_dir)  # resolved once, its manifests read once
    points = read_points(run, from_point, to_point, keys)
    # A sink path's committed batch ids that skip some: their records are in no output (said beside it).
    root = run.root
    gaps = {"records": root.uri, "batch_gaps": batch_gaps(run.manifests)}
    if sync_dir is None:
        looked = root.join(SYNC_DIR).uri
        out, facts = _same_domain(points, from_point, to_point, reference, keys, hz, looked)
        return out, {**facts, **gaps}
    sync, reported = read_sync(sync_dir)
    ref = reference or default_reference(points, to_point)
    hz, source, hz_err = reference_hz_estimate(sync, ref, reported)
    out, tr = translate_points(
        points, sync, from_point, to_point, ref, hz, methods, hz_err, stamp_margin, keys
    )
    refused = {f"{m} {s} -> {d}": why for (s, d, m), why in sorted(tr.violations.items())}
    return out, {
        "reference": ref,
        "frequency_hz": hz,
        "frequency_source": source,
        "frequency_error": hz_err,
        "refused": refused,
        "drift": tr.drift_notes(),
        "status_counts": status_counts(out),
        **gaps,
    }


def _same_domain(
    points: pa.Table,
    from_point: str,
    to_point: str,
    reference: str | None,
    keys: Sequence[str],
    given_hz: float | None,
    looked: str,
) -> tuple[pa.Table, dict[str, Any]]:
    """translate_records without sync tables (none in ``looked`` either): every pair in one TSC domain."""
    from cp_sync.translate import same_domain

    if not points.num_rows:
        raise ValueError("no records to translate")
    domains = same_domain.check_one_domain(points, from_point, to_point, looked)
    if reference is not None and reference not in domains:
        raise ValueError(f"--reference {reference}: the records were stamped in {', '.join(domains)}")
    hz, source = same_domain.domain_frequency(domains, given_hz)
    out = same_domain.translate_same_domain(points, from_point, to_point, hz, keys)
    return out, {
        "reference": domains[0],
        "frequency_hz": hz,
        "frequency_source": source,
        "frequency_error": same_domain.LOCAL_HZ_ERROR,
        "refused": {},
        "drift": {},
        "status_counts": status_counts(out),
    }


def status_counts(out: pa.Table) -> dict[str, dict[str, int]]:
    """Records per method and status, every status listed (zero included)."""
    g = out.group_by(["method", "status"]).aggregate([("status", "count")])
    counts: dict[str, dict[str, int]] = {}
    for m, s, c in zip(
        g["method"].to_pylist(), g["status"].to_pylist(), g["status_count"].to_pylist(), strict=True
    ):
        counts.setdefault(str(m), dict.fromkeys(STATUSES, 0))[str(s)] = int(c)
    return counts
