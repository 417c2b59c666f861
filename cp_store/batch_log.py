"""Exactly-once publication of micro-batches on any store, without rename: files first, manifest last.

Object stores have no atomic rename, so a batch is not published by moving a directory into place.
Under a result location (any :class:`cp_store.location.Location`)::

    <path>/_attempts/<run>/batch=<id>/<prefix>p<partition>-a<attempt>-<random>.parquet   written by tasks
    <path>/batch=<id>/<prefix>p<partition>-a<attempt>-<random>.parquet   published: moved here
    <path>/_commits/<id>.json                                           the manifest of batch <id>
    <path>/_spark_metadata/<id>                                         Spark's file-sink log (spark_log)

* **Writers** (Spark tasks) write their data files under ``_attempts/<run>/batch=<id>/`` (``<run>``:
  the query's id, see ``staging``), each under a name no other attempt can take (partition, task
  attempt and a random part). Plain readers (Spark, pyarrow, DuckDB on ``batch=*``) never list a
  ``_`` directory, and a file no manifest lists is invisible to this package's readers.
* **The commit** (the driver, once per batch id) writes one manifest, ``_commits/<id>.json``, with
  one all-or-nothing write (a temporary file and a rename locally, one upload on an object store):
  ``{"v": 2, "batch_id": <id>, "run": {...}, "staged": "_attempts/<run>", "files": [paths relative
  to <path>, as batch=<id>/<name>], "rows": [rows per file], "counts": [rows]}``. Writing it is the
  publication. Then ``finish`` moves the files to ``batch=<id>/`` and writes Spark's log entry; a
  commit stopped in between is finished by the next one. A batch id whose manifest already
  exists (a query restarted from its checkpoint replays the last batch it had not logged)
  publishes nothing: the replay's own files are deleted and the first publication is kept whole.
* **Runs**: a manifest names the run (query id, checkpoint) that wrote it. A run refuses, in one
  line naming the other (``RunClash``), a location whose latest manifest (at its first commit) or
  previous batch (at every commit) another run published: one query writes one location.
* **Readers** list ``_commits/`` and read exactly the files the manifests list, where they were
  moved or, if the move has not happened, where they were staged. A listed file in neither place
  is an error naming it; nothing is guessed from a directory listing.
* **Sweeping**: files of failed, crashed or speculative attempts are never listed. ``abort`` and
  every commit delete the files of their batch's staging directory (and the one before it, where a
  late speculative attempt may still have written) that its manifest does not list; the first
  commit a process makes on a location also sweeps every earlier batch directory of its run. A run
  sweeps only its own staging directory, and a listed file is never deleted.
* **Durability** (``durable``, local filesystems): the tasks fsync their files; the commit fsyncs
  the directories that name them and ``<path>`` before the manifest, writes the manifest through
  an fsynced temporary file, fsyncs ``_commits/`` after its rename, and the directories the files
  moved to before Spark's log entry (``<path>``'s parent once per process: ``<path>`` may be new).
  On an object store a completed upload is already durable.

The manifest carries the batch's counts, so the commit point is a single object and
``read_counts`` needs no other file.
"""

from __future__ import annotations

import os
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs

from cp_common.printable import first_line
from cp_store import manifests, spark_log
from cp_store.atomic_files import fsync_path
from cp_store.location import Location, StoreError, resolve

# The manifests' side (names, parsing, reading), re-exported: callers use this module alone.
from cp_store.manifests import (
    _BATCH_DIR_RE,
    _STAGED_RE,
    COMMITS,
    MANIFEST_VERSION,
    STAGING,
    UNKNOWN_BATCH,
    Manifest,
    ManifestError,
    _bad_data_path,
    batch_dir,
    committed,
    current_files,
    is_committed,
    manifest_location,
    parallel,
    parse_manifest,
    read_data,
    read_manifest,
    read_manifests,
)
from cp_store.tables import write_parquet  # the one Parquet writer, re-exported for the sink

