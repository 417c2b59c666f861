"""The manifests of a result location: names, parsing and checks, and reading what they list.

The protocol that writes them is ``cp_store.batch_log`` (read its docstring first): one manifest
``<path>/_commits/<id>.json`` per published batch, listing its files (``batch=<id>/<name>``), their
rows, its counts and the run that wrote it. Files wait under ``_attempts/<run>/`` until their
batch is published; a file whose move did not happen yet is read there.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from cp_common.printable import first_line
from cp_store import spark_log
from cp_store.json_object import json_object
from cp_store.location import Location, StoreError

COMMITS = "_commits"
MANIFEST_VERSION = 2  # 2 added "run" and "rows"; a version 1 manifest is still read
_READ_VERSIONS = (1, 2)
MAX_MANIFEST_BYTES = 16 << 20  # 16 MiB: ~50,000 files and counts rows; a bigger one is not ours
UNKNOWN_BATCH = "x"  # the batch tag of data written outside a Spark micro-batch
# Files of attempts not yet published, one directory per run: plain readers (Spark, pyarrow, DuckDB
# with a batch=* glob) never list a "_" directory, so they see a file only once it is published.
STAGING = "_attempts"
_STAGED_RE = re.compile(r"^" + STAGING + r"/[A-Za-z0-9-]{1,64}$")
_MANIFEST_RE = re.compile(r"^(\d+)\.json$")
_BATCH_DIR_RE = re.compile(r"^batch=(\d+)$")
_DATA_DIR_RE = re.compile(r"^batch=(\d+|" + UNKNOWN_BATCH + r")$")
_IO_THREADS = 8  # manifests and files read in parallel: an object store answers each in ~10 ms

T = TypeVar("T")
R = TypeVar("R")


class ManifestError(ValueError):
    """A manifest that is not one this protocol wrote: over the size cap, or a field of a bad type."""


@dataclass(frozen=True)
class Manifest:
    """The committed content of one batch: its data files (relative to the location) and counts."""

    batch_id: int
    files: tuple[str, ...]
    counts: tuple[dict[str, Any], ...]
    uri: str  # the manifest's own URI, for messages
    # The rows of each listed file, in the order of ``files`` (None: a version 1 manifest).
    rows: tuple[int, ...] | None = None
    # The run that published it: {"query_id": ..., "checkpoint": ...} (None: unknown, version 1
    # or a whole-batch writer outside a streaming query).
    run: dict[str, Any] | None = None
    # Where the listed files were written before publication (``_attempts/<run>``), relative to
    # the location; None: written in place. A file not yet moved out of it is read there.
    staged: str | None = None
    # The publishing process's TSC reading and domain id just before the manifest's write (the
    # "committed" stamp point of every record of the batch); None: not stamped.
    committed: tuple[int, str] | None = None

    def data(self, root: Location, prefix: str = "") -> list[Location]:
        """The listed files whose name starts with ``prefix``."""
        return [root.join(f) for f in self.files if posixpath.basename(f).startswith(prefix)]

    def counts_table(self, schema: pa.Schema) -> pa.Table:
        """The counts rows as a table of ``schema``; a value of the wrong type is a ManifestError."""
        for i, row in enumerate(self.counts):
            for name, value in row.items():
                if schema.get_field_index(name) < 0:
                    raise ManifestError(f"{self.uri}: field counts[{i}].{name}: not a counts column")
                if not _fits(schema.field(name).type, value):
                    raise ManifestError(
                        f"{self.uri}: field counts[{i}].{name}: expected {schema.field(name).type}, "
                        f"got {_show(value)}"
                    )
            if row.get("batch_id", self.batch_id) != self.batch_id:
                raise ManifestError(
                    f"{self.uri}: field counts[{i}].batch_id: {_show(row['batch_id'])} in the manifest "
                    f"of batch {self.batch_id}"
                )
        rows = [{**row, "batch_id": self.batch_id} for row in self.counts]
        if schema.get_field_index("batch_id") < 0:
            rows = [{k: v for k, v in r.items() if k != "batch_id"} for r in rows]
        return pa.Table.from_pylist(rows, schema=schema)


# ---- names and reading ---------------------------------------------------------------------------------


def batch_dir(root: Location, batch_id: int | str) -> Location:
    """Where the data files of ``batch_id`` are published."""
    return root.join(f"batch={batch_id}")


def manifest_location(root: Location, batch_id: int) -> Location:
    return root.join(COMMITS, f"{batch_id}.json")


# ---- reading ---------------------------------------------------------------------------------------------


def committed(root: Location) -> dict[int, pafs.FileInfo]:
    """The committed batch ids (their manifests' listing entries), in order; one listing, no reads."""
    out = {}
    for info in root.join(COMMITS).children():
        m = _MANIFEST_RE.match(info.base_name)
        if m and info.type == pafs.FileType.File:
            out[int(m.group(1))] = info
    return dict(sorted(out.items()))


def read_manifest(root: Location, batch_id: int, info: pafs.FileInfo | None = None) -> Manifest | None:
    """The manifest of ``batch_id``, None if the batch is not committed."""
    loc = manifest_location(root, batch_id)
    size = info.size if info is not None else None
    if size is not None and size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{loc.uri}: manifest of {size} bytes is over the cap of {MAX_MANIFEST_BYTES}")
    try:
        with loc.fs.open_input_stream(loc.path) as f:
            data = bytes(f.read(MAX_MANIFEST_BYTES + 1))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{loc.uri}: manifest over the cap of {MAX_MANIFEST_BYTES} bytes")
    return parse_manifest(data, batch_id, loc.uri)


def read_manifests(root: Location, ids: Iterable[int] | None = None) -> dict[int, Manifest]:
    """The manifests of every committed batch (or of ``ids`` among them), by batch id."""
    listing = committed(root)
    want = list(listing) if ids is None else [i for i in ids if i in listing]
    manifests = parallel(lambda i: read_manifest(root, i, listing[i]), want, remote=not root.is_local)
    return {i: m for i, m in zip(want, manifests, strict=True) if m is not None}


def is_committed(root: Location, batch_id: int) -> bool:
    return manifest_location(root, batch_id).exists()


def parse_manifest(data: bytes, batch_id: int, uri: str) -> Manifest:
    """Check a manifest's fields; a bad one is a one-line ManifestError naming ``uri`` and the field."""
    doc = json_object(data, uri, ManifestError, lambda value: f"expected a JSON object, got {_show(value)}")
    version = doc.get("v")
    if version not in _READ_VERSIONS or isinstance(version, bool):
        raise ManifestError(f"{uri}: field v: expected one of {_READ_VERSIONS}, got {_show(version)}")
    if doc.get("batch_id") != batch_id or isinstance(doc.get("batch_id"), bool):
        raise ManifestError(f"{uri}: field batch_id: expected {batch_id}, got {_show(doc.get('batch_id'))}")
    files = _manifest_files(doc.get("files"), uri)
    counts = doc.get("counts")
    if not isinstance(counts, list):
        raise ManifestError(f"{uri}: field counts: expected a list of rows, got {_show(counts)}")
    for i, row in enumerate(counts):
        if not isinstance(row, dict):
            raise ManifestError(f"{uri}: field counts[{i}]: expected an object, got {_show(row)}")
    if version == 1:
        return Manifest(batch_id, tuple(files), tuple(counts), uri)
    rows = _manifest_rows(doc.get("rows"), len(files), uri)
    staged = doc.get("staged")
    if staged is not None and not (isinstance(staged, str) and _STAGED_RE.match(staged)):
        raise ManifestError(f"{uri}: field staged: expected {STAGING}/<run>, got {_show(staged)}")
    run = _manifest_run(doc.get("run"), uri)
    committed = _manifest_stamp(doc.get("committed"), uri)
    return Manifest(batch_id, tuple(files), tuple(counts), uri, rows, run, staged, committed)


def _manifest_stamp(stamp: Any, uri: str) -> tuple[int, str] | None:
    if stamp is None:
        return None
    tsc = stamp.get("tsc") if isinstance(stamp, dict) else None
    node = stamp.get("node") if isinstance(stamp, dict) else None
    if not isinstance(tsc, int) or isinstance(tsc, bool) or tsc < 0 or not isinstance(node, str) or not node:
        raise ManifestError(
            f"{uri}: field committed: expected {{tsc: a TSC reading, node: a domain id}}, got {_show(stamp)}"
        )
    return tsc, node


def _manifest_files(files: Any, uri: str) -> list[str]:
    if not isinstance(files, list):
        raise ManifestError(f"{uri}: field files: expected a list of paths, got {_show(files)}")
    seen: set[str] = set()
    for i, f in enumerate(files):
        problem = _bad_data_path(f)
        if problem:
            raise ManifestError(f"{uri}: field files[{i}]: {problem}")
        if f in seen:  # read twice, its rows would count twice
            raise ManifestError(f"{uri}: field files[{i}]: {_show(f)} is listed twice")
        seen.add(f)
    return files


def _manifest_rows(rows: Any, n_files: int, uri: str) -> tuple[int, ...]:
    if not isinstance(rows, list) or len(rows) != n_files:
        raise ManifestError(f"{uri}: field rows: expected a list of {n_files} row counts, got {_show(rows)}")
    for i, n in enumerate(rows):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ManifestError(f"{uri}: field rows[{i}]: expected a row count, got {_show(n)}")
    return tuple(rows)


def _manifest_run(run: Any, uri: str) -> dict[str, Any] | None:
    if run is None:
        return None
    if not isinstance(run, dict) or not all(isinstance(v, str | None) for v in run.values()):
        raise ManifestError(f"{uri}: field run: expected an object of strings, got {_show(run)}")
    return run


def read_data(manifest: Manifest, loc: Location, read: Callable[[Location], T]) -> T:
    """``read(loc)`` of a listed file, or of its staged copy if the commit that published it stopped
    before moving it (see ``finish``); a listed file that is in neither place is one line naming it."""
    twin = _staged_twin(manifest, loc)
    for where in (loc, twin):
        if where is None:
            continue
        try:
            return read(where)
        except FileNotFoundError:
            continue
        except OSError as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"{where.uri}: {first_line(e)}") from None
    raise StoreError(f"{loc.uri}: listed by {manifest.uri} but missing")


