"""The generator against a real factory over ZeroMQ: exact rate, exact accounting, generator-bound runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from cp_source import bucket as bk
from cp_source.factory import FactoryHandle, start_factory
from cp_source.generator import run_generator


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[Callable[..., FactoryHandle]]:
    handles: list[FactoryHandle] = []

    def start(**kw: object) -> FactoryHandle:
        h = start_factory("tcp://127.0.0.1:0", tmp_path / f"spool{len(handles)}", **kw)  # type: ignore[arg-type]
        handles.append(h)
        return h

    yield start
    for h in handles:
        h.stop()


def _check_accounting(summary: dict) -> None:
    assert summary["offered"] == summary["emitted"] + summary["dropped"]
    for s in summary["senders"]:
        assert s["first_tuple_id"] == bk.tuple_id(s["id"], 0)
        assert s["next_tuple_id"] - s["first_tuple_id"] == s["emitted"] + s["dropped"]
        assert sum(c for _, c in s["dropped_ranges"]) == s["dropped"]
        assert s["eos_delivered"]


def test_achieved_rate_is_within_one_percent_at_a_sustainable_rate(
    factory: Callable[..., FactoryHandle],
) -> None:
    f = factory(workers=1)
    s = run_generator(f.endpoint, rate=200_000, duration=2.0, bucket=1000)
    assert s["offered"] == 400_000
    assert abs(s["achieved_rate"] - 200_000) <= 0.01 * 200_000, s
    assert s["generator_bound"] is False
    assert set(s) >= {"emitted", "dropped", "target_rate", "achieved_rate", "generator_bound", "senders"}
    assert set(s["senders"][0]) >= {"id", "first_tuple_id", "emitted", "dropped", "dropped_ranges"}
    _check_accounting(s)


def test_asking_far_more_than_it_can_offer_is_flagged_generator_bound(
    factory: Callable[..., FactoryHandle],
) -> None:
    f = factory(workers=1)
    s = run_generator(f.endpoint, rate=2e9, duration=0.2, bucket=1000)
    assert s["generator_bound"] is True
    assert s["achieved_rate"] < 0.99 * 2e9
    _check_accounting(s)


def test_generate_command_writes_the_summary(factory: Callable[..., FactoryHandle], tmp_path: Path) -> None:
    f = factory(workers=1)
    out = tmp_path / "run.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloudprofiler.cli",
            "generate",
            "--endpoint",
            f.endpoint,
            "--rate",
            "20000",
            "--duration",
            "0.5",
            "--bucket",
            "500",
            "--sender-base",
            "4242",
            "--summary",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    s = orjson.loads(out.read_bytes())
    assert s["offered"] == 10_000 and s["senders"][0]["id"] == 4242
    assert orjson.loads(r.stdout)["emitted"] == s["emitted"]
    _check_accounting(s)


def test_bad_arguments_are_one_line_errors() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloudprofiler.cli",
            "generate",
            "--rate",
            "100",
            "--duration",
            "1",
            "--workload",
            "tpch",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "unknown workload" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ValueError, match="rate"):
        run_generator("tcp://127.0.0.1:1", rate=0, duration=1)
    with pytest.raises(ValueError, match="sender ids"):
        run_generator("tcp://127.0.0.1:1", rate=10, duration=1, sender_base=bk.MAX_SENDER + 1)


def test_bad_or_busy_endpoints_are_clear_errors(
    factory: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="invalid endpoint"):
        run_generator("foo", rate=10, duration=1)
    f = factory(workers=1)
    with pytest.raises(OSError, match="cannot bind"):
        start_factory(f.endpoint, tmp_path / "other")