__all__ = [
    "COMMITS",
    "MANIFEST_VERSION",
    "STAGING",
    "UNKNOWN_BATCH",
    "Manifest",
    "ManifestError",
    "RunClash",
    "abort",
    "batch_dir",
    "commit",
    "committed",
    "current_files",
    "data_file",
    "describe_run",
    "finish",
    "is_committed",
    "manifest_location",
    "parallel",
    "parquet_rows",
    "parse_manifest",
    "publish",
    "read_data",
    "read_manifest",
    "read_manifests",
    "staging",
    "sweep",
    "sweep_history",
    "write_parquet",
]

_RUN_TAG_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")

# Per process: locations whose earlier batches were swept, and whose parent was fsynced.
_SWEPT: set[str] = set()  # keyed by Location.identity: the printable URI may name two places
_ROOT_SYNCED: set[str] = set()


class RunClash(StoreError):
    """Another run (another query, or this query on a new checkpoint) published on this location."""


# ---- names -----------------------------------------------------------------------------------------------


def data_file(prefix: str, partition: int, attempt: int) -> str:
    """A data file name no other task attempt can take."""
    return f"{prefix}p{partition}-a{attempt}-{uuid.uuid4().hex[:12]}.parquet"


# ---- writing ---------------------------------------------------------------------------------------------


def staging(run: Mapping[str, str | None] | None) -> str:
    """Where the tasks of ``run`` write their files until their batch is published (relative to the
    location): ``_attempts/<query id>``, one directory per run, so a run sweeps only its own."""
    query_id = (run or {}).get("query_id") or ""
    return f"{STAGING}/{query_id if _RUN_TAG_RE.match(query_id) else UNKNOWN_BATCH}"


def area(root: Location, staged: str | None) -> Location:
    """Where files are written before publication: ``root/<staged>``, or ``root`` itself."""
    return root.join(staged) if staged else root


def prepare(loc: Location) -> None:
    """Make the directory ``loc`` goes in where directories exist (an object store has none)."""
    if loc.is_local:
        os.makedirs(posixpath.dirname(loc.path), exist_ok=True)


def sync_file(loc: Location) -> None:
    """fsync a local file by name (a no-op on an object store: an upload is durable once complete)."""
    if loc.is_local:
        fsync_path(loc.path)  # opens read-only and fsyncs: the same for a file


def commit(
    root: Location,
    batch_id: int,
    files: Sequence[str],
    counts: Sequence[Mapping[str, Any]],
    durable: bool = False,
    rows: Sequence[int] | None = None,
    run: Mapping[str, str | None] | None = None,
    staged: str | None = None,
    stamp: Callable[[], tuple[int, str]] | None = None,
) -> bool:
    """Publish ``files`` and ``counts`` as batch ``batch_id``, once.

    ``files``: names relative to ``root`` (``batch=<id>/<name>``), written under ``root/<staged>``
    (see ``staging``) or, with ``staged`` None, in place. ``rows``: each file's row count (None: read
    from the Parquet footers). ``run``: who publishes (``query_id``, ``checkpoint``); with a run, a
    location another run published on is refused (``RunClash``, one line naming the other run).
    ``stamp()``: a (TSC, domain id) reading, taken just before the manifest's write and kept in it.
    True if this call published; False if the batch id was committed before by this run (a replay):
    then the ``files`` it brought are deleted and the first publication stays as it was.
    """
    _check_files(batch_id, files, staged)
    existing = read_manifest(root, batch_id)
    if existing is not None:
        _refuse_other_run(root, existing, run, files, staged)
        listed = set(existing.files)
        _delete(area(root, staged), [f for f in files if f not in listed])
        finish(root, existing, durable)
        _sweep_after_commit(root, existing)
        return False
    first = area(root, staged).identity not in _SWEPT
    if run is not None:
        _check_owner(root, batch_id, run, files, staged, first)
    if rows is None:
        found = area(root, staged)
        rows = parallel(lambda f: parquet_rows(found.join(f)), list(files), remote=not root.is_local)
    manifest = _write_manifest(root, batch_id, files, counts, rows, run, staged, durable, stamp)
    if first and run is not None:
        _refuse_other_run(root, read_manifest(root, batch_id), run, files, staged)  # two first commits raced
    finish(root, manifest, durable)
    _sweep_after_commit(root, manifest)
    return True


