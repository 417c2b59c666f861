"""The factory's front end: the one socket generators talk to, and the record of what it accepted.

Generators connect a DEALER socket to the front end's ROUTER at the factory
endpoint. The front end answers a sender's hello (so a generator never runs
its schedule into a factory that is not there), records every data bucket it
accepts (sender, sequence number, tuple-id range) and forwards it to the
worker processes, and records and acknowledges each end-of-stream.

What it accepted is the ledger's proof: a bucket the front end accepted but
no worker published or rejected was lost inside the factory (a worker died,
the disk failed), and one it never saw was lost before it (the factory was
down). Both are counted with their exact tuple ids, and a sender whose every
bucket was lost still appears.

The record is kept per sender as merged id ranges (a sender's ids only
grow, so it stays small whatever the run's length) and written atomically to
``_front/ledger.json`` every ``SNAPSHOT_S`` and before every end-of-stream is
acknowledged. A crash of the factory process can lose the last snapshot
interval of acceptances: those buckets are then counted as lost before the
factory rather than inside it, never not counted. With ``durability=strict``
each snapshot is fsynced before its rename and the directory after, so an
acknowledged end-of-stream survives a power loss too.

The front end's answers say more than "acknowledged" (``sender_link.AckInfo``):
a hello's answer carries the factory's frame cap (``max_frame_bytes``), so a
generator refuses a bucket too large for it before sending any, and an end of
stream's answer carries the tuples and buckets of that sender it accepted, so
a generator whose connection dropped knows whether its buckets arrived.

Frames over the cap. The socket's ``MAXMSGSIZE`` is well above the cap
(``zmq_bounds.frame_hard_cap``): ZeroMQ answers a frame past ``MAXMSGSIZE``
only by dropping the peer's connection, saying nothing to anyone. A message
with a frame over the cap is received whole, counted (``oversized_frames``),
and forwarded with each frame cut to one byte past the cap: a worker then
dead-letters it as ``oversized`` (the header and the first 64 KiB of the
payload) and, for a valid data header, records its ids as rejected. A worker
never receives more than the cap and a byte per frame.

Beside it, ``_front/progress.json`` tells a reader which senders exist and how
far each has got before any of its tuples is published: per sender id the
wall time of its first hello (answered or waiting for the workers) and its
latest heartbeat ``[seq, event_ms]`` (the data buckets it had sent, and a
lower bound on the event time of every tuple it has still to send), with the
wall time that heartbeat came in. Heartbeats are not forwarded to the workers.
The file is written like the ledger (atomically, at most every ``SNAPSHOT_S``,
fsynced with ``durability=strict``) and read with :func:`read_front_progress`.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import zmq

from cp_source.spool.durability import check_durability, fsync_dirs, fsync_path
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import REFUSED_SENDER_IN_USE, AckInfo, answer_control
from cp_store.private_dirs import ensure_private_dir
from native_tsc.zmq_bounds import cut_frames

FRONT_DIR = "_front"
LEDGER_FILE = "ledger.json"
PROGRESS_FILE = "progress.json"
SNAPSHOT_S = 0.2
POLL_MS = 50
MAX_GREETED = 1 << 20  # sender ids remembered from hellos (the ledger keeps those that sent tuples)
MAX_PENDING_HELLOS = 1024  # senders waiting for the workers: bounded, a hello is a few bytes
MAX_FRAMES = 4  # identity + header + payload + one: a longer message is read, cut here and dead-lettered


def _merge_into(ranges: list[list[int]], first: int, count: int) -> None:
    """Add [first, first + count) to a sorted, merged range list (almost always an append)."""
    if ranges and ranges[-1][0] + ranges[-1][1] == first:
        ranges[-1][1] += count
    elif not ranges or first > ranges[-1][0] + ranges[-1][1]:
        ranges.append([first, count])
    else:  # out of order or a replay: rare, so a full merge is fine
        ranges.append([first, count])
        ranges[:] = bk.merge_ranges(ranges)


class FrontLedger:
    """Per sender: the id ranges of accepted data buckets, their count, the highest seq, the end-of-stream."""

    def __init__(self, spool: str | os.PathLike[str], durability: str = "process") -> None:
        self.durable = check_durability(durability) == "strict"
        self.dir = Path(spool) / FRONT_DIR
        ensure_private_dir(spool)
        ensure_private_dir(self.dir)
        if self.durable:
            fsync_dirs(self.dir, self.dir.parent)  # the directory's name lasts before any snapshot
        self._lock = open(self.dir / "lock", "a+b")  # noqa: SIM115 - held while the front end runs
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RuntimeError(
                f"spool {spool} is in use by another factory: give each factory (each query) its own spool"
            ) from None
        self.senders: dict[int, dict[str, Any]] = read_front_ledger(spool)
        self._dirty = False
        self._last_write = 0.0

    def _sender(self, sender_id: int) -> dict[str, Any]:
        s = self.senders.get(sender_id)
        if s is None:
            s = self.senders[sender_id] = {"ids": [], "buckets": 0, "seq_max": -1, "eos": None}
        return s

    def in_window(self, h: bk.Header) -> bool:
        """True if a data bucket's seq is within its sender's window (``bk.SEQ_WINDOW``)."""
        s = self.senders.get(h.sender_id)
        return bk.seq_in_window(h.seq, s["seq_max"] if s is not None else -1)

    def accept(self, h: bk.Header) -> None:
        s = self._sender(h.sender_id)
        _merge_into(s["ids"], h.first_id, h.count)
        s["buckets"] += 1
        s["seq_max"] = max(s["seq_max"], h.seq)
        self._dirty = True

    def end_of_stream(self, h: bk.Header, eos: bk.EndOfStream) -> bool:
        """Record a sender's totals and write the record; False if the write failed (a full disk):
        then nothing is acknowledged and the sender's next resend tries again."""
        self._sender(h.sender_id)["eos"] = eos.record(h.domain)
        self._dirty = True
        try:
            self.write()
        except OSError:
            return False
        return True

    def write(self) -> None:
        """Replace the ledger file atomically (see :func:`_replace_file`)."""
        _replace_file(self.dir, LEDGER_FILE, {str(k): v for k, v in self.senders.items()}, self.durable)
        self._dirty = False
        self._last_write = time.monotonic()

    def maybe_write(self) -> None:
        if self._dirty and time.monotonic() - self._last_write >= SNAPSHOT_S:
            with contextlib.suppress(OSError):  # a full disk: the next snapshot tries again
                self.write()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._dirty:
                self.write()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()


