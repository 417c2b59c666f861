"""The sync coordinator: agents register with it, and a ``run`` probes every ordered pair.

One ZeroMQ ROUTER socket (127.0.0.1 by default) carries everything. Pairs are
probed one at a time so probes of different pairs never compete for the CPU
or the network. Results stream back to the client that asked for the run,
one message per pair, then ``done``.

Agents' probe responders answer nobody until told whom to answer: a run first
sends every agent in it the run's addresses (``peers``) and waits for each
acknowledgement (``peers_ok``) before the first probe task. With keys, the
coordinator makes a random probe key at start and hands it to each agent over
the encrypted channel (in the registration acknowledgement and in ``peers``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from cp_common import curve_keys as ck
from cp_common.faces import deprecated_names
from cp_common.zmq_bounds import recv_bounded, send_within
from cp_store.location import Location, check_writable, resolve
from cp_sync.nodes import control
from cp_sync.probe.background import start_daemon
from cp_sync.sync_table import probes_table, write_sync

_PHASE_RE = re.compile(r"^[A-Za-z0-9_\-]{1,32}$")
AGENT_STALE_S = 5.0
MAX_AGENTS = 256  # registered agents; stale ones make room, past that a registration is refused
MAX_FRAMES = 3  # identity, header, rows: frames past this are read and dropped
PEERS_ACK_S = 5.0  # how long a run waits for each agent to confirm whom its responder answers
PROBE_KEY_BYTES = 16


class Refused(ValueError):
    """A well-formed request the coordinator declines (its client gets an error reply)."""


def check_phase(phase: str) -> str:
    """``phase`` if it is a valid phase name."""
    if not _PHASE_RE.match(phase):
        raise ValueError(f"invalid phase {phase!r}: use 1-32 characters from A-Z a-z 0-9 _ -")
    return phase


@dataclass
class _AgentInfo:
    identity: bytes
    domain: str
    hz: float
    host: str
    port: int
    seen: float
    src: str  # where its probes leave from, as it says (its peers' responders answer this address)


@dataclass
class _Run:
    client: bytes
    phase: str
    rounds: int
    gap_us: int
    timeout_ms: int
    tasks: deque = field(default_factory=deque)  # (initiator, responder)
    current: tuple[int, str, str, float] | None = None  # task id, initiator, responder, deadline
    pairs: int = 0
    failed: int = 0
    run_id: int = 0
    waiting: dict[str, float] = field(default_factory=dict)  # agents yet to confirm peers: deadline
    unready: dict[str, str] = field(default_factory=dict)  # agents that did not: why


class Coordinator:
    """Runs the control plane in a background thread (``start``) or the caller's (``serve_forever``)."""

    def __init__(self, bind: str = "127.0.0.1:0", curve_keys: str | None = None) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock, self.address = self._make_socket(control.endpoint(bind), curve_keys)
        self.agents: dict[str, _AgentInfo] = {}
        self.refused = 0  # messages answered with an error or dropped as malformed
        self.failures = 0  # messages whose handling raised something unexpected
        self._run: _Run | None = None
        self._ids = itertools.count(1)
        # Probes are keyed only with keys: without them the control channel could not keep it secret.
        self._probe_key = secrets.token_bytes(PROBE_KEY_BYTES) if curve_keys else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _make_socket(self, ep: str, curve_keys: str | None) -> tuple[zmq.Socket[bytes], str]:
        """The coordinator's one socket, bound: every option bounding what a peer can make it hold is here.

        With ``curve_keys``: CURVE only, and ZAP admits only the client keys in ``DIR/authorized``,
        so an unauthenticated peer cannot connect (neither register nor start a run).
        """
        sock = self._ctx.socket(zmq.ROUTER)
        control.configure(sock)  # MAXMSGSIZE (per frame) and no linger; frames per message: recv_bounded
        sock.setsockopt(zmq.RCVHWM, 256)
        sock.setsockopt(zmq.SNDHWM, 256)  # per peer; a peer that never reads loses replies past it
        if curve_keys:
            try:
                ck.server_secure(sock, curve_keys)
            except BaseException:
                sock.close(0)
                raise
        host, _, port = ep[len("tcp://") :].rpartition(":")
        if port in ("0", "*"):
            return sock, f"tcp://{host}:{sock.bind_to_random_port(f'tcp://{host}')}"
        sock.bind(ep)
        return sock, ep

    # -- lifecycle -----------------------------------------------------
    def start(self) -> Coordinator:
        """Serve from a daemon thread."""
        self._thread = start_daemon(self.serve_forever, "cp-sync-coordinator")
        return self

    def stop(self) -> None:
        """Ask the serving loop to return; join its thread when ``start`` made one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def __enter__(self) -> Coordinator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serve in the caller's thread until ``stop``; closes the socket on the way out."""
        try:
            while not self._stop.is_set():
                if self._sock.poll(100):
                    frames, extra = recv_bounded(self._sock, MAX_FRAMES)
                    if extra or len(frames) < 2:
                        self.refused += 1  # more frames than any request has: dropped unread
                    else:
                        self._handle_safely(frames[0], frames[1:])
                self._check_timeout()
        finally:
            self._sock.close(0)

    # -- messages ------------------------------------------------------
    def _send(self, ident: bytes, header: dict[str, Any], rows: np.ndarray | None = None) -> None:
        self._sock.send_multipart([ident, *control.pack(header, rows)])

    def _live(self) -> list[_AgentInfo]:
        now = time.monotonic()
        live = (a for a in self.agents.values() if now - a.seen < AGENT_STALE_S)
        return sorted(live, key=lambda a: a.domain)

    def _handle_safely(self, ident: bytes, frames: list[bytes]) -> None:
        """``_handle``, except that nothing a message holds can stop the serving loop."""
        try:
            self._handle(ident, frames)
        except Exception as e:  # a bug must cost one message, not the coordinator
            self.failures += 1
            with contextlib.suppress(zmq.ZMQError):
                self._send(ident, {"op": "error", "error": f"internal error: {type(e).__name__}"})

    def _register(self, ident: bytes, header: dict[str, Any]) -> None:
        dom = control.str_field(header, "domain", 64)
        hz = header.get("hz")
        if isinstance(hz, bool) or not isinstance(hz, float | int) or not 0 < hz < 1e12:
            raise ValueError("bad frequency")
        host = control.check_probe_host(control.str_field(header, "host", 64))
        port = control.int_field(header, "port", control.MIN_PROBE_PORT, 65535)
        # An agent that does not say where its probes leave from sends them from its probe host.
        src = control.check_probe_host(control.str_field(header, "src", 64)) if "src" in header else host
        now = time.monotonic()
        old = self.agents.get(dom)
        if old is not None and old.identity != ident and now - old.seen < AGENT_STALE_S:
            raise Refused(f"domain {dom!r} is registered by another live agent")
        if old is None and len(self.agents) >= MAX_AGENTS:
            for stale in [d for d, a in self.agents.items() if now - a.seen >= AGENT_STALE_S]:
                del self.agents[stale]
            if len(self.agents) >= MAX_AGENTS:
                raise Refused(f"the coordinator has {MAX_AGENTS} live agents, its limit")
        self.agents[dom] = _AgentInfo(ident, dom, float(hz), host, port, now, src)
        # acknowledged, so a keyed agent that hears nothing at all knows its handshake failed
        self._send(ident, {"op": "registered", "domain": dom, **self._key_field()})

    def _key_field(self) -> dict[str, str]:
        return {} if self._probe_key is None else {"probe_key": self._probe_key.hex()}

    def _handle(self, ident: bytes, frames: list[bytes]) -> None:
        try:
            header, rows = control.unpack(frames)
            op = header["op"]
            if op == "register":
                self._register(ident, header)
            elif op == "bye":
                gone = header.get("domain")
                if isinstance(gone, str) and gone in self.agents and self.agents[gone].identity == ident:
                    del self.agents[gone]
            elif op == "agents":
                self._send(
                    ident,
                    {
                        "op": "agents",
                        "agents": [
                            {"domain": a.domain, "hz": a.hz, "host": a.host, "port": a.port}
                            for a in self._live()
                        ],
                    },
                )
            elif op == "run":
                self._start_run(ident, header)
            elif op == "result":
                self._result(ident, header, rows)
            elif op == "peers_ok":
                self._peers_ok(ident, header)
        except Refused as e:
            self.refused += 1
            self._send(ident, {"op": "error", "error": str(e)})
        except ValueError as e:
            self.refused += 1
            if header_op(frames) in ("run", "agents"):  # the requests a client waits on an answer to
                self._send(ident, {"op": "error", "error": str(e)})

    def _start_run(self, client: bytes, h: dict[str, Any]) -> None:
        if self._run is not None:
            raise ValueError("a sync run is already in progress")
        live = self._live()
        if len(live) < 2:
            raise ValueError(f"a sync run needs at least 2 registered agents, {len(live)} registered")
        run = _Run(
            client,
            check_phase(control.str_field(h, "phase", 32)),
            control.int_field(h, "rounds", 1, control.MAX_ROUNDS),
            control.int_field(h, "gap_us", 0, 1_000_000),
            control.int_field(h, "timeout_ms", 1, 60_000),
        )
        run.tasks.extend((a.domain, b.domain) for a in live for b in live if a.domain != b.domain)
        self._send(
            client, {"op": "started", "pairs": len(run.tasks), "domains": {a.domain: a.hz for a in live}}
        )
        self._run = run
        self._send_peers(run, live)

    def _send_peers(self, run: _Run, live: list[_AgentInfo]) -> None:
        """Tell every agent of the run whom its responder answers; tasks wait for their acknowledgements.

        The list holds each agent's probe host and the source it probes from: loopback agents are
        listed as registered, and a relay in front of a responder is answered when it sends from the
        host it is reached at (other relays: the agent's ``allow_from``).
        """
        run.run_id = next(self._ids)
        hosts = sorted({a.host for a in live} | {a.src for a in live})
        msg = {"op": "peers", "run": run.run_id, "hosts": hosts, **self._key_field()}
        deadline = time.monotonic() + PEERS_ACK_S
        for a in live:
            run.waiting[a.domain] = deadline
            self._send(a.identity, msg)

    def _peers_ok(self, ident: bytes, h: dict[str, Any]) -> None:
        run = self._run
        if run is None or not run.waiting or h.get("run") != run.run_id:
            return  # late or forged: ignore
        dom = next((d for d in run.waiting if self.agents.get(d) and self.agents[d].identity == ident), None)
        if dom is None:
            return
        del run.waiting[dom]
        if "error" in h:
            run.unready[dom] = f"agent {dom} could not set whom to answer: {str(h['error'])[:200]}"
        if not run.waiting:
            self._begin_tasks()

    def _begin_tasks(self) -> None:
        """Fail the pairs of agents that did not confirm their peers, then dispatch the rest."""
        run = self._run
        assert run is not None
        if run.unready:
            kept: deque = deque()
            for ini, resp in run.tasks:
                why = run.unready.get(ini) or run.unready.get(resp)
                if why is None:
                    kept.append((ini, resp))
                else:
                    self._pair_failed(ini, resp, why)
            run.tasks = kept
        self._next()

    def _next(self) -> None:
        run = self._run
        assert run is not None
        while run.tasks:
            ini, resp = run.tasks.popleft()
            a, b = self.agents.get(ini), self.agents.get(resp)
            if a is None or b is None:
                self._pair_failed(ini, resp, "agent left")
                continue
            tid = next(self._ids)
            # The task's deadline allows every probe its timeout plus the gaps, and a margin.
            budget = run.rounds * (run.gap_us / 1e6 + run.timeout_ms / 1e3) + 5.0
            run.current = (tid, ini, resp, time.monotonic() + budget)
            self._send(
                a.identity,
                {
                    "op": "probe",
                    "task": tid,
                    "host": b.host,
                    "port": b.port,
                    "count": run.rounds,
                    "timeout_ms": run.timeout_ms,
                    "gap_us": run.gap_us,
                },
            )
            return
        self._send(run.client, {"op": "done", "phase": run.phase, "pairs": run.pairs, "failed": run.failed})
        self._run = None

    def _pair_failed(self, ini: str, resp: str, why: str) -> None:
        run = self._run
        assert run is not None
        run.failed += 1
        self._send(run.client, {"op": "pair", "initiator": ini, "responder": resp, "error": why})

    def _result(self, ident: bytes, h: dict[str, Any], rows: np.ndarray | None) -> None:
        run = self._run
        if run is None or run.current is None or h.get("task") != run.current[0]:
            return  # late or forged: ignore
        tid, ini, resp, _ = run.current
        if self.agents.get(ini) is None or self.agents[ini].identity != ident:
            return
        run.current = None
        if "error" in h or rows is None:
            self._pair_failed(ini, resp, str(h.get("error", "no rows"))[:500])
        elif len(rows) == 0:
            # Nothing to sync from, and most likely a responder that does not list this source.
            self._pair_failed(
                ini,
                resp,
                f"none of {run.rounds} probes was answered: the responder refuses the initiator's source "
                "(behind a relay? give its agent --probe-allow RELAY_IP), a wrong probe key, or no route",
            )
        else:
            run.pairs += 1
            self._send(
                run.client,
                {
                    "op": "pair",
                    "initiator": ini,
                    "responder": resp,
                    "lost": _count_field(h, "lost"),
                    "ignored": _count_field(h, "ignored"),
                    "cpu_ns": h.get("cpu_ns"),  # the agents' probing CPU, for the load report
                },
                rows,
            )
        self._next()

    def _check_timeout(self) -> None:
        run = self._run
        if run is not None and run.waiting and time.monotonic() > min(run.waiting.values()):
            for dom in run.waiting:
                run.unready[dom] = f"agent {dom} did not confirm whom to answer within {PEERS_ACK_S:.0f} s"
            run.waiting.clear()
            self._begin_tasks()
            return
        if run is not None and run.current is not None and time.monotonic() > run.current[3]:
            _, ini, resp, _ = run.current
            run.current = None
            self._pair_failed(ini, resp, "initiator did not answer in time")
            self._next()


