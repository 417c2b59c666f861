"""CurveZMQ keys: generate them, secure a server or client socket, and say why a handshake failed.

One directory holds everything (``cloudprofiler keys generate --out DIR``)::

    DIR/server.key            the servers' public key (every client needs it)
    DIR/server.key_secret     the servers' key pair (only hosts that run a server)
    DIR/client.key            the clients' public key
    DIR/client.key_secret     the clients' key pair (only hosts that run a client)
    DIR/authorized/*.key      the client public keys a server accepts (ZAP)

A server socket gets ``server_secure`` before it binds: it then speaks CURVE
only, and a ZAP authenticator on its context accepts only clients whose public
key is in ``DIR/authorized``. A client socket gets ``client_secure`` before it
connects. ZeroMQ tells a refused client nothing: it just never gets an answer.
``HandshakeWatch`` listens to the client socket's monitor events so the
timeout that follows can say that the handshake failed and why.

This module sits in the ground package so that every server package can use it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

SERVER = "server"
CLIENT = "client"
AUTHORIZED = "authorized"

_FAIL_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_auth_lock = threading.Lock()
_authenticators: dict[int, tuple[Any, ThreadAuthenticator, Path]] = {}


class KeysError(ValueError):
    """A keys directory or key file is missing, malformed or not private."""


def generate(out: str | os.PathLike[str]) -> dict[str, str]:
    """Create the server and client key pairs in ``out`` (0700, secrets 0600); refuse to overwrite."""
    d = Path(out)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_dir(d)
    os.chmod(d, 0o700)
    existing = [n for n in (f"{SERVER}.key_secret", f"{CLIENT}.key_secret") if (d / n).exists()]
    if existing:
        raise KeysError(f"{d} already holds {', '.join(existing)}: refusing to overwrite keys")
    paths: dict[str, str] = {}
    for name in (SERVER, CLIENT):
        public, secret = zmq.auth.create_certificates(d, name)
        os.chmod(secret, 0o600)
        os.chmod(public, 0o644)
        paths[f"{name}_public"], paths[f"{name}_secret"] = str(public), str(secret)
    auth = d / AUTHORIZED
    auth.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(d / f"{CLIENT}.key", auth / f"{CLIENT}.key")
    paths["authorized"] = str(auth)
    return paths


def _check_dir(d: Path) -> None:
    """A keys directory must be a real directory of this user that nobody else can write."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        raise KeysError(
            f"keys directory {d} does not exist (create it: cloudprofiler keys generate --out {d})"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise KeysError(f"keys directory {d} is not a directory (or is a symlink)")
    if st.st_uid != os.getuid():
        raise KeysError(f"keys directory {d} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o022:
        raise KeysError(f"keys directory {d} is writable by group or others (chmod 700 {d})")


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret) from a key file; a secret file must be private to this user."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise KeysError(f"key file {path} is missing") from None
    if secret and (st.st_uid != os.getuid() or st.st_mode & 0o077):
        raise KeysError(f"secret key file {path} must belong to you with mode 0600 (chmod 600 {path})")
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as e:
        raise KeysError(f"key file {path} is malformed: {e}") from None
    if secret and not sec:
        raise KeysError(f"key file {path} holds no secret key")
    return public, sec


def _keys_dir(keys_dir: str | os.PathLike[str]) -> Path:
    d = Path(keys_dir)
    _check_dir(d)
    return d


def server_secure(sock: zmq.Socket[Any], keys_dir: str | os.PathLike[str]) -> None:
    """Make ``sock`` a CURVE server accepting only ``keys_dir/authorized`` clients; call before bind."""
    d = _keys_dir(keys_dir)
    public, secret = _load(d / f"{SERVER}.key_secret", secret=True)
    ensure_authenticator(sock.context, d / AUTHORIZED)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def client_secure(sock: zmq.Socket[Any], keys_dir: str | os.PathLike[str]) -> None:
    """Give ``sock`` the client key pair and the server's public key; call before connect."""
    d = _keys_dir(keys_dir)
    public, secret = _load(d / f"{CLIENT}.key_secret", secret=True)
    server_public, _ = _load(d / f"{SERVER}.key", secret=False)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


