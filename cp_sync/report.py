"""Summaries and plots of translated latencies."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

_KEYS = ["from_point", "to_point", "method", "scenario"]


def _groups(out: pa.Table) -> list[tuple[dict[str, str], Any]]:
    df = out.select([*_KEYS, "duration_ns", "bound_ns"]).to_pandas()
    return [(dict(zip(_KEYS, k, strict=True)), g) for k, g in df.groupby(_KEYS, sort=True)]


def summarize(out: pa.Table) -> list[dict[str, Any]]:
    """Per (from, to, method, scenario): count, latency p50/p90/p99/max and median/max bound (us)."""
    rows = []
    for key, g in _groups(out):
        lat = g["duration_ns"].to_numpy() / 1e3
        bnd = g["bound_ns"].to_numpy() / 1e3
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        rows.append(
            key
            | {
                "count": len(lat),
                "p50_us": p50,
                "p90_us": p90,
                "p99_us": p99,
                "max_us": float(lat.max()),
                "bound_median_us": float(np.median(bnd)),
                "bound_max_us": float(bnd.max()),
            }
        )
    return rows


def print_summary(rows: list[dict[str, Any]], title: str) -> None:
    """A rich table of summarize()'s rows."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in (
        "points",
        "method",
        "scenario",
        "count",
        "p50 us",
        "p90 us",
        "p99 us",
        "max us",
        "bound med us",
        "bound max us",
    ):
        t.add_column(c, justify="right" if "us" in c or c == "count" else "left")
    for r in rows:
        t.add_row(
            f"{r['from_point']}->{r['to_point']}",
            r["method"],
            r["scenario"],
            f"{r['count']:,}",
            *(
                f"{r[k]:.3f}"
                for k in ("p50_us", "p90_us", "p99_us", "max_us", "bound_median_us", "bound_max_us")
            ),
        )
    console = Console()
    # Wide enough for every column when the output is a file or a pipe (rich's default there is 80).
    Console(width=max(console.width, 150)).print(t)


def plot(out: pa.Table, path: str) -> None:
    """Latency box plot per method and scenario, the error-bound distribution beside it (as Fig. 17)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lats, bnds, labels = [], [], []
    for key, g in _groups(out):
        lats.append(g["duration_ns"].to_numpy() / 1e3)
        bnds.append(g["bound_ns"].to_numpy() / 1e3)
        labels.append(f"{key['from_point']}->{key['to_point']}\n{key['method']} {key['scenario']}")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(min(16.0, 5.0 + 0.9 * len(labels)), 5.0))
    ax1.boxplot(lats, tick_labels=labels, showfliers=False)
    ax1.set_ylabel("latency (us)")
    ax1.set_title("translated latency")
    ax2.boxplot(bnds, tick_labels=labels, showfliers=False)
    ax2.set_ylabel("error bound (us)")
    ax2.set_title("error bound per record")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=7, labelrotation=60)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
