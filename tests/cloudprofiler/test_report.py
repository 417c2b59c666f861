"""The HTML report of a run: self-contained, its tables and plots from the same records, rendered."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloudprofiler.cli import main
from cloudprofiler.report.summary import format_duration
from tests.helpers.demo_run import HZ, MEASURED, START, WARM_IDS, write_run
from tests.helpers.waterfall_run import STAGES, phase_table, waterfall_table


class _Page(HTMLParser):
    """The parts of a report a reader sees: the latency table's cells, each figure and its caption."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, dict[str, str]] = {}
        self.waterfall: dict[str, dict[str, str]] = {}  # the waterfall table's cells per quantile
        self.dominant = ""
        self._in_dominant = False
        self.figures: list[dict[str, Any]] = []
        self.svgs = 0
        self._row: str | None = None
        self._q: str | None = None
        self._caption = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-path"):
            self._row = str(a["data-path"])
            self.cells[self._row] = {}
        elif tag == "tr" and a.get("data-quantile"):
            self._row = "waterfall " + str(a["data-quantile"])
            self.waterfall[str(a["data-quantile"])] = {}
        elif tag == "p" and a.get("class") == "dominant":
            self._in_dominant = True
        elif tag == "td" and self._row and a.get("data-q"):
            self._q = str(a["data-q"])
        elif tag == "figure":
            self.figures.append({"name": a["data-plot"], "values": json.loads(a["data-values"] or "{}")})
        elif tag == "svg":
            self.svgs += 1
        elif tag == "figcaption":
            self._caption = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "td":
            self._q = None
        elif tag == "figcaption":
            self._caption = False
        elif tag == "p":
            self._in_dominant = False

    def handle_data(self, data: str) -> None:
        if self._row and self._row.startswith("waterfall ") and self._q:
            self.waterfall[self._row.removeprefix("waterfall ")][self._q] = data
        elif self._row and self._q:
            self.cells[self._row][self._q] = data
        elif self._in_dominant:
            self.dominant += data
        elif self._caption:
            self.figures[-1]["caption"] = data


def demo_run_dir(tmp_path: Path) -> tuple[Path, list[Any]]:
    """A demo-shaped run directory (synthetic stamps, real translation) with run.json and report.html."""
    import pyarrow.compute as pc

    from cloudprofiler.jobs.demo_report import RunClock, demo_series, latencies, with_run_time, write_results
    from cloudprofiler.report.latency import DEFAULT_PAIRS
    from cloudprofiler.report.run_page import new_doc
    from cloudprofiler.spark_phases import write_phases
    from cp_store.location import resolve

    records, windows, sync, ref, _ = write_run(tmp_path)
    lat, _ = latencies(records, windows, sync, ref.domain)
    clock = RunClock(ref.apply(START), HZ, (MEASURED - START) / HZ)
    lat = with_run_time(lat, [WARM_IDS], clock)
    series = demo_series(lat)
    doc = new_doc("demo", "a demo-shaped run")
    doc["verdicts"] = [{"text": "sustained 1 tuples/s", "good": True}]
    doc["ledger"] = {"title": "ledger", "rows": [["emitted", "700"]]}
    doc["latency"] = {
        "unit": "ms",
        "pairs": [list(p) for p in (*DEFAULT_PAIRS, ("gen", "window", "windowed output"))],
        "warmup_s": list(clock.warmup),
        "batches_s": [34.0, 35.0, 36.0],
    }
    doc["sync"] = {"reference TSC domain": ref.domain}
    out = tmp_path / "run"
    out.mkdir()
    # the waterfall of the end-to-end records, and Spark's phases on the same clock (the run's start)
    e2e = lat.filter(pc.and_(pc.equal(lat["from_point"], "gen"), pc.equal(lat["to_point"], "sink")))
    ids, t_s = e2e["tuple_id"].to_numpy(), e2e["t_s"].to_numpy()
    waterfall = waterfall_table(ids, t_s, origin_tsc=clock.start_tsc, hz=HZ, reference=ref.domain)
    write_phases(phase_table(clock.start_tsc, HZ, ref.domain, PHASE_STARTS), out / "spark_phases.parquet")
    doc["waterfall"] = {"query_id": "q-latency", "warmup_ids": [WARM_IDS]}
    written = write_results(resolve(out), lat, series, clock.warmup, doc, waterfall)
    assert written[-1].uri.endswith("/run/report.html")
    return out, series


PHASE_STARTS = [30.0 + 0.5 * b for b in range(16)]  # the latency query's batches (s since the start)
ADVICE = {"waiting in the spool": "a shorter trigger interval", "the query": "a cheaper query"}


