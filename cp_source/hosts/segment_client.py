"""The segment server's clients: fetch one segment, read the server's counters, ask hosts a control op.

Every answer is read under the protocol's bounds (``segment_protocol``); a segment server that
is gone, slow or answers garbage fails in one line naming it.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import zmq

from cp_common import curve_keys as ck
from cp_common.zmq_bounds import send_within
from cp_source.hosts.segment_protocol import (
    MAX_CONTROL_REPLY,
    MAX_REQUEST_BYTES,
    MAX_SEGMENT_BYTES,
    FetchError,
)


def fetch_segment(
    endpoint: str,
    worker: str,
    number: int,
    timeout: float = 30.0,
    max_bytes: int = MAX_SEGMENT_BYTES,
    ctx: zmq.Context | None = None,
    curve_keys: str | None = None,
) -> bytes:
    """Fetch one segment's Arrow IPC bytes from a segment server (``curve_keys``: a keys directory
    when the server runs with keys; a refused key fails with the handshake named)."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    sock, watch = None, None
    try:
        sock, watch = ck.client_socket(ctx, max_bytes + 4096, curve_keys)
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout
        request = orjson.dumps({"op": "segment", "worker": worker, "number": number})
        if not (
            send_within(sock, [request], timeout)
            and sock.poll(max(0, int((deadline - time.monotonic()) * 1000)))
        ):
            raise FetchError(
                f"no answer from segment server {endpoint} for {worker}/{number} within {timeout:g} s"
                f"{ck.refusal_hint(watch, bool(curve_keys))}"
            )
        frames = sock.recv_multipart()
    finally:
        if watch is not None:
            watch.close()
        if sock is not None:
            sock.close(0)
        if own:
            ctx.term()
    if not frames or len(frames[0]) > MAX_REQUEST_BYTES * 4:
        raise FetchError("malformed answer from segment server")
    head = orjson.loads(frames[0])
    if not isinstance(head, dict) or not head.get("ok"):
        err = head.get("error") if isinstance(head, dict) else "malformed answer"
        raise FetchError(f"segment server {endpoint}: {err}")
    if len(frames) != 2 or len(frames[1]) != head.get("nbytes"):
        raise FetchError("segment server answer has the wrong size")
    return frames[1]


def server_stats(endpoint: str, timeout: float = 10.0, curve_keys: str | None = None) -> dict[str, Any]:
    """Ask a running segment server for its counters (FetchError, one line, when it does not answer
    them: gone, refused, or a malformed answer)."""
    ctx = zmq.Context()
    try:
        answer = ask_servers({endpoint: {"op": "stats"}}, timeout, ctx, curve_keys)[endpoint]
    finally:
        ctx.term()
    if isinstance(answer, str):
        raise FetchError(f"segment server stats: {answer}")
    return answer


def ask_servers(
    requests: dict[str, dict[str, Any]],
    timeout: float,
    ctx: zmq.Context,
    curve_keys: str | None = None,
) -> dict[str, dict[str, Any] | str]:
    """Send one request to each server at once and wait at most ``timeout`` s for all the answers.

    Returns per endpoint the answer (a JSON object with ``ok`` true) or one line saying why there is
    none: no answer in time (a host that is down, stopped or cut off), an error answer, or a
    malformed one. Each request gets a fresh REQ socket, so a late answer is never taken for the
    next request's.
    """
    socks: dict[str, tuple[zmq.Socket, ck.HandshakeWatch]] = {}
    out: dict[str, dict[str, Any] | str] = {}
    poller = zmq.Poller()
    try:
        for endpoint, req in requests.items():
            socks[endpoint] = ck.client_socket(ctx, MAX_CONTROL_REPLY, curve_keys)
            sock = socks[endpoint][0]
            sock.connect(endpoint)
            if send_within(sock, [orjson.dumps(req)], 0):  # never wait: the others are asked at once
                poller.register(sock, zmq.POLLIN)
            else:
                hint = ck.refusal_hint(socks[endpoint][1], bool(curve_keys))
                out[endpoint] = f"no connection to {endpoint} took the request{hint}"
        deadline = time.monotonic() + timeout
        waiting = {sock: ep for ep, (sock, _) in socks.items() if ep not in out}
        while waiting and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(max(1, int(left * 1000))):
                endpoint = waiting.pop(sock)
                out[endpoint] = _control_reply(endpoint, sock.recv_multipart())
                poller.unregister(sock)
        for endpoint in waiting.values():
            hint = ck.refusal_hint(socks[endpoint][1], bool(curve_keys))
            out[endpoint] = f"no answer from {endpoint} within {timeout:g} s{hint}"
    finally:
        for sock, watch in socks.values():
            watch.close()
            sock.close(0)
    return out


def _control_reply(endpoint: str, frames: list[bytes]) -> dict[str, Any] | str:
    """A control answer as a dict when it is a well-formed ``ok`` one, else one line saying why not."""
    if len(frames) != 1:
        return f"malformed answer from {endpoint}"
    try:
        head = orjson.loads(frames[0])
    except orjson.JSONDecodeError:
        return f"malformed answer from {endpoint}"
    if not isinstance(head, dict):
        return f"malformed answer from {endpoint}"
    if not head.get("ok"):
        return f"{endpoint}: {head.get('error', 'refused')}"
    return head
