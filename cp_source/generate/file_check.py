"""The lines of a ``file:PATH`` workload, read once and checked against the schema before any bucket.

The generator replays a user's NDJSON file cyclically, so one line the factory cannot parse would
land in every bucket and the factory would reject them all. :func:`read_workload_file` therefore
parses EVERY line with the factory's own parser (``cp_source.factory.parse_json.parse_arrow_json``,
whose values and refusals are the rules every factory parser follows) against the schema (Spark
DDL, ``parse_ddl``) before the generator connects to anything:

* a bad line fails the run in one line naming the file, its line number (1-based, blank lines
  counted as the file counts them), the field and why (``BadFileLine``, a ValueError: exit status 2
  from ``cloudprofiler generate``); nothing is sent;
* with ``skip_bad_lines`` only the good lines are kept, and ``FileLines.skipped`` counts the others
  (the summary's ``skipped_lines``); a file whose every line is bad still fails, in one line.

Without a schema each line must only be a JSON object (the factory's schema is then unknown here).

Lines are checked in chunks of up to 64 KiB (one parse each); in a chunk that fails, the factory's
own search for a bucket's bad rows (``cp_source.factory.bad_rows.find_bad_rows``, the rows it would
reject alone) names each bad line, to report the first or to drop them all, and the next chunks
are smaller (``_Chunks``), as a failing chunk costs about three parses of it. A line is blank, and
skipped as the factory's parser skips it, when it holds only spaces, tabs and carriage returns.

Memory is bounded in bytes: a file over ``FILE_MAX_BYTES`` (64 MiB, the factory's default frame cap)
is refused in one line naming its size and the cap, before it is read (and reading stops at the cap
should it grow meanwhile); replay a sample of a larger file. The kept lines, stripped, are sent as
they are written: the factory parses exactly the bytes checked here.
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import orjson
import pyarrow as pa

from cp_source.factory.bad_rows import find_bad_rows
from cp_source.factory.parse_json import parse_arrow_json
from cp_source.wire.bucket import BucketError
from cp_source.wire.workloads import parse_ddl

FILE_MAX_BYTES = 64 << 20
CHECK_MIN_BYTES = 2 << 10
CHECK_CHUNK_BYTES = 64 << 10  # lines parsed together: a failing chunk costs about 3 parses of it
_BLANK = b" \t\r"  # what the factory's parser strips to tell a blank line
SKIP_HINT = "--skip-bad-lines sends only the good lines"
_LINE_N = re.compile(r"^line \d+\b[,:]?\s*")  # a refusal names the line within the chunk


class BadFileLine(ValueError):
    """A line of a replayed file that the factory would refuse: the message names the file, the line
    number, the field and why."""


@dataclass(frozen=True)
class FileLines:
    """A replayed file's kept lines (stripped, in file order) and their 1-based line numbers in the
    file; ``skipped``: bad lines left out (``skip_bad_lines``), ``first_skipped``: why the first was."""

    path: str
    lines: list[bytes]
    numbers: array[int] = field(default_factory=lambda: array("q"))
    skipped: int = 0
    first_skipped: str = ""

    @property
    def nbytes(self) -> int:
        """The kept lines' bytes, each with its newline: one pass over the file as payload."""
        return sum(map(len, self.lines)) + len(self.lines)


def file_path(workload: str) -> str | None:
    """The path of a ``file:PATH`` workload (None: not a file workload); ValueError for ``file:``."""
    if not workload.startswith("file:"):
        return None
    if not workload[5:]:
        raise ValueError("the file workload needs the file to replay: file:PATH")
    return workload[5:]


def read_workload_file(
    workload: str, schema: str | None = None, skip_bad_lines: bool = False, max_bytes: int = FILE_MAX_BYTES
) -> FileLines | None:
    """A ``file:PATH`` workload's lines, each checked (see the module); None for another workload.

    ``schema`` (Spark DDL) and ``skip_bad_lines`` go with a file workload only: the ysb workload's
    schema is fixed, so a schema given with it is refused (ValueError)."""
    path = file_path(workload)
    if path is None:
        if workload == "ysb" and schema:
            raise ValueError("the ysb workload has a fixed schema: give a schema only with file:PATH")
        if skip_bad_lines:
            raise ValueError(f"skip_bad_lines goes with a file:PATH workload (its lines), not {workload}")
        return None
    fields = parse_ddl(schema) if schema else None
    return check_file(path, fields, skip_bad_lines, max_bytes)