def _replace_file(directory: Path, name: str, doc: Any, durable: bool) -> None:
    """Replace ``directory/name`` with ``doc`` as JSON atomically (private temp file, then rename);
    durable: the temp file is fsynced before the rename and the directory after, so it lasts."""
    tmp = directory / f"{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps(doc))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, directory / name)
    if durable:
        fsync_path(directory)


class FrontProgress:
    """Per sender: when it first said hello, and its latest heartbeat (``_front/progress.json``)."""

    def __init__(self, directory: Path, durable: bool) -> None:
        self.dir, self.durable = directory, durable
        self.senders: dict[int, dict[str, Any]] = read_front_progress(directory.parent)
        self.ignored = 0  # senders past MAX_GREETED; heartbeats without a hello or past the seq window
        self._dirty = False
        self._last_write = 0.0

    def hello(self, sender_id: int) -> bool:
        """Record a sender's first hello; True when it is new."""
        if sender_id in self.senders:
            return False
        if len(self.senders) >= MAX_GREETED:
            self.ignored += 1
            return False
        self.senders[sender_id] = {"hello_wall": time.time(), "heartbeat": None}
        self._dirty = True
        return True

    def heartbeat(self, h: bk.Header) -> None:
        """Keep the heartbeat with the larger (seq, event_ms): a heartbeat never moves back."""
        s = self.senders.get(h.sender_id)
        if s is None:  # no hello on this spool: a sender must say hello before it counts
            self.ignored += 1
            return
        beat = [h.seq, h.wall_ns // 1_000_000]
        if s["heartbeat"] is None or beat > s["heartbeat"]:
            s["heartbeat"] = beat
        s["heartbeat_wall"] = time.time()  # a quiet sender on a schedule clock repeats the same one
        self._dirty = True

    def write(self) -> None:
        _replace_file(self.dir, PROGRESS_FILE, {str(k): v for k, v in self.senders.items()}, self.durable)
        self._dirty = False
        self._last_write = time.monotonic()

    def maybe_write(self, force: bool = False) -> None:
        """Write when changed, at most every SNAPSHOT_S (``force``: now); a full disk: the next try."""
        if self._dirty and (force or time.monotonic() - self._last_write >= SNAPSHOT_S):
            with contextlib.suppress(OSError):
                self.write()


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"not an integer: {v!r}")
    return v


def _progress_entry(v: Any) -> dict[str, Any]:
    """One sender's progress record, validated field by field (TypeError/ValueError when malformed)."""
    if not isinstance(v, dict):
        raise TypeError("not an object")
    hello = v["hello_wall"]
    if isinstance(hello, bool) or not isinstance(hello, int | float) or not math.isfinite(hello):
        raise TypeError("hello_wall")
    beat = v.get("heartbeat")
    if beat is not None:
        if not isinstance(beat, list) or len(beat) != 2 or _int(beat[0]) < 0:
            raise ValueError("heartbeat")
        beat = [_int(beat[0]), _int(beat[1])]
    out: dict[str, Any] = {"hello_wall": float(hello), "heartbeat": beat}
    at = v.get("heartbeat_wall")
    if beat is not None and isinstance(at, int | float) and not isinstance(at, bool) and math.isfinite(at):
        out["heartbeat_wall"] = float(at)
    return out


