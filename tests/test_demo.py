"""``cloudprofiler demo`` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# the installed console script's entry point (python -m would load cli.py twice, as __main__ too)
CLI = [sys.executable, "-c", "import sys; from cloudprofiler.cli import main; sys.exit(main())"]


@pytest.mark.long
def test_demo_prints_consistent_totals(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    run = subprocess.run(
        [*CLI, "demo", "--duration", "3", "--rate", "20000",
         "--out", str(tmp_path / "demo"), "--summary", str(summary)],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    t = json.loads(summary.read_text())
    assert t["offered"] == 60_000 == t["emitted"] + t["dropped"]
    assert t["rows_read"] == t["published"] == t["emitted"] - t["lost_in_transit"]
    assert t["consistent"] is True
    assert t["windows"] >= 1 and t["window_campaign_counts"] >= t["windows"]
    assert 0 < t["views_counted"] < t["rows_read"]
    for label, value in (("emitted", t["emitted"]), ("rows read by Spark", t["rows_read"]),
                         ("lost in transit", t["lost_in_transit"]), ("views counted", t["views_counted"])):
        line = next(ln for ln in run.stdout.splitlines() if label in ln)
        assert f"{value:,}" in line
    assert "every emitted tuple read once" in run.stdout


def test_demo_rejects_bad_arguments() -> None:
    run = subprocess.run([*CLI, "demo", "--duration", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["cloudprofiler demo: error: --duration -1.0: expected 0 < "
                                               "seconds <= 3600"]
