"""Summaries, the latency table and plots of translated latencies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO, Any, Literal

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from cp_sync.translate import STATUSES

_KEYS = ["from_point", "to_point", "method", "scenario"]


def _groups(out: pa.Table) -> list[tuple[dict[str, str], Any]]:
    cols = [*_KEYS, "duration_ns", "bound_ns"] + (["status"] if "status" in out.column_names else [])
    df = out.select(cols).to_pandas()
    return [(dict(zip(_KEYS, k, strict=True)), g) for k, g in df.groupby(_KEYS, sort=True)]


def summarize(out: pa.Table) -> list[dict[str, Any]]:
    """Per (from, to, method, scenario): count, how many are ``ok``, latency p50/p90/p99/max and
    median/max bound (us) over every record with figures (all statuses: see status_rows)."""
    rows = []
    for key, g in _groups(out):
        lat = g["duration_ns"].to_numpy() / 1e3
        bnd = g["bound_ns"].to_numpy() / 1e3
        count = len(lat)
        ok = int((g["status"] == "ok").sum()) if "status" in g else count
        fin = np.isfinite(lat)  # a record with no relation has no figures; it is counted, not summarised
        lat, bnd = lat[fin], bnd[fin]
        if not len(lat):
            lat = bnd = np.array([np.nan])
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        rows.append(
            key
            | {
                "count": count,
                "ok": ok,
                "p50_us": p50,
                "p90_us": p90,
                "p99_us": p99,
                "max_us": float(lat.max()),
                "bound_median_us": float(np.median(bnd)),
                "bound_max_us": float(bnd.max()),
            }
        )
    return rows


def status_rows(out: pa.Table) -> list[dict[str, Any]]:
    """Records per (from, to, method) and status: one row each, every status a key (zero included)."""
    keys = ["from_point", "to_point", "method"]
    if "status" not in out.column_names:
        out = out.append_column("status", pa.array(["ok"] * out.num_rows, pa.string()))
    g = out.group_by([*keys, "status"]).aggregate([("status", "count")]).to_pylist()
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in g:
        k = tuple(str(r[c]) for c in keys)
        row = rows.setdefault(k, dict(zip(keys, k, strict=True)) | dict.fromkeys(STATUSES, 0))
        row[str(r["status"])] = row.get(str(r["status"]), 0) + int(r["status_count"])
    return [rows[k] for k in sorted(rows)]


def status_table(rows: Sequence[Mapping[str, Any]], title: str = "records per status") -> Table:
    """The status table: one line per status_rows() row, a column per status."""
    t = Table(title=title)
    for c in ("path", "method", *STATUSES):
        t.add_column(c, justify="left" if c in ("path", "method") else "right")
    for r in rows:
        t.add_row(
            f"{r['from_point']} -> {r['to_point']}", str(r["method"]), *(f"{r.get(s, 0):,}" for s in STATUSES)
        )
    return t


Unit = Literal["us", "ms"]
_SCALE: dict[str, float] = {"us": 1.0, "ms": 1e-3}  # summarize() gives microseconds
_FIGURES = ("p50_us", "p90_us", "p99_us", "max_us", "bound_median_us", "bound_max_us")
_HEADS = ("p50", "p90", "p99", "max", "bound med", "bound max")


def latency_table(rows: Sequence[Mapping[str, Any]], title: str, unit: Unit = "us") -> Table:
    """The latency table: one line per summarize() row (latency_report's rows add a ``label``).

    Columns: path (``label (from -> to)``, or ``from -> to`` without a label), method, scenario, count,
    latency p50/p90/p99/max and the median and max error bound, in ``unit`` with 3 decimals.
    """
    if unit not in _SCALE:
        raise ValueError(f"unit must be us or ms, got {unit!r}")
    scale = _SCALE[unit]
    t = Table(title=title)
    for c in ("path", "method", "scenario", "count", *(f"{h} {unit}" for h in _HEADS)):
        t.add_column(c, justify="left" if c in ("path", "method", "scenario") else "right")
    for r in rows:
        points = f"{r['from_point']} -> {r['to_point']}"
        t.add_row(
            f"{r['label']} ({points})" if r.get("label") else points,
            str(r["method"]),
            str(r["scenario"]),
            f"{r['count']:,}",
            *(f"{r[k] * scale:,.3f}" for k in _FIGURES),
        )
    return t


def print_table(table: Table, file: IO[str] | None = None) -> None:
    """Print ``table`` at its full width, also when the output is a pipe or a file (rich's default is 80)."""
    wide = Console(width=10_000)
    need = Measurement.get(wide, wide.options, table).maximum
    Console(file=file, width=max(Console(file=file).width, need)).print(table)


def print_latency_table(
    rows: Sequence[Mapping[str, Any]], title: str, unit: Unit = "us", file: IO[str] | None = None
) -> None:
    """``print_table(latency_table(rows, title, unit), file)``."""
    print_table(latency_table(rows, title, unit), file)


_UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))
NEGLIGIBLE_NS = 1.0  # bounds below a nanosecond: one TSC domain, shown as zero rather than as 4e-7 us


