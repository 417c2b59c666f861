"""Online handler configuration: a table of channel name -> handler served over ZeroMQ.

The server answers JSON requests from REQ clients on a ROUTER socket (bound to 127.0.0.1 by
default; a frame over 64 KiB is refused by ZeroMQ itself, a request of more
than one frame gets an error reply, and any malformed request gets an error
reply: the server never stops on what a client sends)::

    {"op": "get", "channel": "parser"}                 -> {"ok": true, "handler": "xoy", "params": {...},
                                                           "source": "table" | "default"}
    {"op": "set", "channel": "parser", "handler": "null", "params": {}}
    {"op": "remove", "channel": "parser"}
    {"op": "default", "handler": "pc", "params": {"periodMs": 100}}
    {"op": "table"}                                      -> the whole table and the default

A table file (``--table``) holds ``{"default": {"handler": ...}, "channels":
{name: {"handler": ..., <params>}}}``; it is read again whenever it changes on
disk. A program opens channels with ``CP_CONFIG_SERVER=tcp://host:port`` set:
each channel opened asks the server (``config_client.lookup``), so a change
applies to the next channel opened, without redeploying the job.
"""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import zmq

from cp_common import curve_keys as ck
from cp_common.zmq_bounds import recv_bounded, while_serving
from cp_sink.channels.config_client import MAX_MESSAGE, request
from cp_sink.channels.handler_spec import parse_channel_handler

DEFAULT_BIND = "tcp://127.0.0.1:5590"
MAX_CHANNELS = 10_000
MAX_NAME = 128
MAX_PARAMS = 16  # a handler takes at most a few parameters
MAX_PARAM_TEXT = 64
MAX_FRAMES = 1  # a request is one JSON frame
REPLY_HWM = 16  # replies queued per peer; a REQ client has one request in flight

DESCRIPTION = """Serve channel handler settings over ZeroMQ (or change them on a running server).

Channels opened while CP_CONFIG_SERVER is set take their handler from this
server; names not in the table get the declared default.

examples:
  cloudprofiler config-server --default null
  cloudprofiler config-server --bind tcp://127.0.0.1:5590 --table handlers.json --default buffered
  cloudprofiler config-server --connect tcp://127.0.0.1:5590 --set parser=xoy:x=2,y=1024
  cloudprofiler config-server --connect tcp://127.0.0.1:5590 --get parser
  CP_CONFIG_SERVER=tcp://127.0.0.1:5590 python my_job.py
"""


def _check_params(params: Any) -> dict[str, int | str]:
    """Parameters as the wire may carry them: a small object of names -> integers or short strings."""
    if not isinstance(params, dict) or len(params) > MAX_PARAMS:
        raise ValueError(f"params must be an object of at most {MAX_PARAMS} entries")
    for k, v in params.items():
        if not isinstance(k, str) or not 0 < len(k) <= MAX_PARAM_TEXT:
            raise ValueError(f"parameter names must be strings of 1 to {MAX_PARAM_TEXT} characters")
        ok_int = isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 62
        if not ok_int and not (isinstance(v, str) and len(v) <= MAX_PARAM_TEXT):
            raise ValueError(f"parameter {k!r} must be an integer or a short string, got {type(v).__name__}")
    return params


def _check_setting(handler: Any, params: Any) -> dict[str, Any]:
    if not isinstance(handler, str) or not 0 < len(handler) <= MAX_NAME:
        raise ValueError("a setting needs a handler name")
    try:
        name, checked = parse_channel_handler(handler, _check_params(params))
    except (TypeError, OverflowError) as e:  # a value the handler's own parser cannot take
        raise ValueError(f"bad parameter for handler {handler!r}: {e}") from None
    return {"handler": name, "params": checked}


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"channel name must be a string of 1 to {MAX_NAME} characters")
    return name


