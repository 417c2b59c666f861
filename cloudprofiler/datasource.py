"""The data source named "cloudprofiler": the stream reader (cp_source) and stream writer (cp_sink).

It lives here, beside ``register``, because it is the one class that ties ingest and egress
together; cp_source and cp_sink do not know each other.

Register it once per SparkSession with ``cloudprofiler.register(spark)``, then
``spark.readStream.format("cloudprofiler").option(...).load()``.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType


class CloudprofilerDataSource(DataSource):
    """``spark.readStream.format("cloudprofiler")`` and ``df.writeStream.format("cloudprofiler")``."""

    @classmethod
    def name(cls) -> str:
        return "cloudprofiler"

    def schema(self) -> StructType | str:
        """Workload columns, ids, event time and the gen/factory/source stamp columns.

        Spark calls this at ``load()`` (never for a write, nor when the user gives ``.schema()``):
        the reader's options are checked here, strictly, so a typo fails before the query starts.
        """
        from cp_source.stream_reader import ReaderOptions, source_schema

        return source_schema(ReaderOptions.parse(self.options, strict=True))

    def streamReader(self, schema: StructType) -> Any:
        """The reader of one query; a bad option or schema found now fails Spark's first call to it."""
        from cp_source.stream_reader import CloudprofilerStreamReader, RefusedStreamReader

        try:
            return CloudprofilerStreamReader(schema, self.options)
        except ValueError as e:
            return RefusedStreamReader(str(e))

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from cp_sink.stream_writer import CloudprofilerStreamWriter

        return CloudprofilerStreamWriter(schema, dict(self.options), overwrite)
