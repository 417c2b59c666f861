"""The deserializing factory: the front end, the workers and their parsers, dead letters, its CLI."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "FactoryHandle": "cp_source.factory.supervisor",
    "start_factory": "cp_source.factory.supervisor",
    "read_dead_letter_records": "cp_source.factory.deadletter",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
