"""The executor check on the local session: each Python (the driver's workers, the executors') says in
one line, naming its host, whether it can run cloudprofiler. Other Pythons are real interpreters:
a bare virtual environment, a path that does not exist, a copy of the package without its C extension.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyspark
import pytest
from packaging.requirements import Requirement

import native_tsc
from cloudprofiler import executor_probe
from cloudprofiler.cli import main
from cloudprofiler.executor_check import (
    ExecutorCheckError,
    check_executors,
    failed_task_status,
    require_executors,
)
from cloudprofiler.executor_probe import address_toward, probe, spark_problem
from tests.helpers.packed_env import source_copy

HOST = socket.gethostname()
SHIP = "ship it with spark.archives or pip install it on every node (see docs/deployment.md)"


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with nothing installed: a virtual environment without site packages (nor pip)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


@contextmanager
def python_workers(spark: Any, python: str) -> Iterator[None]:
    """Spark's Python workers (driver side and executors) run ``python`` for what starts meanwhile.

    Without the working directory on their path: local workers run in the driver's directory, this
    checkout, whose packages would be found there."""
    sc = spark.sparkContext
    before, sc.pythonExec = sc.pythonExec, python
    sc.environment["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        sc.pythonExec = before
        del sc.environment["PYTHONSAFEPATH"]


@pytest.mark.long  # fresh Python workers import pyarrow, PySpark's SQL and the reader: seconds when cold
def test_the_check_on_the_local_session_lists_this_host(spark: Any) -> None:
    statuses = check_executors(spark)
    assert [s.role for s in statuses] == ["driver", "executor"]
    cp = importlib.metadata.version("cloudprofiler")
    for s in statuses:
        assert (s.host, s.python, s.spark, s.cloudprofiler, s.problem) == (
            HOST,
            sys.executable,
            pyspark.__version__,
            cp,
            "",
        )
        assert s.tsc_backend == native_tsc.BACKEND
    driver, executor = statuses
    assert executor.address == address_toward(spark.sparkContext.getConf().get("spark.driver.host"))
    assert executor.line() == (
        f"executor on host {HOST} ({executor.address}): ok (Python {sys.executable}, "
        f"Spark {pyspark.__version__}, cloudprofiler {cp}, TSC {native_tsc.BACKEND})"
    )
    assert require_executors(spark) == statuses


@pytest.mark.long  # two fresh Pythons import PySpark: a few seconds
def test_a_python_without_cloudprofiler_fails_the_check_in_one_line(spark: Any, bare: str) -> None:
    with python_workers(spark, bare):
        statuses = check_executors(spark)
        with pytest.raises(ExecutorCheckError) as err:
            require_executors(spark)
    missing = f"cloudprofiler is not installed in its Python ({bare}); {SHIP}"
    assert [(s.role, s.host, s.problem) for s in statuses] == [
        ("driver", HOST, missing),
        ("executor", HOST, missing),
    ]
    assert str(err.value) == (
        f"driver on host {HOST}: {missing} (and 1 more: cloudprofiler check-executors lists them)"
    )


def test_a_python_that_does_not_start_is_named_in_one_line(spark: Any, tmp_path: Path) -> None:
    ghost = str(tmp_path / "no-python")
    with python_workers(spark, ghost):
        statuses = check_executors(spark)
    driver, executor = statuses
    assert driver.line() == (
        f"driver on host {HOST}: its Python workers ({ghost}) do not start in the driver's directory "
        f"({os.getcwd()}): error=2, No such file or directory; the source's driver side runs in them: "
        f"start the driver where {ghost} is a Python with cloudprofiler (see docs/deployment.md)"
    )
    # local mode: the executor is the driver, on the address Spark gives it
    assert executor.line() == (
        f"executor on host {spark.sparkContext.getConf().get('spark.driver.host')}: its Python ({ghost}) "
        f"does not start: error=2, No such file or directory; set PYSPARK_PYTHON to a Python every "
        f"executor has, or ship one with spark.archives (see docs/deployment.md)"
    )


def test_a_job_failure_message_names_the_executor() -> None:
    """When Spark's status store cannot be read, the job's message is parsed (Spark's wording)."""
    message = (
        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times, most recent failure: "
        "Lost task 0.3 in stage 3.0 (TID 14) (10.0.0.12 executor 2): java.io.IOException: Cannot run "
        'program "./environment/bin/python": error=2, No such file or directory\n\tat java.base/...'
    )
    status = failed_task_status(message, "./environment/bin/python")
    assert status is not None and status.line() == (
        "executor on host 10.0.0.12: its Python (./environment/bin/python) does not start: error=2, No "
        "such file or directory; set PYSPARK_PYTHON to a Python every executor has, or ship one with "
        "spark.archives (see docs/deployment.md)"
    )
    assert failed_task_status("Job aborted: no executor named", "python") is None


def _other_python() -> str | None:
    """An interpreter of another Python 3 minor version on this machine (beside this one, or on PATH)."""
    names = [f"python3.{m}" for m in range(9, 16) if m != sys.version_info.minor]
    found = [shutil.which(n) for n in names]
    found += map(str, sorted(Path(sys.base_prefix).parent.glob("3.*/bin/python3.*[0-9]")))
    minor = sys.version_info.minor
    usable = []
    for python in filter(None, found):
        r = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True)
        out = r.stdout.split()
        if r.returncode == 0 and len(out) == 2 and out[0] == b"3" and int(out[1]) != minor:
            usable.append((abs(int(out[1]) - minor), -int(out[1]), python))
    # the nearest, newer first: an older Python may not import this PySpark at all
    return min(usable)[2] if usable else None


