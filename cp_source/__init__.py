"""cp_source: ingest for Spark Structured Streaming.

The generator offers tuples at an exact rate over ZeroMQ, factory workers
deserialize them into Arrow segments in a spool, and the "cloudprofiler"
stream reader (``cp_source.reader.stream_reader``) hands those
segments to Spark. Register the data source with ``cloudprofiler.register(spark)``.
"""
