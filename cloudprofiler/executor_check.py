"""Can every executor run cloudprofiler? A small check job, run on the driver before a query starts.

An executor whose Python lacks cloudprofiler cannot even unpickle the reader's
``read`` or the sink's ``write``: the query would fail with a long traceback
from inside PySpark. So the check runs a job of its own whose task is pickled
by value (``cloudprofiler.executor_probe``) and loads in any executor Python
that has PySpark; each task tries what executors need (cloudprofiler, the
modules the reader and sink run, native_tsc's C extension, a supported Spark
matching the driver's) and answers in one line. A task that fails before it
runs (the executor's Python does not start, or is another Python version) is
turned into one line too, naming the executor's host from Spark's report.

Use ``require_executors(spark)`` after creating the session (it raises
``ExecutorCheckError`` with one line), ``check_executors(spark)`` for every
executor's status, or ``cloudprofiler check-executors`` from a shell. The data
source cannot run it by itself: its driver-side methods run in Python workers
that hold no SparkSession. See docs/deployment.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from cloudprofiler import executor_probe
from cloudprofiler.executor_probe import (
    CHECK_SOURCE,
    DOCS,
    Probe,
    check_source,
    probe_task,
    spark_problem,
)
from cp_common.faces import deprecated_names

DESCRIPTION = """\
Run a small Spark job that checks every executor can run cloudprofiler: its
Python has cloudprofiler and native_tsc's C extension, and its Spark is a
supported version matching the driver's. Prints one line per executor (and the
driver); exits 1 when any of them fails.

examples:
  cloudprofiler check-executors --master spark://10.0.0.10:7077 --executors 4
  cloudprofiler check-executors --master spark://10.0.0.10:7077 \\
      --archives cloudprofiler-env.tar.gz#environment --python ./environment/bin/python
"""


class ExecutorCheckError(RuntimeError):
    """An executor (or the driver) cannot run cloudprofiler; the message is one line naming its host."""


@dataclass(frozen=True)
class ExecutorStatus:
    """What one driver or executor Python answered (an executor's host when its task never ran)."""

    role: str  # "driver" or "executor"
    host: str
    address: str = ""
    python: str = ""
    spark: str = ""
    cloudprofiler: str = ""
    tsc_backend: str = ""
    problem: str = ""  # "" when it can run cloudprofiler

    @property
    def ok(self) -> bool:
        return not self.problem

    def where(self) -> str:
        at = f" ({self.address})" if self.address and self.address != self.host else ""
        return f"{self.role} on host {self.host}{at}"

    def line(self) -> str:
        """One line: the host and either its versions or what stops it."""
        if self.problem:
            return f"{self.where()}: {self.problem}"
        return (
            f"{self.where()}: ok (Python {self.python}, Spark {self.spark}, "
            f"cloudprofiler {self.cloudprofiler}, TSC {self.tsc_backend})"
        )


def _status(role: str, answer: Probe) -> ExecutorStatus:
    return ExecutorStatus(
        role,
        answer.host,
        answer.address,
        answer.python,
        answer.spark,
        answer.cloudprofiler,
        answer.tsc_backend,
        answer.problem,
    )


# Spark's report of a task that failed: "Lost task 0.3 in stage 1.0 (TID 7) (HOST executor 2): ..."
_LOST_TASK = re.compile(r"Lost task \S+ in stage \S+ \(TID \d+\) \((\S+) executor ([^)\s]+)\): (.*)", re.S)
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]+)"(?:[^:]*): ([^\n]*)')
_PY_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$", re.M)


def _python_error(text: str) -> str:
    """The last exception line of a Python traceback in ``text`` (a JVM stack trace may follow it),
    else its first line."""
    python_part = text.split("\n\tat ")[0]
    errors = _PY_ERROR.findall(python_part)
    if errors:
        kind, message = errors[-1]
        return f"{kind}: {' '.join(message.split())}"
    lines = python_part.strip().splitlines()
    return " ".join(lines[0].split()) if lines else "failed"


def task_failure_status(host: str, executor: str, error: str, python: str) -> ExecutorStatus:
    """One line for a check task that failed before the probe could answer (Spark's error text)."""
    run = _cannot_run(error)
    if run:
        problem = (
            f"its Python ({run[0]}) does not start: {run[1]}; set PYSPARK_PYTHON "
            f"to a Python every executor has, or ship one with spark.archives (see {DOCS})"
        )
        return ExecutorStatus("executor", host, python=run[0], problem=problem)
    problem = (
        f"its Python ({python}) failed before the check ran (executor {executor}): {_python_error(error)}"
    )
    return ExecutorStatus("executor", host, python=python, problem=problem)


