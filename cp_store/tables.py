"""Parquet files and other finished outputs on a :class:`~cp_store.location.Location`.

The helpers every reader and writer of results shares, so a translation, a sync table, an ingest
log file, a report or a plot is written and found the same way on a local disk and an object store:

* a finished output appears whole or not at all: locally through a temporary file in the same
  directory and a rename; on an object store as one upload of the whole file, serialized in memory
  first (an upload cut short by an error inside an open stream would still be published);
* a listing skips names starting with ``_`` or ``.`` (staging, temporary and bookkeeping files);
* a missing input says whether the path or the bucket is missing.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cp_common.printable import first_line
from cp_store.atomic_files import fsync_path, replacing
from cp_store.location import Location, StoreError, check_writable, resolve

HIDDEN = ("_", ".")


def parent(loc: Location) -> Location:
    """The directory that holds ``loc``."""
    path = posixpath.dirname(loc.path.rstrip("/")) or loc.path
    split = urlsplit(loc.uri)
    if not split.scheme or len(split.scheme) == 1:
        return replace(loc, path=path, uri=path if loc.is_local else posixpath.dirname(loc.uri.rstrip("/")))
    uri_path = posixpath.dirname(split.path.rstrip("/")) or split.path
    return replace(loc, path=path, uri=urlunsplit((split.scheme, split.netloc, uri_path, split.query, "")))


def resolve_option(name: str, where: str | os.PathLike[str] | Location) -> Location:
    """``resolve`` whose one-line error starts with the option that gave the path (``--out s3://...``)."""
    try:
        return resolve(where)
    except StoreError as e:
        raise StoreError(f"{name} {e}") from None


def output_file(name: str, where: str | os.PathLike[str] | Location) -> Location:
    """The location of an output file, checked before any work: a known scheme, a reachable store and
    bucket, the directory that holds it created where directories exist."""
    loc = resolve_option(name, where)
    directory = parent(loc)
    try:
        check_writable(directory)
    except StoreError as e:
        why = str(e).removeprefix(f"{directory.uri}: ")
        raise StoreError(f"{name} {loc.uri}: {why}") from None
    return loc


def input_dir(name: str, where: str | os.PathLike[str] | Location) -> Location:
    """The location of an input directory, checked before any work: a known scheme and something there
    (else one line naming ``name`` and the path, or the bucket when that is what is missing)."""
    loc = resolve_option(name, where)
    try:
        there = loc.is_dir()
    except StoreError as e:  # an unreachable store
        raise StoreError(f"{name} {e}") from None
    if not there:
        raise missing(loc, name)
    return loc


def missing(loc: Location, what: str) -> StoreError:
    """The error for an input that is not there: the bucket, when that is what is missing."""
    if not loc.is_local:
        bucket = loc.path.split("/", 1)[0]
        if replace(loc, path=bucket).info().type == pafs.FileType.NotFound:
            return StoreError(
                f"{what} {loc.uri}: bucket {bucket!r} is missing or hidden from these credentials"
            )
    return StoreError(f"{what} {loc.uri} does not exist")


def files_under(loc: Location, suffix: str = ".parquet", recursive: bool = True) -> list[Location]:
    """Files ending in ``suffix`` under ``loc`` in path order, none below a ``_`` or ``.`` name."""
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True, recursive=recursive))
    except OSError as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None
    root = loc.path.rstrip("/")
    out = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(suffix):
            continue
        rel = info.path[len(root) :].lstrip("/")
        if not any(part.startswith(HIDDEN) for part in rel.split("/")):
            out.append(loc.join(rel))
    return sorted(out, key=lambda f: f.path)


def read_schema(loc: Location) -> pa.Schema:
    """The schema (and metadata) of the Parquet file at ``loc``; one line naming it if unreadable."""
    try:
        return pq.read_schema(loc.path, filesystem=loc.fs)
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None


def read_table(loc: Location, **kw: Any) -> pa.Table:
    """The Parquet file at ``loc`` (``kw`` to ``pyarrow.parquet.read_table``)."""
    try:
        return pq.read_table(loc.path, filesystem=loc.fs, **kw)
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None


def write_parquet(table: pa.Table, loc: Location, durable: bool = False, **options: Any) -> None:
    """Write ``table`` as one Parquet file (zstd unless ``options`` say otherwise) that a reader sees
    whole or not at all: locally streamed to a temporary file beside ``loc`` and renamed over it (no
    second copy of a large output in memory); on an object store one upload, which appears complete.

    ``durable`` (the sink's ``durability=strict``): the file is fsynced by its name once it has it,
    before this returns; its directory is left to the caller, who publishes only after fsyncing it
    (the sink's commit fsyncs each batch directory once, then writes the manifest that names it).
    """
    options = {"compression": "zstd", **options}
    try:
        if loc.is_local:
            directory = posixpath.dirname(loc.path)
            tmp = posixpath.join(directory, f".{posixpath.basename(loc.path)}.tmp-{uuid.uuid4().hex[:12]}")
            os.makedirs(directory, exist_ok=True)
            # mode 0o666: an ordinary output's (before the umask), not a private temporary file's
            with replacing(loc.path, tmp=tmp, mode=0o666) as f:
                pq.write_table(table, f, **options)
            if durable:
                fsync_path(loc.path)
            return
        with loc.fs.open_output_stream(loc.path) as out:
            pq.write_table(table, out, **options)
    except OSError as e:
        raise StoreError(f"{loc.uri}: {first_line(e)}") from None


def write_figure(loc: Location, fig: Any, dpi: int = 110) -> None:
    """Write a matplotlib figure as a PNG at ``loc`` (whole or not at all) and free it."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    loc.write_bytes(buf.getvalue())
