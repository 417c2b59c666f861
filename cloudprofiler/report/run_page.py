"""A run directory and its one-page HTML report.

A run directory is what ``cloudprofiler demo``, ``maxrate`` and ``translate --report`` leave for
``cloudprofiler report``: ``run.json`` (the ledger, the verdicts, the sync quality, the machine and
the versions, and how to draw the latencies: pairs, warm-up, micro-batch ends, charted tables) and,
where there are latencies, ``latency.parquet`` (one translated row per record and pair of points, the
one source of the latency table and of its plots). ``report.html`` is written beside them: one page
with no outside address (inline CSS, inline SVG), so it opens the same from a laptop, a bucket or a mail.
"""

from __future__ import annotations

import html
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cp_store.location import Location

RUN_FILE = "run.json"
LATENCY_FILE = "latency.parquet"
REPORT_FILE = "report.html"
FORMAT = 1
VERSIONED = ("pyspark", "pyarrow", "numpy", "matplotlib", "cloudprofiler")


@dataclass(frozen=True)
class Plot:
    """One picture of the page: inline SVG, the line under it that says what to look for, and the
    figures it was drawn with (``values``, embedded as ``data-values`` for a reader or a test)."""

    name: str
    svg: str
    caption: str
    values: Any = field(default_factory=dict)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict[str, Any]:
    """The machine and the versions a run was made with (taken when the run is written)."""
    import native_tsc

    tsc = native_tsc.info()
    facts: dict[str, Any] = {
        "host": platform.node(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    facts |= {name: _version(name) for name in VERSIONED}
    facts |= {f"tsc {k}": tsc[k] for k in ("backend", "frequency_hz", "frequency_source", "domain_id")}
    return facts


def new_doc(kind: str, title: str) -> dict[str, Any]:
    """A run.json document: its kind (demo, maxrate, translate), title, time and machine."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return {"format": FORMAT, "kind": kind, "title": title, "created": now, "machine": machine_facts()}


def write_doc(run: Location, doc: Mapping[str, Any]) -> Location:
    """Write run.json into the run directory ``run`` (whole or not at all); where it went."""
    loc = run.join(RUN_FILE)
    loc.write_bytes(json.dumps(doc, indent=2, default=str).encode())
    return loc


def read_doc(run: Location) -> dict[str, Any]:
    """The run.json of run directory ``run``, checked to be one."""
    loc = run.join(RUN_FILE)
    if not loc.exists():
        raise ValueError(f"{run.uri}: not a run directory (no {RUN_FILE})")
    try:
        doc = json.loads(loc.read_bytes())
    except ValueError as e:
        raise ValueError(f"{loc.uri}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "kind" not in doc:
        raise ValueError(f"{loc.uri}: not a run.json of format {FORMAT}")
    return doc


# -- the page -------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1500px;color:#1d1d1f;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.sub{color:#666}.verdicts li{margin:2px 0}.bad{color:#b00020;font-weight:600}.good{color:#176b2c}
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}
td:not(.l){white-space:nowrap}
th{background:#f4f4f6}td.l,th.l{text-align:left}
.side{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
figure{margin:8px 0;max-width:100%}figure svg{max-width:100%;height:auto}
figcaption{color:#444;font-style:italic;margin-top:2px}
"""

_LAT_KEYS = ("p50_us", "p90_us", "p99_us", "max_us", "bound_median_us", "bound_max_us")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def table_html(rows: Sequence[Sequence[Any]], heads: Sequence[str] = (), title: str = "") -> str:
    """A plain table: the first column left-aligned (a label), the rest right (figures)."""
    cap = f"<caption class='l'>{_e(title)}</caption>" if title else ""
    head = "".join(f"<th class='{'l' if i == 0 else ''}'>{_e(h)}</th>" for i, h in enumerate(heads))
    body = "".join(
        "<tr>"
        + "".join(f"<td class='{'l' if i == 0 else ''}'>{_e(_cell(v))}</td>" for i, v in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table>{cap}{'<tr>' + head + '</tr>' if heads else ''}{body}</table>"


def latency_table_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The latency table (LatencySeries.row() rows) as the CLI prints it (summary's cells), and
    under it what its distinct stamps mean (stamp_notes): every cell carries ``data-q`` and its row
    ``data-path`` (``path [method, scenario]``), so a reader or a test can put the table beside the
    box plot's ``data-values``."""
    from cloudprofiler.report.summary import FIGURE_HEADS, STAMP_HEADS, figure_cells, stamp_cells, stamp_notes

    heads = ["path", "method", "scenario", "count", "ok", *STAMP_HEADS, *FIGURE_HEADS]
    out = [
        "<table class='latency'><tr>"
        + "".join(f"<th class='{'l' if i < 3 else ''}'>{_e(h)}</th>" for i, h in enumerate(heads))
        + "</tr>"
    ]
    quantities = ("count", "ok", "from_stamps", "to_stamps", *(k.removesuffix("_us") for k in _LAT_KEYS))
    for r in rows:
        points = f"{r['from_point']} -> {r['to_point']}"
        path = f"{r['label']} ({points})" if r.get("label") else points
        cells = [f"<td class='l'>{_e(v)}</td>" for v in (path, r["method"], r["scenario"])]
        texts = [f"{r['count']:,}", f"{r['ok']:,}", *stamp_cells(r), *figure_cells(r)]
        cells += [f"<td data-q='{q}'>{_e(t)}</td>" for q, t in zip(quantities, texts, strict=True)]
        key = f"{path} [{r['method']}, {r['scenario']}]"  # as the box plot's values name it
        out.append(f"<tr data-path='{_e(key)}'>{''.join(cells)}</tr>")
    notes = "".join(f"<p class='sub stamps'>{_e(line)}</p>" for line in stamp_notes(rows))
    return "".join(out) + "</table>" + notes


def figure_html(plot: Plot) -> str:
    """One plot: its SVG, the figures it drew (``data-values``) and its caption."""
    values = _e(json.dumps(plot.values, default=str))
    return (
        f"<figure class='plot' data-plot='{_e(plot.name)}' data-values='{values}'>{plot.svg}"
        f"<figcaption>{_e(plot.caption)}</figcaption></figure>"
    )


def _verdicts(doc: Mapping[str, Any]) -> str:
    items = []
    for v in doc.get("verdicts", []):
        text, good = (v["text"], v.get("good")) if isinstance(v, dict) else (v, None)
        cls = "" if good is None else (" class='good'" if good else " class='bad'")
        items.append(f"<li{cls}>{_e(text)}</li>")
    return f"<ul class='verdicts'>{''.join(items)}</ul>" if items else "<p>no verdict</p>"


def render(
    doc: Mapping[str, Any],
    latency_rows: Sequence[Mapping[str, Any]] = (),
    plots: Sequence[Plot] = (),
    charts: Sequence[tuple[Mapping[str, Any], Plot]] = (),
    waterfall: str = "",
) -> str:
    """The page: title, verdicts, the waterfall (its HTML section, where there is one), ledger, the
    latency table beside its first plot and the other plots under them, each charted table beside its
    chart, the sync quality, the machine and versions."""
    lat = doc.get("latency") or {}
    parts = [
        f"<h1>{_e(doc['title'])}</h1><p class='sub'>{_e(doc['kind'])} run, {_e(doc.get('created', ''))}</p>",
        "<h2>Verdicts</h2>" + _verdicts(doc),
        waterfall,
    ]
    ledger = doc.get("ledger")
    if ledger:
        parts.append(
            f"<h2>{_e(ledger.get('title', 'Ledger'))}</h2>" + table_html(ledger["rows"], ("what", "value"))
        )
    if latency_rows or plots:
        side = [f"<div>{latency_table_html(latency_rows)}</div>"]
        side += [figure_html(p) for p in plots[:1]]
        parts.append(f"<h2>{_e(lat.get('title', 'Latency'))}</h2><div class='side'>{''.join(side)}</div>")
        parts += [figure_html(p) for p in plots[1:]]
    for spec, plot in charts:
        parts.append(
            f"<h2>{_e(spec['title'])}</h2><div class='side'><div>"
            f"{table_html(spec['rows'], spec['columns'])}</div>{figure_html(plot)}</div>"
        )
    for key, title in (("sync", "Sync quality"), ("machine", "Machine and versions")):
        facts = doc.get(key) or {}
        if facts:
            parts.append(f"<h2>{title}</h2>" + table_html(list(facts.items()), ("what", "value")))
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(doc['title'])}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


# -- the plots ------------------------------------------------------------------------------------------

BOX_CAPTION = (
    "the table's records: box p25 to p75, line p50, whiskers min to max, markers p90 and p99 "
    "(the same figures as the table); a long top whisker over a small box is a few slow records"
)
ERROR_CAPTION = (
    "each dot is one record at the time it was done, the orange band its error bound; a sawtooth is "
    "the micro-batch cadence (a batch's records wait for its end), a rising trend a query falling behind"
)


def latency_plots(series: Sequence[Any], lat: Mapping[str, Any]) -> list[Plot]:
    """The box plot of the table's records and the per-record latency with its bound, from ``series``
    (the table's source); ``lat``: run.json's latency entry (unit, warm-up, micro-batch ends, x label)."""
    from cloudprofiler.report.summary import box_figure, box_values, error_figure, svg_text

    unit = lat.get("unit", "ms")
    steady = [s.steady() for s in series]
    box = box_figure(steady, unit, "the table's records")
    values = {
        s.path + f" [{s.key['method']}, {s.key['scenario']}]": v
        for s, v in zip(series, box_values(box), strict=False)
    }
    warm = lat.get("warmup_s")
    err = error_figure(
        series,
        unit,
        None if warm is None else tuple(warm),
        lat.get("xlabel", "seconds since the run's start"),
        lat.get("batches_s"),
    )
    return [
        Plot("latency", svg_text(box), BOX_CAPTION, values),
        Plot("latency_error", svg_text(err), ERROR_CAPTION),
    ]


def chart_plot(spec: Mapping[str, Any]) -> Plot:
    """A charted table's picture: each ``y`` column against the ``x`` column, drawn from the rows the
    table shows (``values``: the plotted columns, as drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cloudprofiler.report.summary import svg_text

    cols = list(spec["columns"])
    x = [float(r[cols.index(spec["x"])]) for r in spec["rows"]]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    values: dict[str, list[float]] = {spec["x"]: x}
    for name in spec["y"]:
        y = [float(r[cols.index(name)]) for r in spec["rows"]]
        values[name] = y
        ax.plot(x, y, "o-", ms=4, label=name)
    ax.set_xlabel(spec.get("xlabel", spec["x"]))
    ax.set_ylabel(spec.get("ylabel", ""))
    ax.ticklabel_format(style="plain", useOffset=False)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return Plot(spec.get("name", spec["title"]), svg_text(fig), spec.get("caption", ""), values)


def waterfall_section(run: Location, doc: Mapping[str, Any], phases_for: Any = None) -> str:
    """The waterfall's section of the page from the run directory's waterfall.parquet ("" without
    one): run.json's ``waterfall`` entry gives the warm-up's tuple ids (``warmup_ids``: [first, next)
    ranges), ``phases_for(run, doc)`` Spark's phases on the run's axis (PhaseBars, or None)."""
    from cloudprofiler.report.waterfall_plot import WATERFALL_FILE, summary_html, waterfall_of

    loc = run.join(WATERFALL_FILE)
    if not loc.exists():
        return ""
    import pyarrow.parquet as pq

    with loc.fs.open_input_file(loc.path) as f:
        table = pq.read_table(f)
    phases = phases_for(run, doc) if phases_for is not None else None
    wf = waterfall_of(table, warmup_ids=(doc.get("waterfall") or {}).get("warmup_ids", []))
    return section_html(wf, phases, dict(doc.get("latency") or {}), summary_html(table, wf))


def section_html(wf: Any, phases: Any, lat: dict[str, Any], summary: str = "") -> str:
    """The report's waterfall (a waterfall_plot.Waterfall; ``phases``: PhaseBars or None): the
    line on what dominates, the table beside its bar, the notes, the stages over time with Spark's
    phases beneath, then ``summary`` (each stage over its own values, as translate prints it)."""
    from cloudprofiler.report.waterfall_plot import (
        TITLE,
        dominance_line,
        plots,
        quantile_rows,
        table_html,
        table_note,
    )

    rows = quantile_rows(wf)
    head = f"<h2>{_e(TITLE)}</h2><p class='dominant'>{_e(dominance_line(wf, rows))}</p>"
    if not rows:
        return head + f"<p class='sub'>{_e(table_note(wf))}</p>"
    bar, when = (Plot(*p) for p in plots(wf, rows, phases, lat))
    notes = "".join(f"<p class='sub'>{_e(n)}</p>" for n in (table_note(wf), *wf.notes))
    side = f"<div class='side'><div>{table_html(wf, rows)}{notes}</div>{figure_html(bar)}</div>"
    return head + side + figure_html(when) + summary


def build(run: Location, plots_for: Any = None, phases_for: Any = None) -> Location:
    """Write ``report.html`` into run directory ``run`` from its run.json, latency.parquet and
    waterfall.parquet; where it went. ``plots_for(series, latency_entry)`` draws the latency plots
    (default: latency_plots); the table's rows and every plot come from the same LatencySeries.
    ``phases_for(run, doc)``: Spark's phases under the waterfall (waterfall_section)."""
    from cloudprofiler.report.summary import latency_series

    doc = read_doc(run)
    lat_meta = doc.get("latency") or {}
    rows: list[dict[str, Any]] = []
    plots: list[Plot] = []
    parquet = run.join(LATENCY_FILE)
    if lat_meta and parquet.exists():
        import pyarrow.parquet as pq

        with parquet.fs.open_input_file(parquet.path) as f:
            lat = pq.read_table(f)
        pairs = [tuple(p) for p in lat_meta["pairs"]] if lat_meta.get("pairs") else None
        series = latency_series(lat, pairs)
        rows = [s.steady().row() for s in series if len(s.steady().duration_ns)]
        plots = (plots_for or latency_plots)(series, lat_meta)
    charts = [(spec, chart_plot(spec)) for spec in doc.get("charts", [])]
    out = run.join(REPORT_FILE)
    section = waterfall_section(run, doc, phases_for)
    out.write_bytes(render(doc, rows, plots, charts, section).encode())
    return out