def time_unit(values_ns: np.ndarray) -> tuple[str, float]:
    """The unit (and nanoseconds per unit) that shows ``values_ns`` with at most 3 digits before the
    point: s, ms, us or ns, so no axis reads "1e7 us"."""
    v = np.abs(np.asarray(values_ns, dtype=np.float64))
    v = v[np.isfinite(v)]
    top = float(v.max()) if len(v) else 0.0
    for unit, ns in _UNITS:
        if top >= ns:
            return unit, ns
    return "ns", 1.0


def _plain_axis(ax: Any) -> None:
    # never an offset or a 1eN multiplier above the axis: the unit in the label says it all
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)


def _bound_axis(ax: Any, bnds: list[np.ndarray], labels: list[str]) -> None:
    """The error-bound box plot; bounds that are all below a nanosecond are drawn as zero, said so."""
    every = np.concatenate(bnds) if bnds else np.zeros(0)
    if not len(every) or float(np.nanmax(np.abs(every))) < NEGLIGIBLE_NS:
        ax.boxplot([np.zeros(max(1, len(b))) for b in bnds], tick_labels=labels, showfliers=False)
        ax.set_ylim(-0.05, 1.0)
        ax.set_ylabel("error bound (ns)")
        ax.text(
            0.5, 0.6, "every bound is below 1 ns:\nboth stamps of each pair\nfrom one TSC domain",
            transform=ax.transAxes, ha="center", va="center",
        )  # fmt: skip
        return
    unit, ns = time_unit(every)
    ax.boxplot([b / ns for b in bnds], tick_labels=labels, showfliers=False)
    ax.set_ylabel(f"error bound ({unit})")


def plot(out: pa.Table, path: str) -> None:
    """Latency box plot per method and scenario, the error-bound distribution beside it (as Fig. 17).

    Axes are in the unit that suits the data (s, ms, us or ns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lats, bnds, labels = [], [], []
    for key, g in _groups(out):
        fin = np.isfinite(g["duration_ns"].to_numpy())
        lats.append(g["duration_ns"].to_numpy()[fin])
        bnds.append(g["bound_ns"].to_numpy()[fin])
        labels.append(f"{key['from_point']}->{key['to_point']}\n{key['method']} {key['scenario']}")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(min(16.0, 5.0 + 0.9 * len(labels)), 5.0))
    unit, ns = time_unit(np.concatenate(lats) if lats else np.zeros(0))
    ax1.boxplot([v / ns for v in lats], tick_labels=labels, showfliers=False)
    ax1.set_ylabel(f"latency ({unit})")
    ax1.set_title("translated latency")
    _bound_axis(ax2, bnds, labels)
    ax2.set_title("error bound per record")
    for ax in (ax1, ax2):
        _plain_axis(ax)
        ax.tick_params(axis="x", labelsize=7, labelrotation=60)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_with_error(out: pa.Table, path: str, points: int = 4000) -> None:
    """Latency of each record with its error bound as a band (the paper's latency-with-error view):
    one panel per pair of points, records in tuple-id order (at most ``points`` of them, evenly taken)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(out)
    fig, axes = plt.subplots(len(groups), 1, figsize=(9.0, 2.6 * max(1, len(groups))), squeeze=False)
    for ax, (key, g) in zip(axes[:, 0], groups, strict=True):
        g = g[np.isfinite(g["duration_ns"].to_numpy())]
        step = max(1, len(g) // points)
        lat, bnd = g["duration_ns"].to_numpy()[::step], g["bound_ns"].to_numpy()[::step]
        unit, ns = time_unit(np.concatenate([lat + bnd, lat - bnd]))
        x = np.arange(len(lat)) * step
        ax.fill_between(x, (lat - bnd) / ns, (lat + bnd) / ns, color="tab:orange", alpha=0.35, lw=0,
                        label="latency +- error bound")  # fmt: skip
        ax.plot(x, lat / ns, lw=0.8, color="tab:blue", label="latency")
        tiny = " (every bound below 1 ns)" if len(bnd) and float(np.nanmax(bnd)) < NEGLIGIBLE_NS else ""
        ax.set_title(f"{key['from_point']} -> {key['to_point']} ({key['method']}, {key['scenario']}){tiny}",
                     fontsize=9)  # fmt: skip
        ax.set_ylabel(f"latency ({unit})")
        _plain_axis(ax)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("record (in tuple-id order)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