def _check_files(batch_id: int, files: Sequence[str], staged: str | None) -> None:
    for i, f in enumerate(files):
        problem = _bad_data_path(f)
        if problem:
            raise ValueError(f"batch {batch_id}: file {i}: {problem}")
    if len(set(files)) != len(files):
        raise ValueError(f"batch {batch_id}: a file is listed twice")
    if staged is not None and not _STAGED_RE.match(staged):
        raise ValueError(f"batch {batch_id}: staged={staged!r}: expected {STAGING}/<run>")


def _write_manifest(
    root: Location,
    batch_id: int,
    files: Sequence[str],
    counts: Sequence[Mapping[str, Any]],
    rows: Sequence[int],
    run: Mapping[str, str | None] | None,
    staged: str | None,
    durable: bool,
    stamp: Callable[[], tuple[int, str]] | None = None,
) -> Manifest:
    if len(rows) != len(files):
        raise ValueError(f"batch {batch_id}: {len(rows)} row counts for {len(files)} files")
    doc = {
        "v": MANIFEST_VERSION,
        "batch_id": batch_id,
        "run": dict(run) if run is not None else None,
        "staged": staged,
        "files": list(files),
        "rows": [int(n) for n in rows],
        "counts": list(counts),
    }
    body = orjson.dumps(doc)
    cap = manifests.MAX_MANIFEST_BYTES
    if len(body) > cap:
        raise ManifestError(f"batch {batch_id}: manifest of {len(body)} bytes is over the cap of {cap}")
    if durable and root.is_local:
        root.join(COMMITS).make_dirs()
        _sync_names(area(root, staged), files)
        if staged:
            _sync_names(root, [])  # the names _commits and _attempts
    if stamp is not None:  # read last, as close to the publication as it can be
        tsc, node = stamp()
        body = orjson.dumps({**doc, "committed": {"tsc": tsc, "node": node}})
    loc = manifest_location(root, batch_id)
    loc.write_bytes(body, durable=durable and root.is_local)
    return parse_manifest(body, batch_id, loc.uri)


def finish(root: Location, manifest: Manifest, durable: bool = False) -> None:
    """Put a published batch where plain readers look: its files moved out of the staging
    directory (a rename locally, copy and delete on an object store) and Spark's file-sink log
    entry written. Idempotent: a commit stopped half-way is finished by the next one."""
    if manifest.staged:
        staged = manifest.staged
        parallel(lambda f: _move_in(root, staged, f), list(manifest.files), remote=not root.is_local)
        if durable and root.is_local:
            _sync_names(root, manifest.files)
    spark_log.write_batch(
        root,
        manifest.batch_id,
        _log_lines(root, manifest),
        lambda i: _log_lines(root, read_manifest(root, i)),
        durable=durable and root.is_local,
    )


def _move_in(root: Location, staged: str, rel: str) -> None:
    src, dst = root.join(staged, rel), root.join(rel)
    prepare(dst)
    try:
        root.fs.move(src.path, dst.path)
    except OSError as e:
        try:
            was, now = root.fs.get_file_info([src.path, dst.path])
        except OSError:
            was = now = None
        moved = was is not None and was.type == pafs.FileType.NotFound
        if moved and now is not None and now.type == pafs.FileType.File:
            return  # moved before: a commit finished again
        raise StoreError(f"{src.uri}: {first_line(e)}") from None


def _log_lines(root: Location, manifest: Manifest | None) -> list[bytes]:
    """Spark's log lines for the files of ``manifest`` (none for a batch not committed)."""
    if manifest is None or not manifest.files:
        return []
    locs = [root.join(f) for f in manifest.files]
    try:
        infos = root.fs.get_file_info([loc.path for loc in locs])
    except OSError as e:
        raise StoreError(f"{root.uri}: {first_line(e)}") from None
    for loc, info in zip(locs, infos, strict=True):
        if info.type != pafs.FileType.File:
            raise StoreError(f"{loc.uri}: listed by {manifest.uri} but missing")
    return spark_log.entries(root, manifest.files, infos)


