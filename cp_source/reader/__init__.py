"""What Spark calls: the stream reader, its state, the ingest log, the naive baseline source, and
``source_status``, what a query's source holds and has lost, read from its spool."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "CloudprofilerStreamReader": "cp_source.reader.stream_reader",
    "NaiveZmqDataSource": "cp_source.reader.naive_source",
    "ReaderState": "cp_source.reader.state",
    "read_reader_state": "cp_source.reader.state",
    "wait_reader_state": "cp_source.reader.state",
    "SourceStatus": "cp_source.reader.source_watch",
    "FactoriesStatus": "cp_source.reader.source_watch",
    "source_status": "cp_source.reader.source_watch",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
