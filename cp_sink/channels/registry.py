"""Handler name -> the factory of its family: the one place that says which class runs which handler."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cp_sink.channels.buffered import BufferedChannel, ModuloChannel
from cp_sink.channels.channel import Channel
from cp_sink.channels.firstlast import FirstLastChannel
from cp_sink.channels.identity import IdentityChannel
from cp_sink.channels.null import NullChannel
from cp_sink.channels.periodic_counter import PeriodicCounterChannel
from cp_sink.handlers import REGISTRY

# (name, handler, path, fmt, checked params) -> an open channel
ChannelFactory = Callable[[str, str, Path, str, dict[str, int]], Channel]

FAMILIES: dict[str, ChannelFactory] = {
    "identity": IdentityChannel,
    "buffered": BufferedChannel,
    "downsample": ModuloChannel,
    "xoy": ModuloChannel,
    "pc": PeriodicCounterChannel,
    "firstlast": FirstLastChannel,
    "null": NullChannel,
}
# every handler of cp_sink.handlers.REGISTRY has its class here: a new one fails at import, not at open
if FAMILIES.keys() != REGISTRY.keys():
    missing = sorted(FAMILIES.keys() ^ REGISTRY.keys())
    raise ImportError(f"channel handlers without a class or a registry entry: {missing}")
