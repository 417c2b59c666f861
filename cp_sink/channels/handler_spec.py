"""Channel handler names and parameters: the one check shared by ``open_channel`` and the config server."""

from __future__ import annotations

from typing import Any

from cp_sink.handlers import ALIASES, REGISTRY, parse_handler

CHANNEL_HANDLERS = tuple(REGISTRY)
DEFAULT_BLOCK = 1 << 16
MAX_BLOCK = 1 << 24


def parse_channel_handler(name: str, params: dict[str, Any] | None = None) -> tuple[str, dict[str, int]]:
    """Check a channel handler name and its parameters; return (name, params)."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    params = dict(params or {})
    if key not in CHANNEL_HANDLERS:
        raise ValueError(f"unknown channel handler {name!r}: expected one of {', '.join(CHANNEL_HANDLERS)}")
    out: dict[str, int] = {}
    kind = REGISTRY[key]
    if kind.params:  # n, x/y, periodMs: checked by cp_sink.handlers, as in the sink
        out.update(parse_handler(key, params).params)
    if kind.block:
        block = int(params.get("block", DEFAULT_BLOCK))
        if not 1 <= block <= MAX_BLOCK:
            raise ValueError(f"channel parameter block={block}: must be between 1 and 2**24")
        out["block"] = block
    return key, out