def read_front_progress(spool: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Per sender id: ``hello_wall`` (float, time.time() of its first hello), ``heartbeat``
    (``[seq, event_ms]`` or None) and, with a heartbeat, ``heartbeat_wall`` (when the latest came in).

    Empty when the file is missing or torn; entries that do not validate are left out.
    """
    try:
        doc = orjson.loads((Path(spool) / FRONT_DIR / PROGRESS_FILE).read_bytes())
    except (FileNotFoundError, NotADirectoryError, orjson.JSONDecodeError):
        return {}
    out: dict[int, dict[str, Any]] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                sid = int(k)
                if 0 <= sid <= bk.MAX_SENDER and len(out) < MAX_GREETED:
                    out[sid] = _progress_entry(v)
    return out


def recv_capped(sock: zmq.Socket, max_frames: int) -> tuple[list[zmq.Frame], int]:
    """One message (non-blocking), its first ``max_frames`` frames kept; the rest read, dropped, counted."""
    part = sock.recv(zmq.NOBLOCK, copy=False)
    msg = [part]
    dropped = 0
    while part.more:
        part = sock.recv(zmq.NOBLOCK, copy=False)
        if len(msg) < max_frames:
            msg.append(part)
        else:
            dropped += 1
    return msg, dropped


def read_front_ledger(spool: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The front end's record per sender id (empty when no front end ran on this spool)."""
    try:
        doc = orjson.loads((Path(spool) / FRONT_DIR / LEDGER_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    out: dict[int, dict[str, Any]] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                out[int(k)] = {
                    "ids": [[int(a), int(c)] for a, c in v["ids"]],
                    "buckets": int(v["buckets"]),
                    "seq_max": int(v["seq_max"]),
                    "eos": v.get("eos") if isinstance(v.get("eos"), dict) else None,
                }
    return out


class FrontEnd:
    """The front-end thread: ROUTER at the endpoint -> ledger -> PUSH to the workers."""

    def __init__(
        self,
        ctx: zmq.Context,
        front: zmq.Socket,
        back: zmq.Socket,
        spool: str,
        max_frame_bytes: int,
        durability: str = "process",
    ) -> None:
        self.front, self.back = front, back
        self.ledger = FrontLedger(spool, durability)
        self.progress = FrontProgress(self.ledger.dir, self.ledger.durable)
        self.max_frame_bytes = max_frame_bytes
        self.counters = dict.fromkeys(
            (
                "hellos",
                "hellos_refused",
                "accepted",
                "eos",
                "heartbeats",
                "unexpected",
                "forwarded_unparsed",
                "out_of_window",
                "long_messages",
                "frames_dropped",
                "oversized_frames",
            ),
            0,
        )
        self._held: list[Any] | None = None  # one data message waiting for a worker to have room
        # hellos are answered once every worker is ready: a generator acknowledged earlier would run
        # its schedule into workers still starting, and its queue would fill into counted drops
        self.workers_ready = threading.Event()
        self._pending_hellos: dict[bytes, bk.Header] = {}
        self._greeted: dict[int, bytes] = {}  # sender id -> the connection that said hello as it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cp-factory-front", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> FrontEnd:
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _handle(self, msg: list[Any]) -> None:
        """One message from a generator: answer, record, or hold it for the workers."""
        ident, frames = msg[0], msg[1:]
        try:
            h = bk.check_frames(frames, self.max_frame_bytes)
        except bk.BucketError as e:
            # a data header we can trust: its ids were accepted (unless its seq is out of the window)
            if e.header is not None and self.ledger.in_window(e.header):
                self.ledger.accept(e.header)
            self.counters["forwarded_unparsed"] += 1
            # the workers dead-letter it, counted by reason; a frame over the cap reaches them cut
            # (still over it, so the reason stays), never more than their sockets take
            self._held, cut = cut_frames(frames[:MAX_FRAMES], self.max_frame_bytes + 1)
            self.counters["oversized_frames"] += cut
            return
        if h.kind == bk.KIND_DATA and not self.ledger.in_window(h):
            self.counters["out_of_window"] += 1  # not accepted; a worker dead-letters it by reason
            self._held = frames
        elif h.kind == bk.KIND_DATA:
            self.ledger.accept(h)
            self.counters["accepted"] += 1
            self._held = frames
        elif h.kind == bk.KIND_HELLO:
            self.counters["hellos"] += 1
            if self._sender_taken(ident, h.sender_id):
                self.counters["hellos_refused"] += 1
                answer_control(self.front, ident, h, REFUSED_SENDER_IN_USE)
            elif self.workers_ready.is_set():
                # on file before the acknowledgement: a reader knows a sender before its first bucket
                if self.progress.hello(h.sender_id):
                    self.progress.maybe_write(force=True)
                self._reply(ident, h)
            elif ident in self._pending_hellos or len(self._pending_hellos) < MAX_PENDING_HELLOS:
                self.progress.hello(h.sender_id)
                self._pending_hellos[ident] = h
        elif h.kind == bk.KIND_EOS:
            try:
                eos = bk.parse_eos(h, frames[1])
            except bk.BucketError:
                self._held = frames  # a worker dead-letters it as bad_control
                return
            if self.ledger.end_of_stream(h, eos):
                self.counters["eos"] += 1
                self._reply(ident, h, self._accepted(eos))
        elif h.kind == bk.KIND_HEARTBEAT:
            self.counters["heartbeats"] += 1  # recorded as progress, never forwarded to the workers
            if self.ledger.in_window(h):  # one forged seq far ahead would pin the sender's progress
                self.progress.heartbeat(h)
            else:
                self.progress.ignored += 1
        else:
            self.counters["unexpected"] += 1  # an acknowledgement sent to us: no tuples, nothing to do

    def _sender_taken(self, ident: bytes, sender_id: int) -> bool:
        """True when another connection said hello as ``sender_id``, or the spool holds its tuples.

        A second run under a sender id would number its tuples with ids already used: its buckets
        would be dead-lettered as replays while the sink's count per sender looked whole.
        """
        if sender_id in self.ledger.senders:
            return True
        greeted = self._greeted.get(sender_id)
        if greeted is not None and greeted != ident:
            return True
        if len(self._greeted) < MAX_GREETED:
            self._greeted[sender_id] = ident
        return False

    def _recv(self) -> list[zmq.Frame]:
        """One message, cut to MAX_FRAMES: the frames past it are read and dropped at once.

        ZeroMQ hands a message over only once its last frame is in, each frame bounded by
        MAXMSGSIZE; cutting here keeps a long message from being held or forwarded, and the
        workers dead-letter the cut message (``frame_count``), so it is counted.
        """
        msg, dropped = recv_capped(self.front, MAX_FRAMES)
        if dropped:
            self.counters["frames_dropped"] += dropped
            self.counters["long_messages"] += 1
        return msg

    def _reply(self, ident: bytes, h: bk.Header, info: AckInfo | None = None) -> None:
        """Acknowledge a hello (with the frame cap) or an end of stream (``info``: what was accepted)."""
        if h.kind == bk.KIND_HELLO:
            info = AckInfo(max_frame_bytes=self.max_frame_bytes)
        answer_control(self.front, ident, h, info=info)

    def _accepted(self, eos: bk.EndOfStream) -> AckInfo:
        """What the front end accepted of a sender: its tuples inside the ids its totals name (so
        buckets forged under its id elsewhere do not count), and its buckets."""
        s = self.ledger.senders.get(eos.sender_id)
        if s is None:
            return AckInfo(accepted_tuples=0, accepted_buckets=0)
        lo, hi = eos.first_tuple_id, eos.next_tuple_id
        tuples = sum(max(0, min(a + c, hi) - max(a, lo)) for a, c in s["ids"])
        return AckInfo(accepted_tuples=tuples, accepted_buckets=int(s["buckets"]))

    def _forward_held(self) -> bool:
        """Pass the held message to a worker if one has room; False when none has."""
        if self._held is None:
            return True
        try:
            self.back.send_multipart(self._held, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self._held = None
        return True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # read from generators only while the workers can take more: a full spool then
                # fills the queues back to the generator, whose sends fail as counted drops
                if not self._forward_held():
                    self.back.poll(POLL_MS, zmq.POLLOUT)
                elif self.front.poll(POLL_MS, zmq.POLLIN):
                    for _ in range(256):
                        try:
                            msg = self._recv()
                        except zmq.Again:
                            break
                        self._handle([f.buffer if i else f.bytes for i, f in enumerate(msg)])
                        if not self._forward_held():
                            break
                if self._pending_hellos and self.workers_ready.is_set():
                    self.progress.maybe_write(force=True)  # the senders on file before their acks
                    for ident, h in self._pending_hellos.items():
                        self._reply(ident, h)
                    self._pending_hellos.clear()
                self.ledger.maybe_write()
                self.progress.maybe_write()
        except zmq.ContextTerminated:
            pass
        except BaseException as e:  # recorded for the factory's supervisor; never silent
            self.error = e
        finally:
            self.progress.maybe_write(force=True)
            self.ledger.close()
            for s in (self.front, self.back):
                s.close(0)