class HandlerTable:
    """Channel name -> setting, with a default; optionally backed by a file re-read on change."""

    def __init__(self, default: str = "buffered", path: str | os.PathLike[str] | None = None) -> None:
        self.default = _check_setting(default, {})
        self.channels: dict[str, dict[str, Any]] = {}
        self.path = Path(path) if path is not None else None
        self._mtime: int | None = None
        self.reload()

    def reload(self) -> None:
        """Read the table file again if it changed."""
        if self.path is None:
            return
        mtime = self.path.stat().st_mtime_ns
        if mtime == self._mtime:
            return
        raw = self.path.read_bytes()
        if len(raw) > 16 * MAX_MESSAGE:
            raise ValueError(f"handler table {self.path} is too large")
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"handler table {self.path}: expected a JSON object")
        channels = data.get("channels", {})
        if not isinstance(channels, dict) or len(channels) > MAX_CHANNELS:
            raise ValueError(
                f"handler table {self.path}: 'channels' must be an object of at most {MAX_CHANNELS}"
            )
        parsed = {}
        for name, setting in channels.items():
            if not isinstance(setting, dict):
                raise ValueError(f"handler table {self.path}: channel {name!r} needs an object")
            rest = {k: v for k, v in setting.items() if k != "handler"}
            parsed[_check_name(name)] = _check_setting(setting.get("handler"), rest)
        if "default" in data:
            d = data["default"]
            if not isinstance(d, dict):
                raise ValueError(f"handler table {self.path}: 'default' needs an object")
            self.default = _check_setting(d.get("handler"), {k: v for k, v in d.items() if k != "handler"})
        self.channels = parsed
        self._mtime = mtime

    def get(self, name: str) -> dict[str, Any]:
        if name in self.channels:
            return {**self.channels[name], "source": "table"}
        return {**self.default, "source": "default"}

    def handle(self, req: Any) -> dict[str, Any]:
        """Answer one request (already parsed JSON)."""
        if not isinstance(req, dict):
            raise ValueError("request must be a JSON object")
        op = req.get("op")
        if op == "get":
            self.reload()
            return self.get(_check_name(req.get("channel")))
        if op == "set":
            name = _check_name(req.get("channel"))
            if name not in self.channels and len(self.channels) >= MAX_CHANNELS:
                raise ValueError(f"table is full ({MAX_CHANNELS} channels)")
            self.channels[name] = _check_setting(req.get("handler"), req.get("params", {}))
            return self.get(name)
        if op == "remove":
            self.channels.pop(_check_name(req.get("channel")), None)
            return {}
        if op == "default":
            self.default = _check_setting(req.get("handler"), req.get("params", {}))
            return {"default": self.default}
        if op == "table":
            self.reload()
            return {"default": self.default, "channels": self.channels}
        raise ValueError(f"unknown op {op!r}: expected get, set, remove, default or table")