def ensure_authenticator(ctx: zmq.Context[Any], authorized: Path) -> None:
    """Start (once per context) the ZAP authenticator that accepts the public keys in ``authorized``."""
    _check_dir(authorized)
    keys = zmq.auth.load_certificates(authorized)
    if not keys:
        raise KeysError(f"{authorized} holds no client public key (*.key): no client could connect")
    with _auth_lock:
        held = _authenticators.get(id(ctx))
        if held is not None and held[0] is ctx:
            if held[2] != authorized:
                raise KeysError(f"this process already accepts the clients of {held[2]}, not {authorized}")
            return
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=str(authorized))
        _authenticators[id(ctx)] = (ctx, auth, authorized)


def release(ctx: zmq.Context[Any]) -> None:
    """Stop the context's authenticator, if any: its socket would keep ``ctx.term()`` waiting."""
    with _auth_lock:
        held = _authenticators.pop(id(ctx), None)
    if held is not None:
        held[1].stop()


class HandshakeWatch:
    """The handshake failures seen on a client socket (its monitor), to explain a missing answer."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self._sock = sock
        self._mon: zmq.Socket[Any] | None = sock.get_monitor_socket(_FAIL_EVENTS)
        self._seen = 0

    def failure(self) -> str | None:
        """Why the handshake failed, from the events so far; None when none failed."""
        while self._mon is not None and self._mon.poll(0):
            try:
                event = parse_monitor_message(self._mon.recv_multipart(zmq.NOBLOCK))
            except (zmq.ZMQError, RuntimeError):
                break
            self._seen |= int(event["event"])
        if self._seen & zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return "the CurveZMQ handshake failed: the server refused this client's key"
        if self._seen & (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            return "the CurveZMQ handshake failed: keys missing on one side, or the wrong server key"
        return None

    def close(self) -> None:
        """Stop monitoring; the socket itself stays open."""
        if self._mon is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._mon.close(0)
            self._mon = None


def client_socket(
    ctx: zmq.Context[Any], max_bytes: int, keys_dir: str | os.PathLike[str] | None
) -> tuple[zmq.Socket[Any], HandshakeWatch]:
    """A REQ socket that never lingers and takes no message over ``max_bytes``, with the client keys
    of ``keys_dir`` when one is given, and the watch that names a refused handshake (closed again
    when the keys cannot be loaded)."""
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    try:
        if keys_dir:
            client_secure(sock, keys_dir)
        return sock, HandshakeWatch(sock)
    except BaseException:
        sock.close(0)
        raise


def refusal_hint(watch: HandshakeWatch | None, keyed: bool) -> str:
    """A sentence for a client's timeout message: the handshake failure seen, or the keys to check."""
    why = watch.failure() if watch is not None else None
    if why:
        return f"; {why}: check --curve-keys on both sides"
    if keyed:
        return "; keys are configured: the handshake may have failed (wrong or unauthorized key)"
    return ""


# The ``cloudprofiler keys`` command: this module is its own command module (no parsing module apart).
DESCRIPTION = """\
Make the CurveZMQ key pairs for authenticated, encrypted sockets.

example:
  cloudprofiler keys generate --out ~/.cloudprofiler-keys
  cloudprofiler factory --spool /data/spool --endpoint tcp://0.0.0.0:5555 --curve-keys ~/.cloudprofiler-keys

DIR gets server.key / server.key_secret, client.key / client.key_secret and
authorized/ (the client public keys servers accept). DIR is created 0700 and
secret files 0600. Then pass --curve-keys DIR to every command (and the
curveKeys option to the reader): servers accept only the clients in
DIR/authorized. Existing keys are never overwritten.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["generate"], help="generate: create the key pairs")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to create the keys in")


def run(args: argparse.Namespace) -> int:
    paths = generate(args.out)
    for name, path in paths.items():
        print(f"{name:<14}{path}")
    print(f"use: --curve-keys {args.out} (reader option curveKeys)")
    return 0