def check_waterfall(page: _Page, run: Path, text: str) -> None:
    """The waterfall's table is its bar (data-q against data-values), each row the stages of the
    record at that quantile of end to end; Spark's phases are drawn on the records' time axis."""
    import pyarrow.parquet as pq

    wf = pq.read_table(run / "waterfall.parquet")
    ids = wf["tuple_id"].to_numpy()
    keep = np.flatnonzero((ids < WARM_IDS[0]) | (ids >= WARM_IDS[1]))  # the warm-up is not in the table
    columns = [f"stage_{a}_{b}_ns" for a, b, _ in STAGES]
    stages = np.column_stack([wf[c].to_numpy() for c in columns])[keep]
    ranked = np.lexsort((ids[keep], stages.sum(axis=1)))
    drawn = next(f for f in page.figures if f["name"] == "waterfall")["values"]
    bar, per = drawn["bars"], {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}[drawn["unit"]]
    assert drawn["unit"] == "ms"  # the unit that suits the records' end to end
    assert list(page.waterfall) == ["p50", "p90", "p99", "max"] == list(bar)
    for (q, cells), rank in zip(page.waterfall.items(), (249, 449, 494, 499), strict=True):
        i = ranked[rank]  # nearest rank of 500 records
        assert cells["record"] == str(ids[keep][i])
        assert cells["e2e"] == format_duration(stages[i].sum())  # the stages add up to the end to end
        for j, col in enumerate(columns):
            assert cells[col] == format_duration(bar[q][col] * per) == format_duration(stages[i, j]), (q, col)
    p50, p99 = (stages[ranked[r]] for r in (249, 494))
    for q, row, part in zip(("p50", "p99"), (p50, p99), page.dominant.split("; "), strict=True):
        label = STAGES[int(np.argmax(row))][2]
        assert part.startswith(f"at {q} ({format_duration(row.sum())} end to end) {label} dominates "
                               f"({format_duration(row.max())}, {row.max() / row.sum():.0%}): "
                               f"{ADVICE[label]}"), part  # fmt: skip
    # beside it, the table translate --waterfall prints, of the same records
    from cp_sync.translate.waterfall import STAGE_HEADS, stage_cells, waterfall_summary

    tables = _Tables()
    tables.feed(text)
    (printed,) = [t for t in tables.tables if t["heads"] == list(STAGE_HEADS)]
    assert printed["rows"] == [stage_cells(r) for r in waterfall_summary(wf.take(keep))]
    when = next(f for f in page.figures if f["name"] == "waterfall_time")["values"]
    top, low = when["xlim"]
    assert top == low and top[0] <= float(wf["t_s"].to_numpy().min()) and top[1] >= PHASE_STARTS[-1]
    # the latency query's batches alone, each at its start on the run's clock, 400 ms long
    trig = when["phases"]["triggerExecution"]
    assert [round(a, 6) for a, _ in trig] == PHASE_STARTS
    assert [round(b - a, 6) for a, b in trig] == [0.4] * len(PHASE_STARTS)
    assert [round(a, 6) for a, _ in when["phases"]["addBatch"]] == [round(x + 0.07, 6) for x in PHASE_STARTS]


def check_page(text: str, series: list[Any]) -> _Page:
    """No outside address; at least 3 pictures, each captioned; the box plot drew the table's figures."""
    assert not re.search(r"https?:|<link|<script|src=|@import|url\((?!#)", text, re.I)
    page = _Page()
    page.feed(text)
    assert page.svgs >= 2 and len(page.figures) == page.svgs
    assert all(f.get("caption") for f in page.figures)
    box = next(f for f in page.figures if f["name"] == "latency")
    steady = [s for s in series if len(s.steady().duration_ns)]
    keys = [f"{s.path} [{s.key['method']}, {s.key['scenario']}]" for s in steady]
    assert list(page.cells) == keys == list(box["values"])
    for key, drawn in box["values"].items():
        cells = page.cells[key]
        assert [cells[q] for q in ("p50", "p90", "p99", "max")] == [
            format_duration(drawn[q] * 1e6) for q in ("p50", "p90", "p99", "max")
        ], key
    # ... and both are the steady-state records' own percentiles and distinct stamps
    for s, key in zip(steady, keys, strict=True):
        ns = s.steady().figured().duration_ns
        assert page.cells[key]["p99"] == format_duration(np.percentile(ns, 99))
        assert page.cells[key]["count"] == f"{len(s.steady().duration_ns):,}"
        assert page.cells[key]["from_stamps"] == f"{len(np.unique(s.steady().from_tsc)):,}"
    return page


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """One demo-shaped run directory for the tests of this module (its drawing is the cost)."""
    return demo_run_dir(tmp_path_factory.mktemp("demo-run"))


