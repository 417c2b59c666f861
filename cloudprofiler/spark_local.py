"""One way to start a local SparkSession for the product's jobs, benchmarks and tests.

The demo, maxrate, the benchmarks and the test suite all want the same
thing: Spark on this machine with the UI off, few shuffle partitions (the data
of one micro-batch is small), Python workers running this interpreter, and
quiet logs. Differences (a master with task retries, more driver memory) are
passed as arguments, not copied builders.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from cloudprofiler.errors import CommandError
from cp_common.faces import deprecated_names

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.python.worker.reuse": "true",
}


JAVA_ADVICE = (
    "install a Java 17 or 21 runtime (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one"
)


def java_runner() -> str:
    """The java Spark's launcher (bin/spark-class) will run: ``$JAVA_HOME/bin/java``, else java on PATH.

    Raises CommandError in one line naming the path tried, where PySpark would print 28 lines of
    traceback ending in JAVA_GATEWAY_EXITED.
    """
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise CommandError(
                f"Spark needs Java: JAVA_HOME={home} has no executable bin/java; " + JAVA_ADVICE
            )
        return java
    found = shutil.which("java")
    if found is None:
        raise CommandError(
            "Spark needs Java: JAVA_HOME is not set and java not found on PATH; " + JAVA_ADVICE
        )
    return found


def require_java() -> str | None:
    """The java a new SparkSession will start (see ``java_runner``), or None when a JVM already runs
    (this process's, or the one spark-submit started): a command calls it before its first work."""
    from pyspark import SparkContext

    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    return java_runner()


def _gateway_launch(builder: Any) -> Any:
    """``builder.getOrCreate()``, with a JVM that exits at start reported in one line."""
    from pyspark.errors import PySparkRuntimeError

    java = require_java()
    try:
        return builder.getOrCreate()
    except PySparkRuntimeError as e:
        if java is None or e.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        raise CommandError(
            f"Spark's JVM ({java}) exited before Spark started (its own output, if any, is above); "
            + JAVA_ADVICE
        ) from None


def local_session(
    app_name: str,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
    register: bool = True,
) -> Any:
    """A SparkSession on ``master`` with the product's defaults, ``conf`` on top.

    ``local[N,F]`` retries a failed task F-1 times (tests use it). With
    ``register`` the "cloudprofiler" data source is registered. No java (or a JAVA_HOME without
    one) is a CommandError in one line, before Spark's launcher runs.
    """
    # Spark's Python workers must run the interpreter that has this package.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = _gateway_launch(builder)
    spark.sparkContext.setLogLevel(log_level)
    if register:
        # the datasource module, not the package: the package's source_status reaches this module
        from cloudprofiler.datasource import register_source

        register_source(spark)
    return spark


def __getattr__(name: str) -> Any:
    # source_end_offset lives beside the reader it watches now; the docs once gave this module for
    # it. Imported on first use: a driver starting Spark pays nothing for the watch's imports.
    if name == "source_end_offset":
        from cp_source.reader.source_watch import source_end_offset

        return source_end_offset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["local_session", "source_end_offset"])
