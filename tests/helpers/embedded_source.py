"""The streaming DataFrame most tests start from: the cloudprofiler source with its embedded factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def embedded_source(spark: Any, spool: Path | str, **options: str | int) -> Any:
    """``readStream.format("cloudprofiler")`` on a free loopback port and ``spool``, with ``options``.

    Registers the data source first; the embedded factory picks its port when the query starts.
    """
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = (
        spark.readStream.format("cloudprofiler")
        .option("endpoint", "tcp://127.0.0.1:0")
        .option("spool", str(spool))
    )
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()
