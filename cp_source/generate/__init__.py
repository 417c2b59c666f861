"""The throughput-controlled generator: senders at an exact rate, its CLI, hot-key data skew."""

from __future__ import annotations

from cp_common.faces import lazy_face

# name -> the module defining it, imported on first use (a worker importing one module of
# the package does not pay for the others)
_FACE = {
    "run_generator": "cp_source.generate.generator",
    "GeneratorSettings": "cp_source.generate.settings",
    "draw_delays_ms": "cp_source.generate.delay",
    "schedule_event_ms": "cp_source.generate.events",
    "default_pool": "cp_source.generate.payloads",
    "expected_ads": "cp_source.generate.hot_keys",
    "hot_key": "cp_source.generate.hot_keys",
    "parse_key_skew": "cp_source.generate.hot_keys",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
