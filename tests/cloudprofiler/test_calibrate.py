"""calibrate: maxrate's search with the profiler's sink, then into Spark's noop sink, and their ratio."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cloudprofiler.cli import main
from cloudprofiler.jobs.calibrate import calibration_line, finite, load_calibration

RATE = 1000.0


@pytest.mark.long
@pytest.mark.timeout(600)  # two searches of one 1 s trial each, after maxrate's warm-up loads
def test_calibrate_runs_both_searches_in_one_session(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.json"
    tiny = ["--start", "1000", "--max-rate", "1000", "--max-steps", "1", "--duration", "1", "--bucket", "250"]
    tiny += ["--grace", "20"]  # the mechanics, not the rate: a latency spike on a loaded machine passes
    code = main(["calibrate", *tiny, "--out", str(tmp_path / "work"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # strict JSON: maxrate's infinite default --max-rate and any NaN are null, for every reader
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert doc["kind"] == "calibration" and doc["query"] == "cloudprofiler source -> YSB join"
    assert doc["rate_with_profiler"] == doc["rate_noop"] == RATE
    assert doc["ratio"] == doc["rate_with_profiler"] / doc["rate_noop"]
    assert len(doc["load_average"]["before"]) == 3 and doc["cpus"] >= 1
    with_, noop = doc["searches"]["cloudprofiler"], doc["searches"]["noop"]
    trial = with_["trials"][-1]
    # the profiler's search: its sink wrote every tuple of the trial (and the warm-ups'), and charged it
    cpu = doc["profiler_cpu"]
    assert cpu == with_["cpu"] and cpu["tuples"] > trial["received_after_drain"] > 0
    assert cpu["parts_cpu_s"]["sink_write"] > 0 and cpu["parts_cpu_s"]["source_read"] > 0
    assert 0 < cpu["profiler_share"] < 1 and cpu["profiler_cpu_s"] <= cpu["run_cpu_s"]
    # the noop search ran the same source into a sink that is not ours: nothing charged to a sink
    assert noop["cpu"]["tuples"] == 0 and noop["cpu"]["parts_cpu_s"]["sink_write"] == 0
    assert noop["cpu"]["parts_cpu_s"]["source_read"] > 0
    assert noop["attempts"][-1]["filtered"] == noop["attempts"][-1]["emitted"] > 0  # read, none counted
    assert "ratio" in printed and "the profiler used" in printed
    # what a report carries
    assert calibration_line(load_calibration(str(out))).endswith("into noop, ratio 1.00")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["calibrate", "--sink", "/tmp/x"], "--sink: not an option of calibrate"),
        (["calibrate", "--latency-slope", "0.1"], "--latency-slope: not an option of calibrate"),
        (["calibrate", "--tolerance", "2"], "--tolerance 2.0: expected a fraction"),
        (
            ["demo", "--calibration", "/nonexistent/cal.json"],
            "--calibration /nonexistent/cal.json: cannot read",
        ),
    ],
)
def test_bad_calibrate_options_are_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, *(["--out", str(tmp_path / "d")] if argv[0] == "demo" else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_json_that_is_not_a_calibration_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"max_rate": 1}')
    from cloudprofiler.errors import CommandError

    with pytest.raises(CommandError, match="not the JSON of cloudprofiler calibrate"):
        load_calibration(str(tmp_path / "x.json"))
    assert calibration_line(None).startswith("no calibration of this query was run")


def test_the_demo_prints_its_cpu_share_and_the_calibration_it_was_given(tmp_path: Path) -> None:
    from cloudprofiler.jobs.demo_cost import calibration_summary, cost_lines
    from cp_common.self_cost import QueryCost, cost_doc

    cost = QueryCost(
        {"sink_write": 300_000_000, "stamps": 100_000_000, "source_read": 500_000_000}, 200_000, 5
    )
    cal = {
        "kind": "calibration",
        "created": "2026-11-28T10:00:00Z",
        "query": "cloudprofiler source -> YSB join",
        "rate_with_profiler": 9000.0,
        "rate_noop": 12000.0,
        "ratio": 0.75,
        "generator_caps": {"cloudprofiler": None, "noop": 16000.0},
        "searches": {"cloudprofiler": {}, "noop": {}},
    }
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    totals = {"profiler_cost": cost_doc(cost, 8.0), "calibration": calibration_summary(
        load_calibration(str(tmp_path / "cal.json"))
    )}  # fmt: skip
    share, calibration = cost_lines(totals)
    assert share.startswith("the profiler used 5.0% of the run's CPU (2,000 ns per tuple: stamps 0.10 s")
    assert share.endswith("the source's read, its stamp included, 6.2%")
    assert calibration == (
        "calibration (2026-11-28T10:00:00Z, cloudprofiler source -> YSB join): 9,000 tuples/s with the "
        "profiler's sink, 12,000 tuples/s into noop, ratio 0.75; the generator capped the noop search"
    )
    assert "searches" not in totals["calibration"]
    assert cost_lines({}) == [
        "the profiler's own CPU was not measured in this run",
        calibration_line(None),
    ]


def test_the_json_is_strict() -> None:
    # maxrate's default --max-rate is infinite: json.dumps would write Infinity, which strict readers refuse
    doc = {"settings": {"max_rate": float("inf")}, "x": [float("nan"), 1.5, (2.0, float("-inf"))]}
    assert (
        json.dumps(finite(doc), allow_nan=False)
        == '{"settings": {"max_rate": null}, "x": [null, 1.5, [2.0, null]]}'
    )
