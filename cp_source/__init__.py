"""cp_source: ingest for Spark Structured Streaming.

The generator offers tuples at an exact rate over ZeroMQ, factory workers
deserialize them into Arrow segments in a spool, and the "cloudprofiler"
stream reader (``cp_source.reader.stream_reader``) hands those
segments to Spark. Register the data source with ``cloudprofiler.register(spark)``.
"""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "run_generator": "cp_source.generate.generator",
    "GeneratorSettings": "cp_source.generate.settings",
    "FactoryHandle": "cp_source.factory.supervisor",
    "start_factory": "cp_source.factory.supervisor",
    "read_dead_letter_records": "cp_source.factory.deadletter",
    "Spool": "cp_source.spool.segments",
    "read_segment": "cp_source.spool.segments",
    "campaigns_table": "cp_source.wire.workloads",
    "KlinkPools": "cp_source.klink.pools",
    "fair_conf": "cp_source.klink.pools",
    "ReaderState": "cp_source.reader.state",
    "wait_reader_state": "cp_source.reader.state",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
