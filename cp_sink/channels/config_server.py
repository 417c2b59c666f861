"""Online handler configuration: a table of channel name -> handler served over ZeroMQ.

The server answers JSON requests on a REP socket (bound to 127.0.0.1 by
default; requests over 64 KiB are refused by ZeroMQ itself)::

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

from cp_sink.channels.config_client import MAX_MESSAGE, request
from cp_sink.channels.handler_spec import parse_channel_handler

DEFAULT_BIND = "tcp://127.0.0.1:5590"
MAX_CHANNELS = 10_000
MAX_NAME = 128

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


def _check_setting(handler: Any, params: Any) -> dict[str, Any]:
    if not isinstance(handler, str) or not isinstance(params, dict):
        raise ValueError("a setting needs a handler name and a params object")
    name, checked = parse_channel_handler(handler, params)
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

    def __init__(self, table: HandlerTable, bind: str = "tcp://127.0.0.1:*") -> None:
        self.table = table
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(bind)
        self.endpoint: str = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests = 0

    def serve(self) -> None:
        """Answer requests until ``stop``."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            msg = self.sock.recv()
            try:
                reply = {"ok": True, **self.table.handle(orjson.loads(msg))}
            except (ValueError, OSError) as e:
                reply = {"ok": False, "error": str(e)[:500]}
            self.requests += 1
            self.sock.send(orjson.dumps(reply))

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


def run(args: argparse.Namespace) -> int:
    if args.connect:
        if not args.set and not args.get:
            raise ValueError("--connect needs --set or --get")
        for text in args.set:
            name, handler, params = parse_assignment(text)
            reply = request(
                args.connect, {"op": "set", "channel": name, "handler": handler, "params": params}
            )
            print(f"{name}: {reply['handler']} {orjson.dumps(reply['params']).decode()}")
        for name in args.get:
            reply = request(args.connect, {"op": "get", "channel": name})
            print(f"{name}: {reply['handler']} {orjson.dumps(reply['params']).decode()} ({reply['source']})")
        return 0
    if args.set or args.get:
        raise ValueError("--set and --get need --connect")
    table = HandlerTable(args.default, args.table)
    server = ConfigServer(table, args.bind)
    print(f"config server on {server.endpoint}; default handler {table.default['handler']}", flush=True)
    try:
        server.serve()
    finally:
        server.sock.close(0)
    return 0