def _count_field(h: dict[str, Any], name: str) -> int:
    """A non-negative count an agent reports, or 0 when it sent something else."""
    v = h.get(name, 0)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1 << 62 else 0


def header_op(frames: list[bytes]) -> str | None:
    """The op of a message, or None if it does not parse."""
    try:
        return control.unpack(frames)[0]["op"]
    except (ValueError, KeyError):
        return None


def list_agents(server: str, timeout_s: float = 5.0, curve_keys: str | None = None) -> list[dict[str, Any]]:
    """The agents registered with the coordinator at ``server`` (``curve_keys``: a keys directory)."""
    with _client(server, curve_keys) as c:
        if not send_within(c.sock, control.pack({"op": "agents"}), timeout_s) or not c.sock.poll(
            int(timeout_s * 1000)
        ):
            raise OSError(
                f"no answer from the coordinator at {server}{ck.refusal_hint(c.watch, bool(curve_keys))}"
            )
        h, _ = control.unpack(c.sock.recv_multipart())
        return list(h.get("agents", []))


class _client:
    """A DEALER to the coordinator, keyed when ``curve_keys`` is given, its handshake watched."""

    def __init__(self, server: str, curve_keys: str | None = None) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = ctx.socket(zmq.DEALER)
        control.configure(self.sock)
        try:
            if curve_keys:
                ck.client_secure(self.sock, curve_keys)
        except BaseException:
            self.sock.close(0)
            raise
        self.watch = ck.HandshakeWatch(self.sock)
        self.sock.connect(control.endpoint(server))

    def __enter__(self) -> _client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.watch.close()
        self.sock.close(0)