@pytest.mark.long  # two fresh Pythons of another version start
def test_a_python_of_another_version_is_named_in_one_line(spark: Any) -> None:
    other = _other_python()
    if other is None:
        pytest.skip("no Python of another minor version on this machine")
    with python_workers(spark, other):
        driver, executor = check_executors(spark)
    r = subprocess.run(
        [other, "-c", "import sys; print(*sys.version_info[:2], sep='.')"], capture_output=True
    )
    mismatch = (
        f"PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has different version: "
        f"{r.stdout.decode().strip()} than that in driver: {sys.version_info[0]}.{sys.version_info[1]}, "
        f"PySpark cannot run with different minor versions."
    )
    assert (
        driver.line()
        == f"driver on host {HOST}: its Python workers ({other}) failed before the check ran: {mismatch}"
    )
    assert executor.line() == (
        f"executor on host {spark.sparkContext.getConf().get('spark.driver.host')}: its Python ({other}) "
        f"failed before the check ran (executor driver): {mismatch}"
    )


def _probe_in(python: str, pythonpath: str, cwd: Path) -> str:
    """The probe's problem in another interpreter, the module loaded by value (from its file, as an
    executor gets it: nothing of cloudprofiler imported first)."""
    code = "import runpy, sys; print(runpy.run_path(sys.argv[1])['probe']().problem)"
    r = subprocess.run(
        [python, "-c", code, executor_probe.__file__],
        env=dict(os.environ, PYTHONPATH=pythonpath),
        cwd=cwd,  # not this checkout: its packages would be found there
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _with_pyspark(*paths: Path) -> str:
    """PYTHONPATH with ``paths`` and PySpark's own libraries (as Spark gives its Python workers)."""
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    return os.pathsep.join(map(str, [*paths, *sorted(lib.glob("*.zip"))]))


def test_a_package_without_its_c_extension_is_named(bare: str, tmp_path: Path) -> None:
    copy = source_copy(tmp_path / "src")  # the packages without their built .so files
    assert _probe_in(bare, _with_pyspark(copy), tmp_path) == (
        f"native_tsc's C extension does not load in its Python ({bare}): ModuleNotFoundError: "
        f"No module named 'native_tsc._tsc'; pip install cloudprofiler with that Python (it builds the "
        f"extension) or ship an environment built for the executors' platform with spark.archives "
        f"(see docs/deployment.md)"
    )


def test_a_missing_dependency_is_named(bare: str, tmp_path: Path) -> None:
    checkout = Path(native_tsc.__file__).parents[1]
    assert _probe_in(bare, _with_pyspark(checkout), tmp_path) == (
        f"cloudprofiler needs orjson, which is not installed in its Python ({bare})"
    )


def test_spark_versions_outside_the_supported_range_are_refused() -> None:
    assert spark_problem("4.2.0", "it runs pyspark") == ""
    assert spark_problem("4.9.1", "it runs pyspark") == ""
    for bad in ("4.1.1", "3.5.3", "5.0.0"):
        assert spark_problem(bad, "it runs pyspark") == (
            f"it runs pyspark {bad}; cloudprofiler supports Spark 4.2 or a later 4.x"
        )
    assert spark_problem("", "it runs Spark") == (
        "it runs Spark of unknown version; cloudprofiler supports Spark 4.2 or a later 4.x"
    )
    # the package's own requirement says the same
    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (pin,) = [Requirement(d) for d in meta["project"]["dependencies"] if d.startswith("pyspark")]
    assert [v in pin.specifier for v in ("4.1.9", "4.2.0", "4.9.1", "5.0.0")] == [False, True, True, False]
    other = "4.2.1" if not pyspark.__version__.startswith("4.2.") else "4.3.0"
    assert probe("", other).problem == (
        f"it runs pyspark {pyspark.__version__}, the driver Spark {other}: the versions must match"
    )


def test_check_executors_command_refuses_a_bad_conf_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-executors", "--master", "local[1]", "--conf", "spark.ui.enabled"]) == 2
    err = capsys.readouterr().err
    assert err == "cloudprofiler check-executors: error: --conf 'spark.ui.enabled': expected KEY=VALUE\n"