def _staged_twin(manifest: Manifest, loc: Location) -> Location | None:
    """Where the listed file ``loc`` (``<root>/batch=<id>/<name>``) was written before publication."""
    if not manifest.staged:
        return None
    root_path, batch, name = loc.path.rsplit("/", 2)
    root_uri = loc.uri.rsplit("/", 2)[0]
    tail = f"{manifest.staged}/{batch}/{name}"
    return replace(loc, path=f"{root_path}/{tail}", uri=f"{root_uri}/{tail}")


def current_files(root: Location, manifests: Iterable[Manifest]) -> list[Location]:
    """Where the files the ``manifests`` list are now: moved to ``batch=<id>/``, or still staged if
    their commit stopped before the moves (a batch without its Spark log entry, checked file by
    file). One listing of ``_spark_metadata/`` for every batch whose moves finished."""
    logged = {i.base_name.split(".")[0] for i in root.join(spark_log.SPARK_LOG).children()}
    out = []
    for m in manifests:
        for f in m.files:
            loc = root.join(f)
            twin = _staged_twin(m, loc)
            if twin is not None and str(m.batch_id) not in logged and not loc.exists() and twin.exists():
                loc = twin
            out.append(loc)
    return out


def parallel(fn: Callable[[T], R], items: Sequence[T], remote: bool) -> list[R]:
    """``fn`` over ``items`` in order; in threads on a remote store (each call waits on the network)."""
    if not remote or len(items) < 2:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(min(_IO_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


def batch_gaps(ids: Iterable[int]) -> list[tuple[int, int]]:
    """The batch ids missing from committed ``ids``, as (first, last) ranges: the ids before the
    first and between two (one query's ids run 0, 1, 2, ... with no gap)."""
    out, expected = [], 0
    for i in sorted(ids):
        if i > expected:
            out.append((expected, i - 1))
        expected = i + 1
    return out


def show_gaps(gaps: Sequence[tuple[int, int]]) -> str:
    """``0-7,10``: gaps as ranges."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in gaps)


def gaps_note(where: str, gaps: Sequence[tuple[int, int]]) -> str:
    """One line saying which batch ids a sink path lacks (``where``: its printable URI)."""
    n = sum(b - a + 1 for a, b in gaps)
    return (
        f"{where}: committed batch ids skip {show_gaps(gaps)} ({n:,} batch{'es' if n > 1 else ''} "
        "without a manifest: removed, or the store emptied under the query); their rows are in no result"
    )


# ---- checks ----------------------------------------------------------------------------------------------


def _bad_data_path(f: Any) -> str | None:
    """Why ``f`` is not a data file path of this layout (``batch=<id>/<name>``), or None."""
    if not isinstance(f, str):
        return f"expected a path, got {_show(f)}"
    parts = f.split("/")
    if len(parts) != 2 or not _DATA_DIR_RE.match(parts[0]):
        return f"{_show(f)} is not batch=<id>/<name>"
    if not parts[1] or parts[1] in (".", "..") or "\\" in parts[1] or parts[1].startswith("."):
        return f"{_show(f)} has a bad file name"
    return None


def _fits(t: pa.DataType, value: Any) -> bool:
    if value is None:
        return True
    if pa.types.is_integer(t):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(t):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return isinstance(value, str)
    if pa.types.is_boolean(t):
        return isinstance(value, bool)
    return False


def _show(value: Any) -> str:
    """A value for a message: its repr, cut short (a manifest's content is not ours to print at length)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
