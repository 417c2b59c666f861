"""The client side of the configuration server: one JSON request over ZeroMQ REQ, and ``lookup``.

``open_channel`` asks ``lookup`` for a channel's handler when ``CP_CONFIG_SERVER`` is set.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
import zmq

from cp_common import curve_keys as ck
from cp_common.zmq_bounds import send_within

ENV_SERVER = "CP_CONFIG_SERVER"
ENV_TIMEOUT = "CP_CONFIG_TIMEOUT"  # seconds a channel waits for the server before using its own handler
ENV_KEYS = "CP_CONFIG_KEYS"  # a keys directory (cloudprofiler keys generate) when the server has keys
LOOKUP_TIMEOUT_S = 2.0
MAX_MESSAGE = 1 << 16  # bytes; ZeroMQ drops larger messages on either side


def request(
    endpoint: str, req: dict[str, Any], timeout: float = 2.0, curve_keys: str | None = None
) -> dict[str, Any]:
    """Send one request to a config server and return its reply (ValueError if it refused).

    ``curve_keys``: a keys directory, by default ``$CP_CONFIG_KEYS``. A server with keys refuses
    a wrong or missing key silently: the TimeoutError then says the handshake failed.
    """
    keys = curve_keys or os.environ.get(ENV_KEYS) or None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock, watch = ck.client_socket(ctx, MAX_MESSAGE, keys)
    try:
        sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        sock.connect(endpoint)
        try:  # a refused handshake times out in the send or in the recv
            if not send_within(sock, [orjson.dumps(req)], timeout):
                raise zmq.Again
            reply = orjson.loads(sock.recv())
        except zmq.Again:
            hint = ck.refusal_hint(watch, bool(keys))
            raise TimeoutError(f"no answer from {endpoint} in {timeout:g}s{hint}") from None
    finally:
        watch.close()
        sock.close(0)
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise ValueError(f"config server refused: {reply.get('error') if isinstance(reply, dict) else reply}")
    return reply


def lookup(endpoint: str, channel: str, timeout: float | None = None) -> tuple[str, dict[str, Any]]:
    """The handler and parameters the server sets for ``channel``."""
    if timeout is None:
        timeout = float(os.environ.get(ENV_TIMEOUT, LOOKUP_TIMEOUT_S))
    reply = request(endpoint, {"op": "get", "channel": channel}, timeout)
    handler, params = reply.get("handler"), reply.get("params", {})
    if not isinstance(handler, str) or not isinstance(params, dict):
        raise ValueError("config server sent a malformed setting")
    return handler, params
