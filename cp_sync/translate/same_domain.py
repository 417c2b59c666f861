"""Latency without sync tables: both stamps of every pair read one TSC, so no translation is needed.

When each record's two stamps carry the same domain id (``cp_node_<point>``), its duration is the
difference of the two readings of one counter, converted at that counter's frequency: the error
bound from synchronisation is zero (method ``same-domain``, scenario ``reference``, status ``ok``).
The frequency is this machine's calibrated one (``native_tsc.frequency_hz``, the value the sink's
pc handler and the sync agents use) for stamps taken on this machine; for another single domain it
must be given (``--hz``, which ``cloudprofiler tsc`` prints on that machine). Records whose stamps
lie in different domains cannot be compared without sync tables: refused in one line naming how
many and which domains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cp_common.stamp_columns import node_column, tsc_column
from cp_sync.translate.relation import SCENARIOS, STATUSES

METHOD = "same-domain"
# The relative error allowed for this machine's frequency: what a sync agent reports for it too
# (cp_sync.translate.records.REPORTED_HZ_ERROR); the bound from synchronisation itself is zero.
LOCAL_HZ_ERROR = 1e-4
_SHOWN_PAIRS = 4  # domain pairs named in the error; the rest are counted


def check_one_domain(points: pa.Table, from_point: str, to_point: str, looked: str) -> list[str]:
    """The domains of the records (sorted), each record's two stamps in one; else one line naming how
    many records cross domains, the pairs of domains, and that --sync is needed (none in ``looked``)."""
    ds, de = points[node_column(from_point)], points[node_column(to_point)]
    cross = points.filter(pc.not_equal(ds, de))
    if cross.num_rows:
        a, b = node_column(from_point), node_column(to_point)
        pairs = cross.group_by([a, b]).aggregate([([], "count_all")])
        rows = sorted(pairs.to_pylist(), key=lambda r: (-r["count_all"], r[a], r[b]))
        shown = ", ".join(f"{r[a]} -> {r[b]}: {r['count_all']:,}" for r in rows[:_SHOWN_PAIRS])
        more = f", {len(rows) - _SHOWN_PAIRS} more pairs" if len(rows) > _SHOWN_PAIRS else ""
        raise ValueError(
            f"{cross.num_rows:,} of {points.num_rows:,} records have their {from_point} and {to_point} "
            f"stamps in different TSC domains ({shown}{more}) and there are no sync tables in {looked} "
            f"(the sink's option sync=auto writes them there): give --sync, where cloudprofiler sync run "
            f"--out wrote them"
        )
    return sorted(set(pc.unique(ds).to_pylist()))


def domain_frequency(domains: Sequence[str], given_hz: float | None) -> tuple[float, str]:
    """(counts per second, source) of the one counter the records were stamped with.

    This machine's calibrated frequency when the domain is this machine's; else ``given_hz``; else
    one line saying what to do.
    """
    import native_tsc

    local = native_tsc.domain_id()
    if len(domains) != 1:
        raise ValueError(
            f"the records were stamped in {len(domains)} TSC domains ({', '.join(domains[:_SHOWN_PAIRS])}), "
            f"each pair within one: give --sync to put them on one clock"
        )
    if domains[0] == local:
        return float(native_tsc.frequency_hz()), f"this machine, {native_tsc.info()['frequency_source']}"
    if given_hz is not None:
        if not given_hz > 0:
            raise ValueError(f"--hz must be above 0, got {given_hz}")
        return float(given_hz), "--hz"
    raise ValueError(
        f"the records were stamped in TSC domain {domains[0]}, not this machine's ({local}): run translate "
        f"there, give its frequency with --hz (cloudprofiler tsc prints it), or pass --sync"
    )


def translate_same_domain(
    points: pa.Table, from_point: str, to_point: str, hz: float, keys: Sequence[str] = ()
) -> pa.Table:
    """The output table of cp_sync.translate.records.translate_points, for records in one domain:
    duration = (to - from) cycles at ``hz``, bound 0 (``bound_ns_with_hz_error`` allows LOCAL_HZ_ERROR
    of the frequency)."""
    n = points.num_rows
    dur = points[tsc_column(to_point)].to_numpy().astype(np.int64) - points[tsc_column(from_point)].to_numpy()
    cycles = dur.astype(np.float64)
    zero = np.zeros(n, np.float64)
    with_hz = np.abs(cycles) * LOCAL_HZ_ERROR * 1e9 / hz / (1.0 - LOCAL_HZ_ERROR)
    cols: dict[str, Any] = {
        "tuple_id": points["tuple_id"],
        "from_point": pa.array([from_point] * n, pa.string()),
        "to_point": pa.array([to_point] * n, pa.string()),
        "from_domain": points[node_column(from_point)],
        "to_domain": points[node_column(to_point)],
        "from_tsc": points[tsc_column(from_point)],
        "to_tsc": points[tsc_column(to_point)],
        "reference": points[node_column(to_point)],
        "method": pa.array([METHOD] * n, pa.string()),
        "scenario": pa.array([SCENARIOS[0]] * n, pa.string()),
        "status": pa.array([STATUSES[0]] * n, pa.string()),
        "duration_cycles": pa.array(cycles),
        "bound_cycles": pa.array(zero),
        "duration_ns": pa.array(cycles * 1e9 / hz),
        "bound_ns": pa.array(zero),
        "bound_ns_with_hz_error": pa.array(with_hz),
    }
    return pa.table(cols | {k: points[k] for k in keys})