def failed_task_status(message: str, python: str) -> ExecutorStatus | None:
    """The status from a failed job's message when it names the executor ("Lost task ... (HOST executor
    N): ..."), else None."""
    m = _LOST_TASK.search(message)
    if m is None:
        return None
    host, executor, error = m.groups()
    return task_failure_status(host, executor, error, python)


def _failed_task(sc: Any, group: str) -> ExecutorStatus | None:
    """The first failed task of the check's job, from Spark's status store, which names its host:
    PySpark raises a Python worker's error without it."""
    try:
        store = sc._jsc.sc().statusStore()
        tracker = sc.statusTracker()
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else []:
                tasks = store.taskList(stage, 0, 1 << 20)
                for i in range(tasks.size()):
                    t = tasks.apply(i)
                    if str(t.status()) == "FAILED" and t.errorMessage().isDefined():
                        error = str(t.errorMessage().get())
                        return task_failure_status(str(t.host()), str(t.executorId()), error, sc.pythonExec)
    except Exception:  # Spark's internal store answered otherwise: the message is what is left
        return None
    return None


def _executor_hosts(sc: Any) -> list[str]:
    """The hosts of the executors registered now (the driver's own entry left out)."""
    jsc = sc._jsc.sc()
    count = int(jsc.getExecutorIds().size())
    hosts = [str(info.host()) for info in jsc.statusTracker().getExecutorInfos()]
    driver = sc.getConf().get("spark.driver.host", "")
    if driver in hosts and len(hosts) > count:
        hosts.remove(driver)
    return hosts[:count] if count else []


def wait_for_executors(sc: Any, count: int, timeout: float) -> list[str]:
    """Wait until ``count`` executors have registered (executors start after the session does)."""
    deadline = time.monotonic() + timeout
    hosts = _executor_hosts(sc)
    while len(hosts) < count:
        if time.monotonic() > deadline:
            raise ExecutorCheckError(
                f"{len(hosts)} of {count} executors registered within {timeout:.0f}s "
                f"(hosts: {', '.join(sorted(hosts)) or 'none'})"
            )
        time.sleep(0.2)
        hosts = _executor_hosts(sc)
    return hosts


def _failure_text(e: BaseException) -> str:
    """The messages of a failed job's exception and the JVM's: PySpark raises the Python worker's
    error with the JVM's report (which names the executor) only in its context."""
    texts = []
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        err = stack.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        texts.append(str(err))
        java = getattr(err, "java_exception", None)
        if java is not None:
            # the gateway may be gone; the Python text is still there
            with contextlib.suppress(Exception):
                texts.append(str(java.getMessage()))
        stack += [err.__cause__, err.__context__]
    return "\n".join(texts)


