"""The front end's records in the spool: what it accepted (``_front/ledger.json``) and what each
sender said (``_front/progress.json``), written by the factory's front end, read by the ledger,
the ready frontier and the workers.

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

Beside it, ``_front/progress.json`` tells a reader which senders exist and how
far each has got before any of its tuples is published: per sender id the
wall time of its first hello (answered or waiting for the workers) and its
latest heartbeat ``[seq, event_ms]`` (the data buckets it had sent, and a
lower bound on the event time of every tuple it has still to send), with the
wall time that heartbeat came in. Heartbeats are not forwarded to the workers.
It is a snapshot naming its log, ``_front/progress.<generation>.log``: a new
sender's hello is one line appended before the hello is acknowledged, and the
senders whose heartbeat changed are one line each at most every ``SNAPSHOT_S``
(fsynced with ``durability=strict``), so recording a sender costs the same
with 10 senders known or 100,000. The log is folded into a new snapshot (written
atomically, under a new generation) at start and once it outgrows both
``LOG_MIN_BYTES`` and the snapshot. At most ``MAX_GREETED`` senders are
recorded: a hello past them is answered but not recorded, and counted
(``senders_unrecorded`` in the front end's counters). Read it with
:func:`read_front_progress` (the snapshot, then its log's whole lines).

The front end itself (its socket and what it answers) is ``cp_source.factory.front``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import time
from pathlib import Path
from typing import Any

import orjson

from cp_common.faces import deprecated_names
from cp_source.spool.durability import check_durability
from cp_source.wire import bucket as bk
from cp_store.atomic_files import atomic_write, fsync_dirs
from cp_store.private_dirs import ensure_private_dir

FRONT_DIR = "_front"
LEDGER_FILE = "ledger.json"
PROGRESS_FILE = "progress.json"  # the senders' snapshot, and the generation of its log
PROGRESS_LOG = "progress.{}.log"  # one JSON line per change of a sender since that snapshot
SNAPSHOT_S = 0.2
LOG_MIN_BYTES = 1 << 20  # the log is folded into the snapshot past this and past the snapshot's size
MAX_GREETED = 1 << 17  # sender ids recorded from hellos (the ledger keeps those that sent tuples)


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
        doc = orjson.dumps({str(k): v for k, v in self.senders.items()})
        _replace_file(self.dir, LEDGER_FILE, doc, self.durable)
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


def _replace_file(directory: Path, name: str, doc: bytes, durable: bool) -> None:
    """Replace ``directory/name`` with ``doc`` atomically (private temp file, then rename);
    durable: the temp file is fsynced before the rename and the directory after, so it lasts."""
    tmp = directory / f"{name}.{os.getpid()}.tmp"
    atomic_write(directory / name, doc, durable, tmp=tmp)


class FrontProgress:
    """Per sender: when it first said hello, and its latest heartbeat: ``_front/progress.json`` (a
    snapshot) and the lines appended to its log since (``progress.<generation>.log``).

    A change costs one appended line, whatever the number of senders known; the snapshot is
    rewritten only when the log has grown past ``LOG_MIN_BYTES`` and past the snapshot's own size
    (so each rewrite is paid for by as many appended bytes: constant cost per change), and once at
    start. At most ``MAX_GREETED`` senders are recorded; a hello past them is still answered,
    counted in ``unrecorded`` and not written (the ledger still counts its tuples).
    """

    def __init__(self, directory: Path, durable: bool) -> None:
        self.dir, self.durable = directory, durable
        self.senders: dict[int, dict[str, Any]] = read_front_progress(directory.parent)
        self.ignored = 0  # heartbeats without a hello or past the seq window
        self.unrecorded = 0  # hellos of new senders past MAX_GREETED: answered, not recorded
        self._changed: dict[int, None] = {}  # senders changed since the last append, in order
        self._last_write = self._failed_at = 0.0
        self._gen = _snapshot_generation(directory)
        self._log_fd = -1
        self._log_bytes = self._snap_bytes = 0
        try:
            self._compact()  # a fresh log: a torn tail of the last run is never appended to
        except OSError:
            self._log_fd = -1  # a full disk: the next write compacts again

    def hello(self, sender_id: int) -> bool:
        """Record a sender's first hello; True when it is new."""
        if sender_id in self.senders:
            return False
        if len(self.senders) >= MAX_GREETED:
            self.unrecorded += 1
            return False
        self.senders[sender_id] = {"hello_wall": time.time(), "heartbeat": None}
        self._changed[sender_id] = None
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
        self._changed[h.sender_id] = None

    def write(self) -> None:
        """Append a line per sender changed since the last write (fsynced when durable), or rewrite
        the snapshot once the log has outgrown it; OSError leaves the changes for the next write."""
        if self._log_fd < 0 or self._log_bytes > max(LOG_MIN_BYTES, self._snap_bytes):
            self._compact()
        elif self._changed:
            lines = b"".join(orjson.dumps({"s": sid, **self.senders[sid]}) + b"\n" for sid in self._changed)
            try:
                # one write, O_APPEND: lines land in order; a short write (a full disk) is a failure
                if os.write(self._log_fd, lines) != len(lines):
                    raise OSError(errno.ENOSPC, "progress log write cut short")
                if self.durable:
                    os.fsync(self._log_fd)
            except OSError:
                self._close_log()  # what reached the log may be torn: the next write compacts
                raise
            self._log_bytes += len(lines)
        self._changed.clear()
        self._last_write = time.monotonic()

    def _compact(self) -> None:
        """Every sender into a new snapshot naming a new, empty log; then the old log goes.

        The new log exists before the snapshot names it, and the old one is removed only after, so
        a reader (snapshot, then its log) sees either generation whole, never a gap between them.
        """
        old = self._gen
        gen = old + 1
        fd = os.open(self.dir / _log_name(gen), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        doc = orjson.dumps({**{str(k): v for k, v in self.senders.items()}, "log": gen})
        try:
            _replace_file(self.dir, PROGRESS_FILE, doc, self.durable)
        except OSError:
            os.close(fd)
            raise
        self._close_log()
        self._log_fd, self._gen, self._log_bytes, self._snap_bytes = fd, gen, 0, len(doc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.dir / _log_name(old))
        self._changed.clear()

    def _close_log(self) -> None:
        if self._log_fd >= 0:
            os.close(self._log_fd)
        self._log_fd = -1

    def maybe_write(self, force: bool = False) -> None:
        """Write when changed, at most every SNAPSHOT_S (``force``: now); a full disk: the next try."""
        now = time.monotonic()
        # after a failed write (a full disk) the next one rewrites every sender: at most every
        # SNAPSHOT_S, even when forced, so a flood of hellos on a full disk stays at constant cost
        force = force and (self._log_fd >= 0 or now - self._failed_at >= SNAPSHOT_S)
        if (self._changed or self._log_fd < 0) and (force or now - self._last_write >= SNAPSHOT_S):
            try:
                self.write()
            except OSError:
                self._failed_at = self._last_write = now

    def close(self) -> None:
        """Write what changed, then release the log."""
        self.maybe_write(force=True)
        self._close_log()


def _log_name(gen: int) -> str:
    return PROGRESS_LOG.format(gen)


def _snapshot_generation(directory: Path) -> int:
    """The log generation the snapshot names (0: no snapshot, or one written before logs)."""
    gen, _ = _read_snapshot(directory)
    return gen


def _read_snapshot(directory: Path) -> tuple[int, dict[str, Any]]:
    """The snapshot's log generation and its sender entries (raw); (0, {}) when missing or torn."""
    try:
        doc = orjson.loads((directory / PROGRESS_FILE).read_bytes())
    except (FileNotFoundError, NotADirectoryError, orjson.JSONDecodeError):
        return 0, {}
    if not isinstance(doc, dict):
        return 0, {}
    gen = doc.pop("log", 0)
    if isinstance(gen, bool) or not isinstance(gen, int) or not 0 <= gen < 1 << 62:
        gen = 0
    return gen, doc


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

    The snapshot, then the lines of the log it names (a later line of a sender replaces its
    entry). Empty when nothing was written or the snapshot is torn; entries and lines that do not
    validate are left out, a torn last line of the log too (a crash while it was appended).
    """
    directory = Path(spool) / FRONT_DIR
    gen, tail = 0, b""
    doc: dict[str, Any] = {}
    for _ in range(8):  # a compaction between reading the snapshot and its log: read both again
        gen, doc = _read_snapshot(directory)
        try:
            tail = (directory / _log_name(gen)).read_bytes() if gen else b""
        except (FileNotFoundError, NotADirectoryError):
            if _snapshot_generation(directory) != gen:
                continue
        break
    out: dict[int, dict[str, Any]] = {}
    for k, v in doc.items():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            _take(out, int(k), v)
    for line in tail.split(b"\n")[:-1]:  # past the last newline: a line still being written
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            v = orjson.loads(line)
            _take(out, _int(v.pop("s")), v)
    return out


def _take(out: dict[int, dict[str, Any]], sid: int, v: Any) -> None:
    """Put one validated entry of sender ``sid`` into ``out`` (at most MAX_GREETED senders)."""
    if 0 <= sid <= bk.MAX_SENDER and (sid in out or len(out) < MAX_GREETED):
        out[sid] = _progress_entry(v)


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


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["read_front_progress"])
