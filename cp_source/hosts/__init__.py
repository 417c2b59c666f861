"""Factories on other hosts: their plans, the segment server, the ready operations over the wire."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "FactoryHosts": "cp_source.hosts.factory_hosts",
    "SegmentServer": "cp_source.hosts.segment_server",
    "fetch_segment": "cp_source.hosts.segment_client",
    "read_registry": "cp_source.hosts.registry",
    "register_factory": "cp_source.hosts.registry",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
