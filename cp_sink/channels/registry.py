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
