"""The data source named "cloudprofiler": stream reader (cp_source) and stream writer (cp_sink)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource


class CloudprofilerDataSource(DataSource):
    """``spark.readStream.format("cloudprofiler")`` and ``df.writeStream.format("cloudprofiler")``."""

    @classmethod
    def name(cls) -> str:
        return "cloudprofiler"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from cp_sink.stream_writer import CloudprofilerStreamWriter

        return CloudprofilerStreamWriter(schema, dict(self.options), overwrite)