def check_file(
    path: str, fields: pa.Schema | None, skip_bad_lines: bool = False, max_bytes: int = FILE_MAX_BYTES
) -> FileLines:
    """Every non-blank line of ``path`` checked against ``fields`` (None: only a JSON object each)."""
    size = os.stat(path).st_size
    if size > max_bytes:
        raise ValueError(
            f"{path} is {size:,} bytes, over the generator's cap of {max_bytes:,} bytes on a replayed "
            "file: replay a sample of it (e.g. the first lines: head -n N)"
        )
    kept, numbers = [], array("q")
    skipped, first = 0, ""
    with open(path, "rb") as f:
        chunks = _Chunks(_numbered(f, path, max_bytes))
        for chunk in chunks:
            before = skipped
            for n, line, why in _checked(chunk, fields):
                if why is None:
                    kept.append(line)
                    numbers.append(n)
                    continue
                if not skip_bad_lines:
                    raise BadFileLine(f"{path} line {n}: {why}; nothing was sent ({SKIP_HINT})")
                skipped += 1
                first = first or f"line {n}: {why}"
            chunks.checked(skipped > before)
    if not kept:
        what = f"all {skipped:,} lines are bad (the first, {first})" if skipped else "no JSON lines"
        raise BadFileLine(f"{path}: {what}; nothing was sent")
    return FileLines(path, kept, numbers, skipped, first)


def _numbered(f: BinaryIO, path: str, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """The file's non-blank lines, stripped, and their 1-based numbers; never more than ``max_bytes``."""
    total, n = 0, 0
    while line := f.readline(max_bytes - total + 1):
        total += len(line)
        if total > max_bytes:
            raise ValueError(f"{path}: over the generator's cap of {max_bytes:,} bytes on a replayed file")
        n += 1
        line = line.rstrip(b"\n").strip(_BLANK)
        if line:
            yield n, line


class _Chunks:
    """The numbered lines in chunks of about ``budget`` bytes. A chunk the parser refuses costs about
    three parses of it (the factory's search for its bad rows), so a chunk with a bad line quarters
    the budget (down to ``CHECK_MIN_BYTES``) and a good one doubles it (up to ``CHECK_CHUNK_BYTES``):
    where bad lines are dense, chunks stay small."""

    def __init__(self, lines: Iterator[tuple[int, bytes]]) -> None:
        self._lines = lines
        self.budget = CHECK_CHUNK_BYTES

    def __iter__(self) -> Iterator[list[tuple[int, bytes]]]:
        chunk: list[tuple[int, bytes]] = []
        size = 0
        for item in self._lines:
            chunk.append(item)
            size += len(item[1]) + 1
            if size >= self.budget:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def checked(self, bad: bool) -> None:
        """The last chunk held a bad line (or none): the next one's budget."""
        self.budget = (
            max(CHECK_MIN_BYTES, self.budget // 4) if bad else min(CHECK_CHUNK_BYTES, self.budget * 2)
        )


def _checked(
    chunk: list[tuple[int, bytes]], fields: pa.Schema | None
) -> Iterator[tuple[int, bytes, str | None]]:
    """Each line of the chunk with why the factory would refuse it (None: it would not)."""
    if fields is None:
        for n, line in chunk:
            yield n, line, _not_object(line)
        return
    bad = _bad_rows(b"\n".join(line for _, line in chunk), fields, len(chunk))
    for i, (n, line) in enumerate(chunk):
        why = bad.get(i)
        yield n, line, None if why is None else _LINE_N.sub("", " ".join(why.split()), count=1)


def _bad_rows(payload: bytes, fields: pa.Schema, count: int) -> dict[int, str]:
    """The rows of ``payload`` the factory would reject, by index, each with why: its fast parser
    first (the same values or refusal as the rules'), then, when that refuses, the factory's own
    search for the bad rows (``cp_source.factory.bad_rows``)."""
    try:
        parse_arrow_json(payload, fields, count)
    except BucketError:
        return dict(find_bad_rows(payload, fields, count).bad)
    return {}


def _not_object(line: bytes) -> str | None:
    """Why a line is not a JSON object, or None."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        return f"not JSON ({' '.join(str(e).split())})"
    return None if isinstance(doc, dict) else "not a JSON object"
