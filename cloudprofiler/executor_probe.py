"""What one Python process can run of cloudprofiler: the check that ``executor_check`` ships to executors.

This module is pickled BY VALUE (``cloudpickle.register_pickle_by_value``): its
functions must load in an executor Python that lacks cloudprofiler, so that the
check can say so in one line instead of failing to unpickle. Hence the rules
for this file: import nothing outside the standard library at module level,
nothing from cloudprofiler anywhere except inside ``try`` blocks that turn an
import failure into a reason, and keep every reason one line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import socket
import sys
from typing import NamedTuple

# Spark versions cloudprofiler runs on: [lowest, first unsupported) as (major, minor). The reader uses
# the 4.2 streaming API (latestOffset with a read limit, Trigger.AvailableNow for Python sources);
# Spark 5 is refused until it has been tested.
SUPPORTED_SPARK = ((4, 2), (5, 0))
SUPPORTED_TEXT = "Spark 4.2 or a later 4.x"
DOCS = "docs/deployment.md"
# What executors import to run the reader's read() and the sink's write().
EXECUTOR_MODULES = ("cp_source.reader.stream_reader", "cp_sink.stream_writer", "cp_store.location")
# cloudprofiler's own packages: an import failing inside them is not a missing dependency.
OWN_PACKAGES = ("cloudprofiler", "cp_common", "native_tsc", "cp_source", "cp_sink", "cp_store", "cp_sync")


class Probe(NamedTuple):
    """One process's answer: who it is and what (if anything) stops it from running cloudprofiler.

    A plain tuple of strings, so that it travels back to the driver whatever the executor has installed.
    """

    host: str  # the host's name (SPARK_LOCAL_HOSTNAME when set, as Spark names it)
    address: str  # its address on the route to the driver ("" when unknown)
    python: str  # the interpreter (sys.executable)
    python_version: str
    spark: str  # pyspark's version in that interpreter ("" when pyspark does not import)
    cloudprofiler: str  # cloudprofiler's version ("" when not installed)
    tsc_backend: str  # native_tsc's backend, e.g. rdtscp ("" when the C extension does not load)
    problem: str  # "" when it can run cloudprofiler, else one line saying why not


def spark_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a Spark version string such as ``4.3.0`` or ``4.2.0.dev1``; None if unparsable."""
    m = re.match(r"(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def spark_problem(version: str, what: str) -> str:
    """Why ``what`` (e.g. "runs pyspark") at ``version`` is not a supported Spark, or ""."""
    v = spark_version(version)
    lo, hi = SUPPORTED_SPARK
    if v is None or not lo <= v < hi:
        return f"{what} {version or 'of unknown version'}; cloudprofiler supports {SUPPORTED_TEXT}"
    return ""


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def address_toward(host: str) -> str:
    """This host's address on the route to ``host`` (a UDP socket's local end: no packet is sent)."""
    if not host:
        return ""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 9, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except OSError:
        return ""


def _versions() -> tuple[str, str]:
    try:
        import pyspark

        spark = str(pyspark.__version__)
    except Exception:
        spark = ""
    try:
        cp = importlib.metadata.version("cloudprofiler")
    except importlib.metadata.PackageNotFoundError:
        cp = ""
    return spark, cp


def _import_problem(python: str) -> tuple[str, str]:
    """(the TSC backend, why cloudprofiler cannot run here or "")."""
    ship = f"ship it with spark.archives or pip install it on every node (see {DOCS})"
    if importlib.util.find_spec("cloudprofiler") is None:
        return "", f"cloudprofiler is not installed in its Python ({python}); {ship}"
    try:
        tsc = importlib.import_module("native_tsc._tsc")
        backend = str(tsc.BACKEND)
    except ImportError as e:
        return "", (
            f"native_tsc's C extension does not load in its Python ({python}): {_one_line(e)}; "
            f"pip install cloudprofiler with that Python (it builds the extension) or ship an "
            f"environment built for the executors' platform with spark.archives (see {DOCS})"
        )
    for name in ("cloudprofiler", *EXECUTOR_MODULES):
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing = e.name if isinstance(e, ModuleNotFoundError) and e.name else None
            if missing and missing.split(".")[0] not in OWN_PACKAGES:
                need = f"cloudprofiler needs {missing}, which is not installed in its Python ({python})"
                return backend, need
            return backend, f"{name} does not import in its Python ({python}): {_one_line(e)}"
    return backend, ""


def probe(driver_host: str = "", driver_spark: str = "", driver_cloudprofiler: str = "") -> Probe:
    """Check this process: its pyspark against the supported range and the driver's Spark
    (``driver_spark``), then cloudprofiler, native_tsc's C extension and the modules executors run."""
    python = sys.executable or "python"
    host = os.environ.get("SPARK_LOCAL_HOSTNAME") or socket.gethostname()
    spark, cp = _versions()
    backend, problem = "", ""
    if not spark:
        problem = f"pyspark does not import in its Python ({python})"
    else:
        problem = spark_problem(spark, "it runs pyspark")
        want, got = spark_version(driver_spark), spark_version(spark)
        if not problem and want is not None and got != want:
            problem = f"it runs pyspark {spark}, the driver Spark {driver_spark}: the versions must match"
    if not problem:
        backend, problem = _import_problem(python)
    if not problem and driver_cloudprofiler and cp != driver_cloudprofiler:
        problem = (
            f"it has cloudprofiler {cp}, the driver {driver_cloudprofiler}; "
            f"ship the driver's with spark.archives (see {DOCS})"
        )
    return Probe(
        host,
        address_toward(driver_host),
        python,
        ".".join(map(str, sys.version_info[:3])),
        spark,
        cp,
        backend,
        problem,
    )


def probe_task(_: object, driver_host: str, driver_spark: str, driver_cp: str) -> tuple[str, ...]:
    """One check task's answer. A plain tuple: Spark returns results with plain pickle, which cannot
    carry a class pickled by value."""
    return tuple(probe(driver_host, driver_spark, driver_cp))


CHECK_SOURCE = "cloudprofiler_check"  # the data source whose schema() probes the driver's Python workers


def check_source() -> type:
    """A data source whose ``schema()`` answers the probe: Spark runs it in the driver's Python
    workers, where the cloudprofiler source's driver side runs (PYSPARK_PYTHON, the driver's directory)."""
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.types import StringType, StructField, StructType

    class CheckSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return CHECK_SOURCE

        def schema(self) -> StructType:
            opts = self.options
            answer = probe("", opts.get("spark", ""), opts.get("cloudprofiler", ""))
            return StructType([StructField("probe", StringType(), True, {"probe": list(answer)})])

    return CheckSource
