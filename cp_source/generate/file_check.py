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

A schema field that no checked line has would be null in every row: it is an error naming the
field and the closest key the lines do have (``did you mean 'carrier'?``, a typo in the schema),
nothing sent. A field only some lines lack is counted (``FileLines.missing``, ``missing_fields`` of
the summary's ``line_check``): those rows get a null there.

Without a schema each line must only be a JSON object before the generator connects; the sender
then asks the factory for its schema in its hello, and checks every line against the one announced
before its schedule starts (:func:`check_against_factory`); a factory that announces none (an older
one) leaves the lines checked as JSON objects only, and the summary's ``line_check`` says so.

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

import difflib
import io
import re
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import BinaryIO, TypedDict

import orjson
import pyarrow as pa

from cp_source.factory.bad_rows import find_bad_rows
from cp_source.factory.parse_json import parse_arrow_json
from cp_source.wire.bucket import BucketError
from cp_source.wire.workload_id import WorkloadMismatch
from cp_source.wire.workloads import parse_ddl
from cp_store.location import StoreError, one_file

FILE_MAX_BYTES = 64 << 20
CHECK_MIN_BYTES = 2 << 10
CHECK_CHUNK_BYTES = 64 << 10  # lines parsed together: a failing chunk costs about 3 parses of it
_BLANK = b" \t\r"  # what the factory's parser strips to tell a blank line
SKIP_HINT = "--skip-bad-lines sends only the good lines"
_LINE_N = re.compile(r"^line \d+\b[,:]?\s*")  # a refusal names the line within the chunk
MAX_KEYS = 10_000  # distinct keys kept to name the closest one to a field no line has
BY_SCHEMA, BY_FACTORY = "schema", "factory"  # what the lines were checked against


class BadFileLine(ValueError):
    """A line of a replayed file that the factory would refuse: the message names the file, the line
    number, the field and why."""


class LineCheck(TypedDict):
    """What a replayed file's lines were checked against before the first bucket (JSON: the
    summary's ``line_check``). ``lines``: the non-blank lines checked; ``sent``: those kept (replayed);
    ``skipped``: bad ones left out (``skip_bad_lines``); ``against``: ``schema`` (the one given),
    ``factory`` (the one the factory announced in its answer to the hello) or null (each line only
    a JSON object: no schema given, none announced); ``fields``: the schema's fields (0: none);
    ``missing_fields``: each field some kept lines lack (null in their rows), with how many lack it;
    ``text``: all of it in one line (what ``cloudprofiler generate`` prints)."""

    lines: int
    sent: int
    skipped: int
    against: str | None
    fields: int
    missing_fields: dict[str, int]
    text: str


@dataclass(frozen=True)
class FileLines:
    """A replayed file's kept lines (stripped, in file order) and their 1-based line numbers in the
    file; ``skipped``: bad lines left out (``skip_bad_lines``), ``first_skipped``: why the first was;
    ``against``: what they were checked against (``BY_SCHEMA``, ``BY_FACTORY``, None: JSON objects
    only), ``fields``: that schema's fields, ``missing``: the fields some kept lines lack, and how
    many lack each; ``unannounced``: why the factory's schema could not be checked (its answer)."""

    path: str
    lines: list[bytes]
    numbers: array[int] = field(default_factory=lambda: array("q"))
    skipped: int = 0
    first_skipped: str = ""
    against: str | None = None
    fields: int = 0
    missing: dict[str, int] = field(default_factory=dict)
    unannounced: str = ""

    @property
    def nbytes(self) -> int:
        """The kept lines' bytes, each with its newline: one pass over the file as payload."""
        return sum(map(len, self.lines)) + len(self.lines)

    def report(self) -> LineCheck:
        """The check as the summary's ``line_check``."""
        return {
            "lines": len(self.lines) + self.skipped,
            "sent": len(self.lines),
            "skipped": self.skipped,
            "against": self.against,
            "fields": self.fields,
            "missing_fields": dict(self.missing),
            "text": self.describe(),
        }

    def describe(self) -> str:
        """One line: how many lines were checked, against what, and what it found."""
        n = len(self.lines) + self.skipped
        if self.against is None:
            why = self.unannounced or "no schema given"
            return f"checked {n:,} lines of {self.path} only as JSON objects ({why}): values not checked"
        what = "--schema" if self.against == BY_SCHEMA else "the factory's schema"
        found = f"{len(self.lines):,} sent, {self.skipped:,} skipped" if self.skipped else "every line parses"
        if self.missing:
            lack = ", ".join(
                f"{k} from {v:,} lines" for k, v in sorted(self.missing.items(), key=lambda kv: -kv[1])
            )
            found += f"; fields missing from some lines (null there): {lack}"
        return f"checked {n:,} lines of {self.path} against {what} ({self.fields} fields): {found}"


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
    """Every non-blank line of ``path`` (a path or a URI, read through ``cp_store.location``) checked
    against ``fields`` (None: only a JSON object each)."""
    loc = one_file(path, "NDJSON file")
    shown = path if loc.is_local else loc.uri  # a URI is named without its credentials
    size = loc.info().size
    if size > max_bytes:
        raise ValueError(
            f"{shown} is {size:,} bytes, over the generator's cap of {max_bytes:,} bytes on a replayed "
            "file: replay a sample of it (e.g. the first lines: head -n N)"
        )
    try:
        data = loc.read_bytes()  # at most max_bytes; the kept lines are held anyway
    except StoreError as e:
        raise ValueError(str(e)) from None
    return _check_lines(
        shown, _numbered(io.BytesIO(data), shown, max_bytes), fields, skip_bad_lines, BY_SCHEMA
    )


def check_against_factory(
    lines: FileLines, workload: str | None, schema: str | None, skip_bad_lines: bool = False
) -> FileLines:
    """``lines`` (checked as JSON objects only) checked again, against the schema the factory announced
    in its answer to the hello: ``workload``, its workload's name, ``schema`` its fields as Spark DDL
    (None, None: it announced nothing, an older factory). Lines already checked against a schema are
    returned as they are. A factory whose payloads are not NDJSON lines (a Parquet file's) is a
    ``WorkloadMismatch``; a bad line a ``BadFileLine`` naming it, as with ``--schema``."""
    if lines.against is not None:
        return lines
    if schema is None:
        if workload is None:
            return replace(lines, unannounced="the factory announced no schema: give --schema")
        if workload == "parquet":
            raise WorkloadMismatch(
                f"the factory takes workload {workload} (Arrow IPC buckets of a Parquet file), but this "
                f"generator sends the NDJSON lines of {lines.path}: start the factory with --workload file: "
                "and the lines' --schema"
            )
        return replace(
            lines, unannounced=f"the factory's {workload} schema is too long to announce: give --schema"
        )
    fields = parse_ddl(schema)
    checked = _check_lines(
        lines.path, zip(lines.numbers, lines.lines, strict=True), fields, skip_bad_lines, BY_FACTORY
    )
    return replace(
        checked,
        skipped=checked.skipped + lines.skipped,
        first_skipped=lines.first_skipped or checked.first_skipped,
    )


def _check_lines(
    path: str,
    numbered: Iterable[tuple[int, bytes]],
    fields: pa.Schema | None,
    skip_bad_lines: bool,
    against: str,
) -> FileLines:
    """The numbered lines checked against ``fields`` (None: only a JSON object each), chunk by chunk."""
    kept: list[bytes] = []
    numbers = array("q")
    skipped, first = 0, ""
    presence = _Presence(fields.names if fields is not None else [])
    chunks = _Chunks(iter(numbered))
    for chunk in chunks:
        before = len(kept)
        for n, line, why in _checked(chunk, fields):
            if why is None:
                kept.append(line)
                numbers.append(n)
                continue
            if not skip_bad_lines:
                raise BadFileLine(f"{path} line {n}: {why}; nothing was sent ({SKIP_HINT})")
            skipped += 1
            first = first or f"line {n}: {why}"
        presence.add(kept[before:])
        chunks.checked(len(kept) - before < len(chunk))
    if not kept:
        what = f"all {skipped:,} lines are bad (the first, {first})" if skipped else "no JSON lines"
        raise BadFileLine(f"{path}: {what}; nothing was sent")
    if fields is None:
        return FileLines(path, kept, numbers, skipped, first)
    missing = presence.missing_from_some(
        path, len(kept), skipped, "--schema" if against == BY_SCHEMA else "the factory's schema"
    )
    return FileLines(path, kept, numbers, skipped, first, against, len(fields), missing)


class _Presence:
    """How many kept lines lack each schema field (its value in their rows is null), and the keys
    those lines do have: a field no line has is in every line that lacks one, so the keys of those
    lines alone name the closest one."""

    def __init__(self, names: list[str]) -> None:
        self.names = frozenset(names)
        self.lacking: Counter[str] = Counter()
        self.keys: set[str] = set()

    def add(self, lines: list[bytes]) -> None:
        if not self.names:
            return
        for line in lines:
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:  # the factory's parser took it: it is an object (see the rules)
                continue
            lacks = self.names.difference(doc)
            if lacks:
                self.lacking.update(lacks)
                if len(self.keys) < MAX_KEYS:
                    self.keys.update(doc)

    def missing_from_some(self, path: str, kept: int, skipped: int, schema: str) -> dict[str, int]:
        """The fields some kept lines lack, with how many; ``BadFileLine`` naming the fields every
        line lacks (each would be a column of nulls), each with the closest key the lines have."""
        never = [n for n in sorted(self.names) if self.lacking[n] >= kept]
        if never:
            named = ", ".join(f"{n!r}{_closest(n, self.keys)}" for n in never)
            raise BadFileLine(
                f"{path}: no line has the field{'s' if len(never) > 1 else ''} {named} of {schema} (all "
                f"{kept:,} lines checked{f', besides {skipped:,} bad ones skipped' if skipped else ''}): "
                "it would be null in every row; nothing was sent"
            )
        return {n: c for n, c in sorted(self.lacking.items()) if c}


def _closest(name: str, keys: set[str]) -> str:
    """`` (did you mean 'carrier'?)`` naming the key of the lines closest to ``name``, or nothing."""
    same = [k for k in keys if k.lower() == name.lower()]
    close = same or difflib.get_close_matches(name, sorted(keys), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