def _same_run(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    return bool(a and b and a.get("query_id") and a.get("query_id") == b.get("query_id"))


def describe_run(run: Mapping[str, Any] | None) -> str:
    """A run for a message: its query id and checkpoint, as far as they are known."""
    if not run or not run.get("query_id"):
        return "a run that did not record its query id"
    where = f", checkpoint {run['checkpoint']}" if run.get("checkpoint") else ""
    return f"query id {run['query_id']}{where}"


def _refuse_other_run(
    root: Location,
    other: Manifest | None,
    run: Mapping[str, str | None] | None,
    files: Sequence[str],
    staged: str | None,
) -> None:
    """A batch published by another run: this run's files are deleted and it stops, in one line."""
    if other is None or run is None or _same_run(other.run, run):
        return
    listed = set(other.files) if other.staged == staged else set()
    _delete(area(root, staged), [f for f in files if f not in listed])
    raise RunClash(
        f"{root.uri}: batch {other.batch_id} was published by {describe_run(other.run)}; this query is "
        f"{describe_run(run)}: one query writes one path. Give this run a path of its own (for example "
        f"{root.uri}-2), or move the earlier records away first"
    )


def _check_owner(
    root: Location,
    batch_id: int,
    run: Mapping[str, str | None],
    files: Sequence[str],
    staged: str | None,
    first: bool,
) -> None:
    """Refuse a location another run published on: at a run's first commit in this process, the
    latest manifest; at every commit, the manifest of the batch before (a writer that started since)."""
    if first:
        listing = committed(root)
        latest = max(listing) if listing else None
        if latest is not None:
            _refuse_other_run(root, read_manifest(root, latest, listing[latest]), run, files, staged)
    if batch_id > 0:
        _refuse_other_run(root, read_manifest(root, batch_id - 1), run, files, staged)


def parquet_rows(loc: Location) -> int:
    """The row count of a Parquet file, from its footer."""
    import pyarrow.parquet as pq

    try:
        with loc.fs.open_input_file(loc.path) as f:
            return int(pq.ParquetFile(f).metadata.num_rows)
    except FileNotFoundError:
        raise StoreError(f"{loc.uri}: not found") from None
    except OSError as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None


def abort(root: Location, batch_id: int, files: Sequence[str], staged: str | None = None) -> None:
    """Delete what the tasks of a failed batch wrote (never a file a manifest lists)."""
    existing = read_manifest(root, batch_id)
    listed = set(existing.files) if existing else set()
    _delete(area(root, staged), [f for f in files if _bad_data_path(f) is None and f not in listed])
    sweep(root, batch_id, existing, staged)


def publish(
    root: Location | str | os.PathLike[str],
    batch_id: int,
    tables: Mapping[str, pa.Table],
    counts: Sequence[Mapping[str, Any]] = (),
    durable: bool = False,
    write: Callable[[pa.Table, Location, bool], None] | None = None,
) -> bool:
    """Write ``tables`` as ``batch=<batch_id>/<name>`` and commit them with ``counts``, once.

    For a writer that holds a whole batch in one process (``record_windows``, tools, tests).
    ``write(table, location, durable)`` writes one file (default: Parquet, zstd). Returns False,
    writing nothing, if the batch id is already committed.
    """
    loc = resolve(root)
    if is_committed(loc, batch_id):
        return False
    staged = staging(None)
    files, rows = [], []
    for name, table in tables.items():
        if "/" in name or not name or name.startswith(("_", ".")):
            raise ValueError(f"publish: file name {name!r}: expected a plain name (no '/', not hidden)")
        rel = f"batch={batch_id}/{name}"
        (write or write_parquet)(table, loc.join(staged, rel), durable)
        files.append(rel)
        rows.append(table.num_rows)
    return commit(loc, batch_id, files, counts, durable, rows=rows, staged=staged)


# ---- sweeping --------------------------------------------------------------------------------------------


def sweep(
    root: Location, batch_id: int, manifest: Manifest | None | bool = True, staged: str | None = None
) -> list[str]:
    """Delete the files under ``<staged>/batch=<batch_id>/`` (or ``batch=<batch_id>/``) its manifest
    does not list; the paths deleted (relative to that directory's parent).

    ``manifest``: the batch's manifest if the caller read it (None: not committed); True: read it.
    """
    where = area(root, staged)
    infos = [i for i in batch_dir(where, batch_id).children() if i.type == pafs.FileType.File]
    if not infos:
        return []
    if manifest is True:
        manifest = read_manifest(root, batch_id)
    listed = set(manifest.files) if isinstance(manifest, Manifest) else set()
    stray = [f"batch={batch_id}/{i.base_name}" for i in infos]
    stray = [f for f in stray if f not in listed]
    _delete(where, stray)
    return stray


def sweep_history(root: Location, upto: int, staged: str | None = None) -> list[str]:
    """Sweep every ``batch=<id>/`` directory with ``id <= upto`` (under ``staged`` if given); the
    paths deleted. A published batch whose files are still staged (its commit stopped before the
    moves) is finished instead. One recursive listing finds the directories that hold files; only
    their manifests are read."""
    where = area(root, staged)
    try:
        infos = where.fs.get_file_info(pafs.FileSelector(where.path, recursive=True, allow_not_found=True))
    except OSError as e:
        raise StoreError(f"{where.uri}: {first_line(e)}") from None
    present: dict[int, set[str]] = {}
    base = where.path.rstrip("/") + "/"
    for info in infos:
        parts = info.path[len(base) :].split("/") if info.path.startswith(base) else []
        dir_id = _BATCH_DIR_RE.match(parts[0]) if len(parts) == 2 else None
        if dir_id and info.type == pafs.FileType.File and int(dir_id.group(1)) <= upto:
            present.setdefault(int(dir_id.group(1)), set()).add("/".join(parts))
    _remove_stale_temporaries(root)
    ids = sorted(present)
    manifests = parallel(lambda i: read_manifest(root, i), ids, remote=not root.is_local)
    stray = []
    for i, manifest in zip(ids, manifests, strict=True):
        listed = set(manifest.files) if manifest is not None else set()
        if staged and manifest is not None and manifest.staged == staged and present[i] & listed:
            finish(root, manifest)
        stray += sorted(present[i] - listed)
    _delete(where, stray)
    return stray


def _remove_stale_temporaries(root: Location) -> None:
    # A local manifest write cut short by a crash leaves "<id>.json.tmp-<random>" (never read).
    if root.is_local:
        for info in root.join(COMMITS).children():
            if ".json.tmp-" in info.base_name:
                root.join(COMMITS, info.base_name).delete()


def _sweep_after_commit(root: Location, manifest: Manifest) -> None:
    # This batch's failed attempts, and a late speculative attempt of the batch before; once per
    # process and staging directory, everything older too (what a crash of an earlier driver left).
    key = area(root, manifest.staged).identity
    if key in _SWEPT:
        sweep(root, manifest.batch_id, manifest, manifest.staged)
        if manifest.batch_id > 0:
            sweep(root, manifest.batch_id - 1, True, manifest.staged)
        return
    sweep_history(root, manifest.batch_id, manifest.staged)
    if manifest.staged:  # files an earlier version wrote in place, never listed
        sweep_history(root, manifest.batch_id)
    _SWEPT.add(key)


def _delete(where: Location, files: Iterable[str]) -> None:
    for f in files:
        where.join(f).delete()


def _sync_names(where: Location, files: Sequence[str]) -> None:
    """Strict, locally: the names of ``files`` (fsynced by their writers), of their batch
    directories and of ``_commits/`` are on disk before what comes next (the manifest, or the
    Spark log entry after a move)."""
    for d in sorted({posixpath.dirname(f) for f in files}):
        fsync_path(where.join(d).path)
    fsync_path(where.path)
    if where.path not in _ROOT_SYNCED:  # it may be new: its name lives in its parent
        fsync_path(posixpath.dirname(where.path.rstrip("/")) or "/")
        _ROOT_SYNCED.add(where.path)
