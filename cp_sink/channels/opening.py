"""``open_channel``: the configuration server's setting (if any), the checked handler, its family."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from cp_sink.channels.channel import Channel
from cp_sink.channels.config_client import ENV_SERVER, lookup
from cp_sink.channels.exit_flush import track
from cp_sink.channels.handler_spec import parse_channel_handler
from cp_sink.channels.registry import FAMILIES

FORMATS = ("bin", "csv")
ENV_DIR = "CP_CHANNEL_DIR"
MAX_NAME = 128


def default_path(name: str, fmt: str) -> Path:
    """``$CP_CHANNEL_DIR/<name>-<pid>.cpch`` (``.csv`` for CSV), the name made safe for a file name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100]
    return Path(os.environ.get(ENV_DIR, ".")) / f"{safe}-{os.getpid()}.{'cpch' if fmt == 'bin' else 'csv'}"


def open_channel(
    name: str,
    handler: str = "buffered",
    path: str | os.PathLike[str] | None = None,
    fmt: str = "bin",
    **params: Any,
) -> Channel:
    """Open a channel; with ``CP_CONFIG_SERVER`` set, the server's setting for ``name`` wins."""
    if not name or len(name) > MAX_NAME:
        raise ValueError("channel name must have 1 to 128 characters")
    if fmt not in FORMATS:
        raise ValueError(f"unknown channel format {fmt!r}: expected one of {', '.join(FORMATS)}")
    server = os.environ.get(ENV_SERVER)
    if server:
        try:
            handler, params = lookup(server, name)
        except (OSError, TimeoutError, ValueError) as e:
            # The code's own handler is a safe fallback: profiling must not stop the job.
            warnings.warn(
                f"config server {server} unavailable ({e}); channel {name} uses {handler}", stacklevel=2
            )
    key, checked = parse_channel_handler(handler, params)
    ch = FAMILIES[key](name, key, Path(path) if path is not None else default_path(name, fmt), fmt, checked)
    track(ch)
    return ch
