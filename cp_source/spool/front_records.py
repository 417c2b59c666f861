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
The file is written like the ledger (atomically, at most every ``SNAPSHOT_S``,
fsynced with ``durability=strict``) and read with :func:`read_front_progress`.

The front end itself (its socket and what it answers) is ``cp_source.factory.front``.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from pathlib import Path
from typing import Any

import orjson

from cp_source.spool.durability import check_durability
from cp_source.wire import bucket as bk
from cp_store.atomic_files import atomic_write, fsync_dirs
from cp_store.private_dirs import ensure_private_dir

FRONT_DIR = "_front"
LEDGER_FILE = "ledger.json"
PROGRESS_FILE = "progress.json"
SNAPSHOT_S = 0.2
MAX_GREETED = 1 << 20  # sender ids remembered from hellos (the ledger keeps those that sent tuples)


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
    atomic_write(directory / name, orjson.dumps(doc), durable, tmp=tmp)


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