def _wait_for_agents(server: str, need: int, wait_s: float, curve_keys: str | None) -> None:
    """Until ``need`` agents are registered at ``server``; OSError after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        agents = list_agents(server, curve_keys=curve_keys)
        if len(agents) >= need:
            return
        if time.monotonic() > deadline:
            raise OSError(f"{len(agents)} agents registered at {server} after {wait_s:.0f}s, need {need}")
        time.sleep(0.2)


def _pair_result(phase: str, h: dict[str, Any], rows: np.ndarray) -> tuple[Any, dict[str, Any]]:
    """One pair's probes as a sync table and its summary line (probes, losses, MinRTT)."""
    table = probes_table(
        phase,
        str(h["initiator"]),
        str(h["responder"]),
        rows[:, 1],
        rows[:, 2],
        rows[:, 3],
        rows[:, 4],
        rows[:, 0].astype(np.int32),
    )
    min_rtt = int((rows[:, 3] - rows[:, 1]).min()) if len(rows) else None
    summary = {
        "initiator": h["initiator"],
        "responder": h["responder"],
        "probes": len(rows),
        "lost": h.get("lost", 0),
        "cpu_ns": h.get("cpu_ns"),
        "min_rtt_cycles": min_rtt,
    }
    return table, summary


def run_phase(
    server: str,
    phase: str,
    rounds: int,
    out_dir: str | os.PathLike[str] | Location,
    expect: int = 2,
    wait_s: float = 10.0,
    gap_us: int = 100,
    timeout_ms: int = 200,
    progress: Any = None,
    curve_keys: str | None = None,
) -> dict[str, Any]:
    """Probe every ordered pair of registered agents and write the phase's sync table under ``out_dir``
    (a path or URI, checked before any probe: an unknown scheme or a missing bucket fails at once)."""
    check_phase(phase)
    if not 1 <= rounds <= control.MAX_ROUNDS:
        raise ValueError(f"rounds must be 1..{control.MAX_ROUNDS}")
    out = resolve(out_dir)
    check_writable(out)
    _wait_for_agents(server, max(expect, 2), wait_s, curve_keys)
    tables, pairs, failures = [], [], []
    with _client(server, curve_keys) as c:
        sock = c.sock
        run = {"op": "run", "phase": phase, "rounds": rounds, "gap_us": gap_us, "timeout_ms": timeout_ms}
        if not send_within(sock, control.pack(run), wait_s):
            raise OSError(
                f"the coordinator at {server} took no request{ck.refusal_hint(c.watch, bool(curve_keys))}"
            )
        domains: dict[str, float] = {}
        while True:
            if not sock.poll(int((rounds * (gap_us / 1e6 + timeout_ms / 1e3) + 30) * 1000)):
                raise OSError(f"the coordinator at {server} stopped answering")
            h, rows = control.unpack(sock.recv_multipart())
            op = h["op"]
            if op == "error":
                raise ValueError(str(h.get("error")))
            if op == "started":
                domains = {str(k): float(v) for k, v in dict(h.get("domains", {})).items()}
                if progress is not None:
                    progress(0, int(h.get("pairs", 0)))
            elif op == "pair":
                if rows is None:
                    failures.append(f"{h.get('initiator')} -> {h.get('responder')}: {h.get('error')}")
                else:
                    table, summary = _pair_result(phase, h, rows)
                    tables.append(table)
                    pairs.append(summary)
                if progress is not None:
                    progress(len(pairs) + len(failures), None)
            elif op == "done":
                break
    path = write_sync(out, phase, tables, domains)
    return {"path": path.uri, "phase": phase, "pairs": pairs, "failures": failures, "domains": domains}


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["Coordinator"])