@contextmanager
def _shipped_by_value() -> Iterator[None]:
    """While pickled, the probe travels by value: a Python without cloudprofiler loads it and says so."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(executor_probe)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(executor_probe)


def _cannot_run(text: str) -> tuple[str, str] | None:
    run = _CANNOT_RUN.search(text)
    return (run.group(1), run.group(2).strip()) if run else None


def _driver_status(spark: Any, driver_spark: str, driver_cp: str) -> ExecutorStatus:
    """The probe in the driver's Python workers, through a data source's schema(): the cloudprofiler
    source's driver side runs in those (``PYSPARK_PYTHON``, relative to the driver's directory)."""
    import os
    import socket

    with _shipped_by_value():
        spark.dataSource.register(check_source())
    try:
        df = spark.read.format(CHECK_SOURCE).option("spark", driver_spark).option("cloudprofiler", driver_cp)
        answer = Probe(*df.load().schema["probe"].metadata["probe"])
    except Exception as e:  # the worker did not start, or failed: one line
        text = _failure_text(e)
        python = spark.sparkContext.pythonExec
        run = _cannot_run(text)
        if run:
            problem = (
                f"its Python workers ({run[0]}) do not start in the driver's directory ({os.getcwd()}): "
                f"{run[1]}; the source's driver side runs in them: start the driver where {run[0]} "
                f"is a Python with cloudprofiler (see {DOCS})"
            )
        else:
            problem = f"its Python workers ({python}) failed before the check ran: {_python_error(text)}"
        return ExecutorStatus("driver", socket.gethostname(), python=python, problem=problem)
    status = _status("driver", answer)
    if not status.problem:
        problem = spark_problem(driver_spark, "it runs Spark")
        status = replace(status, problem=problem)
    return status


def _run_probes(sc: Any, tasks: int, args: tuple[str, str, str]) -> list[tuple[str, ...]] | ExecutorStatus:
    task = functools.partial(probe_task, driver_host=args[0], driver_spark=args[1], driver_cp=args[2])
    group = f"cloudprofiler-check-{uuid.uuid4().hex}"
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    before = {k: sc.getLocalProperty(k) for k in keys}
    sc.setJobGroup(group, "cloudprofiler: check executors")
    try:
        with _shipped_by_value():
            rdd = sc.parallelize(range(tasks), tasks).map(task)
            rdd._jrdd  # noqa: B018 - pickles the task now, while the probe is shipped by value
        return rdd.collect()
    except Exception as e:  # the failed job's error: turned into one line naming the host
        failed = _failed_task(sc, group) or failed_task_status(_failure_text(e), sc.pythonExec)
        if failed is None:
            text = " ".join(str(e).split())[:500]
            raise ExecutorCheckError(f"the executor check job failed: {text}") from e
        return failed
    finally:
        for k, v in before.items():
            sc.setLocalProperty(k, v)


def check_executors(
    spark: Any, min_executors: int = 0, timeout: float = 60.0, tasks: int | None = None
) -> list[ExecutorStatus]:
    """The driver's status (its Python workers), then one per executor Python that ran a check task.

    Waits for ``min_executors`` executors to register first. Runs ``tasks`` tasks (default: twice
    the executors or the default parallelism, whichever is more), so that every registered executor
    runs at least one; an executor that ran none is listed with that as its problem. Registers a
    data source named ``cloudprofiler_check`` in the session (its schema() is the driver's probe).
    """
    from importlib.metadata import PackageNotFoundError, version

    sc = spark.sparkContext
    try:
        driver_cp = version("cloudprofiler")
    except PackageNotFoundError:
        driver_cp = ""
    driver = _driver_status(spark, spark.version, driver_cp)
    hosts = wait_for_executors(sc, min_executors, timeout)
    n = tasks or max(2, 2 * len(hosts), 2 * int(sc.defaultParallelism))
    answers = _run_probes(sc, n, (sc.getConf().get("spark.driver.host", ""), spark.version, driver_cp))
    if isinstance(answers, ExecutorStatus):
        return [driver, answers]
    statuses = sorted({_status("executor", Probe(*a)) for a in answers}, key=lambda s: (s.host, s.address))
    seen = {name for s in statuses for name in (s.host, s.address)}
    missing = sorted(h for h in set(_executor_hosts(sc)) if h not in seen)
    statuses += [
        ExecutorStatus("executor", h, problem="ran none of the check's tasks; run the check again")
        for h in missing
    ]
    return [driver, *statuses]


def require_executors(spark: Any, min_executors: int = 0, timeout: float = 60.0) -> list[ExecutorStatus]:
    """``check_executors``, raising ``ExecutorCheckError`` (one line naming the host) on any failure."""
    statuses = check_executors(spark, min_executors, timeout)
    failed = [s for s in statuses if not s.ok]
    if failed:
        more = (
            f" (and {len(failed) - 1} more: cloudprofiler check-executors lists them)" if failed[1:] else ""
        )
        raise ExecutorCheckError(failed[0].line() + more)
    return statuses


# ---- the command ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--master", required=True, help="the cluster's master URL (spark://HOST:PORT, yarn, local[N])"
    )
    p.add_argument("--executors", type=int, default=1, help="wait for this many executors first (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for them (default 120)")
    p.add_argument("--archives", help="spark.archives, e.g. cloudprofiler-env.tar.gz#environment")
    p.add_argument("--python", help="the executors' Python (PYSPARK_PYTHON), e.g. ./environment/bin/python")
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeat)"
    )


def _conf(args: argparse.Namespace) -> dict[str, str]:
    conf: dict[str, str] = {}
    for kv in args.conf:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf {kv!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    if args.archives:
        conf["spark.archives"] = args.archives
    return conf


def run(args: argparse.Namespace) -> int:
    import os

    if args.executors < 0:
        raise ValueError(f"--executors {args.executors}: expected 0 or more")
    conf = _conf(args)
    if args.python:
        os.environ["PYSPARK_PYTHON"] = args.python  # read by PySpark when the session starts
    from cloudprofiler.spark_local import local_session

    spark = local_session("cloudprofiler-check-executors", master=args.master, conf=conf, register=False)
    try:
        local = str(args.master).startswith("local")
        statuses = check_executors(spark, 0 if local else args.executors, args.timeout)
    finally:
        spark.stop()
    for s in statuses:
        print(s.line())
    return 0 if all(s.ok for s in statuses) else 1


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["require_executors"])