@pytest.mark.long  # drawing the demo's three figures twice: ~15 s on a busy 2-core machine
def test_the_demo_report_is_one_page_whose_plots_drew_its_table(demo_run: Any, capsys: Any) -> None:
    out, series = demo_run
    text = (out / "report.html").read_text()
    check_waterfall(check_page(text, series), out, text)
    # cloudprofiler report RUN rebuilds it from run.json and latency.parquet alone
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {out / 'report.html'}"
    page = check_page((out / "report.html").read_text(), series)
    check_waterfall(page, out, (out / "report.html").read_text())
    assert [f["name"] for f in page.figures] == ["waterfall", "waterfall_time", "latency", "latency_error",
                                                 "timeline"]  # fmt: skip
    assert [c["count"] for c in page.cells.values()] == ["500", "500", "500", "4"]


def test_report_refuses_a_directory_without_run_json(tmp_path: Path, capsys: Any) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"cloudprofiler report: error: {tmp_path}: not a run directory (no run.json)"
    )


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _open(browser: str, page: Path, shot: Path, size: str) -> list[str]:
    """Open ``page`` in headless Chromium, screenshot it to ``shot``; the console's lines."""
    run = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={shot.parent / 'profile'}",
         f"--screenshot={shot}", f"--window-size={size}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    return [ln for ln in run.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]


def _dom(browser: str, page: Path, tmp_path: Path) -> str:
    """The document headless Chromium built from ``page``, serialized (--dump-dom)."""
    run = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'dom'}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and "</html>" in run.stdout, run.stderr[-2000:]
    return run.stdout


