"""A sync agent: one per node or TSC domain. It answers probes and runs the probes it is asked to.

It registers with the coordinator (domain id, frequency, UDP probe address and
the address its probes leave from), keeps a C responder running, and on a
``probe`` task runs the C initiator against another agent's responder and sends
the stamps back, already in its own domain (its virtual transform applied).

The responder answers nobody until the coordinator names the run's agents (a
``peers`` message before each run), so it cannot be used as a reflector. With
keys, the coordinator also hands out a probe key over the encrypted channel and
every probe carries a SipHash-2-4 tag under it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import zmq

import native_tsc
from cp_common import curve_keys as ck
from cp_sync.nodes import control
from cp_sync.probe.native import Responder, initiate
from native_tsc import probe_loops

# how long a refused registration is retried: the coordinator frees a silent agent's domain after 5 s
REFUSED_GIVE_UP_S = 15.0
# a keyed agent whose registration is never acknowledged: its handshake failed without an event
KEYED_SILENCE_GIVE_UP_S = 30.0
MAX_PEERS = probe_loops.MAX_ALLOW  # addresses in one ``peers`` message


def parse_probe_key(header: dict[str, Any]) -> bytes | None:
    """The probe key a coordinator message carries (hex, 16 bytes), or None when it carries none."""
    v = header.get("probe_key")
    if v is None:
        return None
    if not isinstance(v, str) or len(v) != 2 * probe_loops.KEY_SIZE:
        raise ValueError(f"field 'probe_key' must be {2 * probe_loops.KEY_SIZE} hex digits")
    try:
        return bytes.fromhex(v)
    except ValueError:
        raise ValueError(f"field 'probe_key' must be {2 * probe_loops.KEY_SIZE} hex digits") from None


def parse_peers(header: dict[str, Any]) -> list[str]:
    """The IPv4 addresses a ``peers`` message lists (bounded, each checked)."""
    hosts = header.get("hosts")
    if not isinstance(hosts, list) or len(hosts) > MAX_PEERS:
        raise ValueError(f"field 'hosts' must be a list of at most {MAX_PEERS} addresses")
    if not all(isinstance(h, str) for h in hosts):
        raise ValueError("field 'hosts' must hold IPv4 addresses as strings")
    return [control.check_ipv4(h) for h in hosts]


def _source_towards(server: str) -> str:
    """This host's IPv4 address towards ``server``'s host, as the kernel would pick it (nothing is sent)."""
    host = server[len("tcp://") :].rpartition(":")[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))  # a UDP connect only chooses the route and the source
        except OSError as e:
            raise ValueError(f"cannot tell the probe source address towards {host}: {e}") from None
        return str(s.getsockname()[0])


class Agent:
    """Registers with ``server`` and serves probe tasks until ``stop()``.

    ``curve_keys``: a keys directory when the coordinator runs with keys. A coordinator that
    refuses this agent's key says nothing; the agent sees the failed handshake on its socket's
    monitor and ``run`` raises ``ConnectionRefusedError`` naming it, instead of waiting forever.

    ``allow_from``: IPv4 sources the responder always answers besides the run's agents, for probes
    that reach it through a relay which sends them on from its own address.
    """

    def __init__(
        self,
        server: str,
        probe_bind: str = "127.0.0.1",
        probe_port: int = 0,
        advertise: str | None = None,
        heartbeat_s: float = 1.0,
        curve_keys: str | None = None,
        allow_from: Iterable[str] = (),
    ) -> None:
        self.server = control.endpoint(server)
        self.curve_keys = curve_keys
        self.domain = native_tsc.domain_id()
        self.hz = native_tsc.frequency_hz()
        self.allow_from = tuple(control.check_ipv4(h) for h in allow_from)
        # Nobody but allow_from is answered until the coordinator names a run's agents.
        self.responder = Responder(probe_bind, probe_port, allow=self.allow_from)
        self.probe_key: bytes | None = None
        host, port = self.responder.address
        relayed = bool(advertise and ":" in advertise)
        if advertise and ":" in advertise:
            # HOST:PORT when peers reach the probe port through a relay or a port mapping.
            advertise, _, port_s = advertise.rpartition(":")
            port = control.int_field({"port": int(port_s) if port_s.isdigit() else -1}, "port", 1, 65535)
        self.advertise = control.check_ipv4(advertise or host)
        if self.advertise == "0.0.0.0":
            raise ValueError("probe address 0.0.0.0 cannot be reached: pass --advertise with this node's IP")
        self.port = port
        # Where this agent's probes leave from, for its peers' allow-lists: the bound address; on 0.0.0.0
        # the advertised one, unless that is a relay's (HOST:PORT), then the address towards the server.
        self.probe_bind = probe_bind
        if probe_bind != "0.0.0.0":
            self.src = control.check_ipv4(probe_bind)
        else:
            self.src = _source_towards(self.server) if relayed else self.advertise
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self.tasks_done = 0
        self._responder_cpu_reported = 0

    def stop(self) -> None:
        """Ask run() to return."""
        self._stop.set()

    def _register(self, sock: zmq.Socket[bytes]) -> None:
        header = {
            "op": "register",
            "domain": self.domain,
            "hz": self.hz,
            "host": self.advertise,
            "port": self.port,
            "src": self.src,
        }
        # Never block: a DEALER with no pipe to the coordinator (one whose handshake was refused)
        # would hold the loop that notices the refusal. The next heartbeat registers again.
        with contextlib.suppress(zmq.Again):
            sock.send_multipart(control.pack(header), zmq.NOBLOCK)

    def run(self) -> None:
        """Serve until stop(); the responder runs for the whole time."""
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        control.configure(sock)
        try:
            if self.curve_keys:
                ck.client_secure(sock, self.curve_keys)
        except BaseException:
            sock.close(0)
            raise
        watch = ck.HandshakeWatch(sock)
        sock.connect(self.server)
        self.responder.start()
        try:
            self._register(sock)
            last = time.monotonic()
            refused_since: float | None = None
            started, heard = time.monotonic(), False
            while not self._stop.is_set():
                if sock.poll(200) == 0:
                    why = watch.failure()
                    silent = time.monotonic() - started > KEYED_SILENCE_GIVE_UP_S
                    if why is None and self.curve_keys and not heard and silent:
                        why = (
                            f"no answer to its registration in {KEYED_SILENCE_GIVE_UP_S:.0f} s with keys "
                            "configured: the handshake failed (wrong or unauthorized key?)"
                        )
                    if why is not None:  # a refused key never heals: fail loudly, not wait forever
                        raise ConnectionRefusedError(
                            f"the coordinator at {self.server} refused this agent: {why}"
                        )
                    if time.monotonic() - last >= self.heartbeat_s:
                        # Re-registering doubles as a heartbeat and survives a coordinator restart.
                        self._register(sock)
                        last = time.monotonic()
                    continue
                try:
                    header, _ = control.unpack(sock.recv_multipart())
                except ValueError:
                    continue
                heard = True
                if header["op"] in ("registered", "peers", "probe"):
                    refused_since = None
                    self._dispatch(sock, header)
                elif header["op"] == "error":
                    # a refused registration (its domain held by a live agent): the holder may be this
                    # agent's own crashed predecessor, silent for 5 s at most, so retry before failing
                    refused_since = refused_since or time.monotonic()
                    if time.monotonic() - refused_since > REFUSED_GIVE_UP_S:
                        raise ConnectionRefusedError(
                            f"the coordinator at {self.server} refused this agent: {header.get('error')}"
                        )
            with contextlib.suppress(zmq.Again):  # no pipe to say it on: the coordinator times it out
                sock.send_multipart(control.pack({"op": "bye", "domain": self.domain}), zmq.NOBLOCK)
        finally:
            watch.close()
            sock.close(0)
            self.responder.close()

    def _dispatch(self, sock: zmq.Socket[bytes], header: dict[str, Any]) -> None:
        """Handle one message of the coordinator's: its acknowledgement, a run's peers, a probe task."""
        op = header["op"]
        if op == "registered":
            # A malformed key changes nothing here: the run's peers message carries it again, and that
            # failure goes back to the coordinator, which fails the agent's pairs naming it.
            with contextlib.suppress(ValueError):
                self._set_key(parse_probe_key(header))
        elif op == "peers":
            sock.send_multipart(self._peers(header))
        elif op == "probe":
            sock.send_multipart(self._probe(header))
            self.tasks_done += 1

    def _set_key(self, key: bytes | None) -> None:
        self.probe_key = key
        self.responder.set_key(key)

    def _peers(self, header: dict[str, Any]) -> list[bytes]:
        """Answer the run's agents (and ``allow_from``) from now on; acknowledge, or say what was wrong."""
        run = header.get("run")
        reply: dict[str, Any] = {"op": "peers_ok", "run": run if isinstance(run, int) else -1}
        try:
            key = parse_probe_key(header)
            hosts = parse_peers(header)
            if key is not None:
                self._set_key(key)
            self.responder.set_allowed([*self.allow_from, *hosts])
        except ValueError as e:
            reply["error"] = str(e)
        return control.pack(reply)

    def _initiator_bind(self, host: str) -> str | None:
        """The address probes to ``host`` leave from: the one peers were told (``src``) where it can be."""
        if self.probe_bind != "0.0.0.0" and host.startswith("127.") == self.probe_bind.startswith("127."):
            return self.probe_bind
        # Another scope than the bound address: the kernel picks (loopback: 127.0.0.1).
        return None if host.startswith("127.") else "0.0.0.0"

    def _probe(self, task: dict[str, Any]) -> list[bytes]:
        try:
            tid = control.int_field(task, "task", 0, 2**62)
        except ValueError:
            tid = -1
        try:
            host = control.check_ipv4(control.str_field(task, "host", 64))
            port = control.int_field(task, "port", 1, 65535)
            count = control.int_field(task, "count", 1, control.MAX_ROUNDS)
            timeout_ms = control.int_field(task, "timeout_ms", 1, 60_000)
            gap_us = control.int_field(task, "gap_us", 0, 1_000_000)
            cpu0 = time.thread_time_ns()  # the C loop runs in this thread with the GIL released
            res = initiate(
                host,
                port,
                count,
                timeout_ms=timeout_ms,
                gap_us=gap_us,
                bind=self._initiator_bind(host),
                key=self.probe_key,
            )
            initiator_cpu = time.thread_time_ns() - cpu0
        except (ValueError, OSError) as e:
            return control.pack({"op": "result", "task": tid, "error": str(e)})
        rows = np.column_stack([res.seq, res.c_i, res.c_j, res.c_k, res.ns_i])
        header: dict[str, Any] = {
            "op": "result",
            "task": tid,
            "domain": self.domain,
            "lost": res.lost,
            "ignored": res.ignored,
        }
        # The probing load: this task's initiator loop, and what the responder used since the last report.
        header["cpu_ns"] = initiator_cpu + self._responder_cpu_since_report()
        return control.pack(header, rows)

    def _responder_cpu_since_report(self) -> int:
        now = self.responder.cpu_ns()
        if now is None:
            return 0
        delta = max(0, now - self._responder_cpu_reported)
        self._responder_cpu_reported = now
        return delta
