"""Spark's file-sink metadata log beside the manifests, so ``spark.read.parquet(path)`` is exact.

When a directory holds ``_spark_metadata/``, Spark's batch reader reads the files that log lists
and nothing else from a directory listing (what its own file sink relies on). The sink writes the
same log after each batch's files are in place, from the batch's manifest, so Spark reads exactly
the published files::

    <path>/_spark_metadata/<id>            "v1", then one JSON line per file of batch <id>
    <path>/_spark_metadata/<id>.compact    every file of batches 0..<id> (when (id + 1) % 10 == 0)

Spark's reader reads the latest compaction file and every batch file after it, and finds the
interval from the compaction files present (10, Spark's default
``spark.sql.streaming.fileSink.log.compactInterval``). Each line holds the file's URI as the
user named the path (credentials and query string removed), its size and modification time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import orjson
import pyarrow.fs as pafs

from cp_store.location import Location, StoreError

SPARK_LOG = "_spark_metadata"
COMPACT_INTERVAL = 10  # Spark's default: a reader infers it from the .compact files present
_VERSION_LINE = b"v1"
_PATH_SAFE = "/=:@!$&'()*+,;"  # what a URI path may hold as is (RFC 3986 pchar): "batch=0" stays
_BLOCK_SIZE = 32 << 20  # what Spark's local file status reports; read as a split hint only


def is_compaction(batch_id: int) -> bool:
    return (batch_id + 1) % COMPACT_INTERVAL == 0


def log_location(root: Location, batch_id: int) -> Location:
    name = f"{batch_id}.compact" if is_compaction(batch_id) else str(batch_id)
    return root.join(SPARK_LOG, name)


def file_uri(root: Location, rel: str) -> str:
    """The URI Spark's reader opens for ``rel`` under ``root``: the scheme and authority the user
    gave (no credentials, no query string), the path percent-encoded."""
    if "://" not in root.uri:
        return "file://" + quote(f"{root.path.rstrip('/')}/{rel}", safe=_PATH_SAFE)
    parts = urlsplit(root.uri)
    path = quote(f"{parts.path.rstrip('/')}/{rel}", safe=_PATH_SAFE)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def entries(root: Location, files: Sequence[str], infos: Sequence[pafs.FileInfo]) -> list[bytes]:
    """One log line per published file, from its listing entry (size, modification time)."""
    out = []
    for rel, info in zip(files, infos, strict=True):
        mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
        line: dict[str, Any] = {
            "path": file_uri(root, rel),
            "size": int(info.size or 0),
            "isDir": False,
            "modificationTime": int(mtime),
            "blockReplication": 1,
            "blockSize": _BLOCK_SIZE,
            "action": "add",
        }
        out.append(orjson.dumps(line))
    return out


def read_lines(loc: Location) -> list[bytes] | None:
    """The entry lines of one log file, None if it is not there."""
    try:
        data = loc.read_bytes()
    except FileNotFoundError:
        return None
    lines = data.split(b"\n")
    if not lines or lines[0].strip() != _VERSION_LINE:
        head = lines[0][:40].decode("utf-8", "replace") if lines else ""
        raise StoreError(f"{loc.uri}: not a Spark file sink log (first line {head!r})")
    return [ln for ln in lines[1:] if ln.strip()]


def write_batch(
    root: Location,
    batch_id: int,
    lines: list[bytes],
    lines_of: Callable[[int], list[bytes]],
    durable: bool = False,
) -> None:
    """Write batch ``batch_id``'s log file (its ``lines``); a compaction batch also holds every
    earlier batch's lines: the previous compaction's and the batch files after it, each read
    back or, where missing, rebuilt by ``lines_of(id)`` from that batch's manifest."""
    if is_compaction(batch_id):
        lines = _earlier(root, batch_id, lines_of) + lines
    body = b"\n".join([_VERSION_LINE, *lines])
    log_location(root, batch_id).write_bytes(body, durable=durable)


def _earlier(root: Location, batch_id: int, lines_of: Callable[[int], list[bytes]]) -> list[bytes]:
    out: list[bytes] = []
    start = batch_id - COMPACT_INTERVAL + 1
    if start > 0:
        previous = read_lines(log_location(root, start - 1))
        out += previous if previous is not None else _rebuilt(0, start, root, lines_of)
    for i in range(start, batch_id):
        got = read_lines(log_location(root, i))
        out += got if got is not None else lines_of(i)
    return out


def _rebuilt(lo: int, hi: int, root: Location, lines_of: Callable[[int], list[bytes]]) -> list[bytes]:
    out: list[bytes] = []
    for i in range(lo, hi):
        got = None if is_compaction(i) else read_lines(log_location(root, i))
        out += got if got is not None else lines_of(i)
    return out
