"""cp_sink: egress. The "cloudprofiler" stream writer, latency records, stamp points,
handlers, profiling channels and the handler configuration server.

``df.writeStream.format("cloudprofiler")`` (after ``cloudprofiler.register(spark)``)
writes latency records; ``read_records(path)`` reads the committed ones.
"""

from __future__ import annotations

from cp_sink.records import read_counts, read_periods, read_records, read_windows, total_seen

__all__ = ["read_counts", "read_periods", "read_records", "read_windows", "total_seen"]