class ConfigServer:
    """A REP socket answering HandlerTable requests in a background thread (or in ``serve``)."""

    def __init__(
        self, table: HandlerTable, bind: str = "tcp://127.0.0.1:*", curve_keys: str | None = None
    ) -> None:
        self.table = table
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = self._make_socket(bind, curve_keys)
        self.endpoint: str = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests = 0
        self.refused = 0
        self.failures = 0  # requests whose handling raised something unexpected (answered with an error)
        self.replies_dropped = 0  # replies to a peer that had REPLY_HWM unread ones, or was gone

    def _make_socket(self, bind: str, curve_keys: str | None) -> zmq.Socket[bytes]:
        """The server's one socket: every option that bounds what a client can make it hold is set here.

        With ``curve_keys`` it speaks CURVE only and ZAP admits only the client keys in
        ``DIR/authorized``: a client without one cannot connect, so it can neither read nor write.

        ROUTER, not REP: REP's strict request/reply state could be wedged by a peer that never
        reads its replies; ROUTER answers each message on its own and drops (and counts) a reply
        its peer has no room for.
        """
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)  # per frame; frames per request: recv_bounded
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.setsockopt(zmq.SNDHWM, REPLY_HWM)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full peer raises EAGAIN: counted, never blocks
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if curve_keys:
                ck.server_secure(sock, curve_keys)
            sock.bind(bind)
        except BaseException:
            sock.close(0)
            raise
        return sock

    def answer(self, frames: list[bytes], extra: int) -> dict[str, Any]:
        """The reply to one request's frames (``extra``: frames past the cap, already discarded)."""
        if extra or len(frames) != 1:
            raise ValueError(f"a request is one frame, got {len(frames) + extra}")
        return {"ok": True, **self.table.handle(orjson.loads(frames[0]))}

    def serve(self) -> None:
        """Answer requests until ``stop``; whatever a request holds, it gets a reply and the loop goes on."""
        for _ in while_serving(self.sock, self._stop):
            try:
                frames, extra = recv_bounded(self.sock, MAX_FRAMES + 2)  # identity, delimiter, request
            except zmq.ZMQError:
                continue
            ident = frames[0]
            body = frames[2:] if len(frames) > 1 and frames[1] == b"" else frames[1:]
            try:
                reply = self.answer(body, extra)
            except (ValueError, OSError) as e:
                self.refused += 1
                reply = {"ok": False, "error": str(e)[:500]}
            except Exception as e:  # a bug must cost one request, not the server
                self.failures += 1
                reply = {"ok": False, "error": f"internal error: {type(e).__name__}"}
            self.requests += 1
            try:
                self.sock.send_multipart([ident, b"", orjson.dumps(reply)], zmq.NOBLOCK)
            except zmq.ZMQError:
                self.replies_dropped += 1  # the peer is gone or has not read its earlier replies

    def start(self) -> ConfigServer:
        self._thread = threading.Thread(target=self._run, name="cp-config-server", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.serve()
        finally:
            self.sock.close(0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        else:
            self.sock.close(0)


def parse_assignment(text: str) -> tuple[str, str, dict[str, str]]:
    """``name=handler[:k=v,k=v]`` -> (name, handler, params)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--set {text!r}: expected CHANNEL=HANDLER[:k=v,...]")
    handler, _, plist = rest.partition(":")
    params = {}
    for item in filter(None, plist.split(",")):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"--set {text!r}: parameter {item!r} needs k=v")
        params[k] = v
    return name, handler, params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default=DEFAULT_BIND, help=f"endpoint to serve on (default {DEFAULT_BIND})")
    parser.add_argument("--table", help="JSON handler table, read again when it changes")
    parser.add_argument("--default", default="buffered", help="handler for names not in the table")
    parser.add_argument("--connect", help="talk to a running server instead of serving")
    parser.add_argument("--set", action="append", default=[], metavar="CHANNEL=HANDLER[:k=v,...]")
    parser.add_argument("--get", action="append", default=[], metavar="CHANNEL")
    parser.add_argument(
        "--curve-keys",
        default=None,
        metavar="DIR",
        help="CurveZMQ keys (cloudprofiler keys generate --out DIR): serving, accept only clients "
        "whose key is in DIR/authorized; with --connect, use the client key (programs: CP_CONFIG_KEYS)",
    )


def run(args: argparse.Namespace) -> int:
    if args.connect:
        if not args.set and not args.get:
            raise ValueError("--connect needs --set or --get")
        for text in args.set:
            name, handler, params = parse_assignment(text)
            reply = request(
                args.connect,
                {"op": "set", "channel": name, "handler": handler, "params": params},
                curve_keys=args.curve_keys,
            )
            print(f"{name}: {reply['handler']} {orjson.dumps(reply['params']).decode()}")
        for name in args.get:
            reply = request(args.connect, {"op": "get", "channel": name}, curve_keys=args.curve_keys)
            print(f"{name}: {reply['handler']} {orjson.dumps(reply['params']).decode()} ({reply['source']})")
        return 0
    if args.set or args.get:
        raise ValueError("--set and --get need --connect")
    table = HandlerTable(args.default, args.table)
    server = ConfigServer(table, args.bind, args.curve_keys)
    print(f"config server on {server.endpoint}; default handler {table.default['handler']}", flush=True)
    try:
        server.serve()
    finally:
        server.sock.close(0)
    return 0
