"""cp_sink: egress. The "cloudprofiler" stream writer, latency records, stamp points,
handlers, profiling channels and the handler configuration server.

``df.writeStream.format("cloudprofiler")`` (after ``cloudprofiler.register(spark)``)
writes latency records; ``read_records(path)`` reads the committed ones.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use: a Spark runner writing records does not
# import the readers (pyarrow.parquet, the manifests)
_FACE = {
    "published_batches": "cp_sink.records",
    "read_counts": "cp_sink.records",
    "read_periods": "cp_sink.records",
    "read_records": "cp_sink.records",
    "read_windows": "cp_sink.records",
    "total_seen": "cp_sink.records",
    "record_windows": "cp_sink.window_records",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