@pytest.mark.long  # the demo's figures and three Chromium starts
def test_the_report_renders_in_headless_chromium(demo_run: Any, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium, chromium-browser or google-chrome on PATH (.ci/run installs chromium)")
    import matplotlib.image as mpimg

    # the console check sees an error where there is one
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body>x<script>console.error('boom')</script></body></html>")
    assert any("boom" in ln for ln in _open(browser, bad, tmp_path / "bad.png", "300,200"))
    out, series = demo_run
    shot = tmp_path / "shot.png"
    console = _open(browser, out / "report.html", shot, "1200,2000")
    assert not console, console
    # the page as Chromium parsed it: the waterfall's table equals its bar, Spark's phases share its axis
    dom = _dom(browser, out / "report.html", tmp_path)
    check_waterfall(check_page(dom, series), out, dom)
    img = mpimg.imread(shot)
    assert img.shape[:2] == (2000, 1200)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50, len(colours)  # text, tables and plots, not a blank page
    blank = mpimg.imread(tmp_path / "bad.png")  # a page with one letter: few colours
    assert len(np.unique((blank[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) < 50


def test_translate_report_writes_a_run_directory(tmp_path: Path, capsys: Any) -> None:
    from cloudprofiler.report.summary import latency_series

    records, _, sync, ref, _ = write_run(tmp_path)
    run, out = tmp_path / "run", tmp_path / "lat.parquet"
    argv = ["translate", "--records", str(records), "--sync", str(sync), "--from", "gen", "--to", "sink",
            "--reference", ref.domain, "--out", str(out), "--method", "minrtt,naive",
            "--report", str(run)]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {run / 'report.html'}"
    import pyarrow.parquet as pq

    series = latency_series(pq.read_table(run / "latency.parquet"))
    assert pq.read_table(run / "latency.parquet").equals(pq.read_table(out))
    page = check_page((run / "report.html").read_text(), series)
    names = [f["name"] for f in page.figures]
    assert names[0] == "waterfall" and names[-2:] == ["latency", "latency_error"], names
    assert [c["count"] for c in page.cells.values()] == ["700", "700"]  # minrtt and naive, every record
    # the records' waterfall first: its table is its bar, each row adding up to its end to end
    drawn = page.figures[0]["values"]
    per = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}[drawn["unit"]]
    assert list(page.waterfall) == ["p50", "p90", "p99", "max"] == list(drawn["bars"])
    for q, cells in page.waterfall.items():
        bar = drawn["bars"][q]
        assert bar and all(cells[col] == format_duration(v * per) for col, v in bar.items()), q


def test_cloudprofiler_report_draws_a_run_s_waterfall_with_spark_s_phases_on_its_clock(
    tmp_path: Path, capsys: Any
) -> None:
    """A run directory with a waterfall and Spark's phases (no latency table): `cloudprofiler report`
    puts the waterfall first, its table equal to its bar, the phases on the waterfall's own axis."""
    import pyarrow.parquet as pq

    from cloudprofiler.report.run_page import new_doc, write_doc
    from cloudprofiler.spark_phases import write_phases
    from cp_store.location import resolve

    origin, ref = 5 * 10**12, "driver@9"
    ids = np.concatenate([np.arange(500), np.arange(*WARM_IDS)])
    t_s = np.random.default_rng(5).uniform(29.0, 38.0, len(ids))
    table = waterfall_table(ids, t_s, origin_tsc=origin, hz=HZ, reference=ref)
    pq.write_table(table, tmp_path / "waterfall.parquet")
    write_phases(phase_table(origin, HZ, ref, PHASE_STARTS), tmp_path / "spark_phases.parquet")
    doc = new_doc("translate", "a waterfall") | {
        "waterfall": {"query_id": "q-latency", "warmup_ids": [WARM_IDS]}
    }
    write_doc(resolve(tmp_path), doc)
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {tmp_path / 'report.html'}"
    text = (tmp_path / "report.html").read_text()
    page = _Page()
    page.feed(text)
    assert [f["name"] for f in page.figures] == ["waterfall", "waterfall_time"]
    assert text.index("Where every millisecond goes") < text.index("<figure")  # the first section
    check_waterfall(page, tmp_path, text)


def test_maxrate_report_charts_the_trials_its_table_lists(tmp_path: Path) -> None:
    import argparse

    from cloudprofiler.jobs.rate_search import SearchResult, Step
    from cloudprofiler.report.runs import write_maxrate_run
    from cp_store.location import resolve

    steps = [Step(10_000.0, 50_000, 0, 0, 50_000, False, 9_990.0, duration=5.0),
             Step(20_000.0, 100_000, 7, 0, 99_000, False, 19_990.0, duration=5.0,
                  verdict="drop")]  # fmt: skip
    result = SearchResult(10_000.0, "bisect", steps, "the next rate dropped")
    page_loc = write_maxrate_run(
        resolve(tmp_path / "m"), result, steps, argparse.Namespace(duration=5.0), "q"
    )
    text = Path(page_loc.path).read_text()
    assert not re.search(r"https?:|<link|<script|src=|@import|url\((?!#)", text, re.I)
    page = _Page()
    page.feed(text)
    (chart,) = page.figures
    assert chart["values"] == {"trial": [1.0, 2.0], "offered (tuples/s)": [10_000.0, 20_000.0],
                               "achieved (tuples/s)": [9_990.0, 19_990.0],
                               "taken (tuples/s)": [10_000.0, 19_800.0]}  # fmt: skip
    assert "<td class=''>19,800</td>" in text and "maximum sustainable rate: 10,000 tuples/s" in text


class _Tables(HTMLParser):
    """Every table of a page: the heading above it, its header cells and its rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self._heading = ""
        self._in: str | None = None  # "h2", "th" or "td" while inside one

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._heading, self._in = "", "h2"
        elif tag == "table":
            self.tables.append({"title": self._heading, "heads": [], "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("th", "td"):
            self._in = tag
            cells = self.tables[-1]["heads"] if tag == "th" else self.tables[-1]["rows"][-1]
            cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "th", "td"):
            self._in = None
        elif tag == "table":
            self.tables[-1]["rows"] = [r for r in self.tables[-1]["rows"] if r]

    def handle_data(self, data: str) -> None:
        if self._in == "h2":
            self._heading += data
        elif self._in == "th":
            self.tables[-1]["heads"][-1] += data
        elif self._in == "td":
            self.tables[-1]["rows"][-1][-1] += data


WHOLE = re.compile(r"-?\d{1,3}(,\d{3})*")  # tuples and tuples/s: 40,000
SECONDS = re.compile(r"\d+\.\d{3}|-")  # seconds: 2.490, or - where there is none


def filtering_run_page(tmp_path: Path) -> tuple[Path, list[Any]]:
    """The maxrate page of a filtering query's search (three trials, an ingestion rate); its steps."""
    import argparse

    from cloudprofiler.jobs.rate_search import SearchResult, Step
    from cloudprofiler.report.runs import write_maxrate_run
    from cp_store.location import resolve

    # a query that keeps about a fifth of the tuples: sustained at 20,000 (4,146 kept per second), a
    # backlog at 40,000 (landed after the grace: 12,000 still pending when it ran out)
    steps = [Step(20_000.0, 100_000, 0, 0, 20_732, False, 19_996.4, duration=5.0, landing=1.2, grace=2.19,
                  filtered=79_268),
             Step(40_000.0, 200_000, 0, 0, 37_600, False, 39_990.0, duration=5.0, landing=2.49, grace=2.19,
                  filtered=150_400, verdict="backlog"),
             Step(30_000.0, 150_000, 0, 3, 30_000, False, 29_990.0, duration=5.0, landing=None, grace=2.15,
                  filtered=119_997, verdict="lost")]  # fmt: skip
    result = SearchResult(20_000.0, "bisect", steps, "bracketed")
    ingestion = (
        [[0.5, 4_100.25, 20_000.0], [1.0, 4_200.0, 20_000.0], [7.25, 0.0, 0.0]],
        "per-micro-batch counts",
    )
    page_loc = write_maxrate_run(
        resolve(tmp_path / "m"), result, steps, argparse.Namespace(duration=5.0), "q", ingestion
    )
    return Path(page_loc.path), steps


def test_maxrate_report_of_a_filtering_query_balances_every_trial(tmp_path: Path) -> None:
    """A filtering query's page: filtered beside received, each trial's ledger and the totals balance
    on the page, one number format, and the trials' and the ingestion rate's plots drew their tables."""
    from cloudprofiler.report.runs import INGESTION_COLUMNS, TRIAL_COLUMNS

    page_path, steps = filtering_run_page(tmp_path)
    text = page_path.read_text()
    assert not re.search(r"https?:|<link|<script|src=|@import|url\((?!#)", text, re.I)
    parsed = _Tables()
    parsed.feed(text)
    tables = {t["title"].split(" (")[0]: t for t in parsed.tables}
    trials = tables["every trial"]
    assert trials["heads"] == TRIAL_COLUMNS
    col = {name: i for i, name in enumerate(TRIAL_COLUMNS)}
    number = {name for name in TRIAL_COLUMNS if name not in ("trial", "landing (s)", "grace (s)", "verdict")}
    for row, step in zip(trials["rows"], steps, strict=True):
        for name in number:
            assert WHOLE.fullmatch(row[col[name]]), (name, row[col[name]])
        for name in ("landing (s)", "grace (s)"):
            assert SECONDS.fullmatch(row[col[name]]), (name, row[col[name]])
        n = {name: int(row[col[name]].replace(",", "")) for name in number}
        # the ledger balances on the page: every emitted tuple is lost, received, filtered or pending
        assert n["emitted"] == n["lost"] + n["received"] + n["filtered"] + n["pending"]
        assert (n["received"], n["filtered"], n["pending"]) == (step.received, step.filtered, step.pending)
        assert n["taken (tuples/s)"] == round((step.received + step.filtered) / 5.0)
        assert row[col["verdict"]] == step.verdict
    assert [r[col["pending"]] for r in trials["rows"]] == ["0", "12,000", "0"]
    assert [r[col["landing (s)"]] for r in trials["rows"]] == ["1.200", "2.490", "-"]
    assert "30,000.000" not in text and "40,000.000" not in text
    ledger = dict(tables["Ledger of every trial"]["rows"])
    total = {k.split(" ")[0]: int(v.replace(",", "")) for k, v in ledger.items()}
    assert total["emitted"] == 450_000 == sum(total[k] for k in ("lost", "received", "filtered", "pending"))
    # each chart drew its table's columns
    page = _Page()
    page.feed(text)
    charts = {f["name"]: f["values"] for f in page.figures}
    assert list(charts) == ["trials", "ingestion"]
    for name, heads in (("trials", TRIAL_COLUMNS), ("ingestion", INGESTION_COLUMNS)):
        table = next(t for t in parsed.tables if t["heads"] == heads)
        for column, drawn in charts[name].items():
            cells = [float(r[heads.index(column)].replace(",", "")) for r in table["rows"]]
            assert cells == drawn, (name, column)
    assert charts["ingestion"]["ingested (tuples/s)"] == [4_100.0, 4_200.0, 0.0]
    assert charts["ingestion"]["time (s)"] == [0.5, 1.0, 7.25]


@pytest.mark.long  # one Chromium start
def test_the_maxrate_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium, chromium-browser or google-chrome on PATH (.ci/run installs chromium)")
    import matplotlib.image as mpimg

    page, _ = filtering_run_page(tmp_path)
    shot = tmp_path / "shot.png"
    console = _open(browser, page, shot, "1200,1600")
    assert not console, console
    img = mpimg.imread(shot)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50, len(colours)  # tables and two charts, not a blank page
