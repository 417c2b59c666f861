"""cp_common.process_times: off unless asked; one line per mark, across processes, in time order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cp_common.process_times import TRACE_ENV, mark, mark_process_start, read_trace


def test_marks_are_written_only_when_the_trace_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.txt"
    monkeypatch.delenv(TRACE_ENV, raising=False)
    mark("nobody asked")
    assert not trace.exists()
    monkeypatch.setenv(TRACE_ENV, str(trace))
    mark("second", at=200.5)
    mark("first", at=100.25)
    assert read_trace(trace) == [(100.25, os.getpid(), "first"), (200.5, os.getpid(), "second")]


def test_a_child_process_appends_to_the_same_trace_with_its_start_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.txt"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    mark("parent: before")
    script = (
        "from cp_common.process_times import mark, mark_process_start\n"
        "mark_process_start('child')\n"
        "mark('child: ran')\n"
    )
    subprocess.run([sys.executable, "-c", script], env=env, timeout=120, check=True)
    mark_process_start("parent")  # this process started before the child
    events = read_trace(trace)
    assert len(events) == 4
    by_event = {ev: (t, pid) for t, pid, ev in events}
    assert by_event["parent: before"][1] == by_event["parent: process started"][1] == os.getpid()
    assert by_event["child: process started"][1] == by_event["child: ran"][1] != os.getpid()
    assert by_event["parent: process started"][0] <= by_event["parent: before"][0]
    assert by_event["child: process started"][0] <= by_event["child: ran"][0] + 0.02  # /proc ticks: 10 ms
    assert by_event["parent: before"][0] <= by_event["child: ran"][0]
