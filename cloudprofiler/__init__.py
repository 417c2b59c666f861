"""cloudprofiler: the command line and the jobs that tie the packages together."""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the "cloudprofiler" data source (reader and writer) with a SparkSession."""
    from cp_source.datasource import CloudprofilerDataSource

    spark.dataSource.register(CloudprofilerDataSource)
