"""Where results live: a path or URI resolved to a ``pyarrow.fs`` filesystem and a path inside it.

Every place that writes or reads results (sink records, sync tables, translations, progress
logs, demo and maxrate outputs) takes a :class:`Location`, so a plain path, ``file://``,
``s3://``, ``gs://``, ``hdfs://`` and ``abfs://`` all work the same way. Hadoop's ``s3a://``
and ``s3n://`` (what users copy from their Spark paths) mean ``s3://``.

Credentials and endpoints come from the store's standard chains (``AWS_*`` variables,
``AWS_ENDPOINT_URL``, instance roles, ...). A URI's query string overrides them the way
pyarrow reads it (``s3://bucket/records?endpoint_override=host:9000&scheme=http``).

What is printed, logged or put in an error is :attr:`Location.uri`: the URI with any user
info (``s3://KEY:SECRET@bucket``) and secret-looking query values removed.
"""

from __future__ import annotations

import os
import posixpath
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pyarrow.fs as pafs

from cp_common.printable import first_line, is_uri, redact, scrub, userinfo
from cp_store.atomic_files import atomic_write
from cp_store.place import stand_in, store_of

# Schemes pyarrow resolves itself; "" is a plain local path.
_PYARROW_SCHEMES = ("", "file", "local", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
_HADOOP_S3 = ("s3a", "s3n")
# RFC 3986 user info: unreserved, sub-delims, ':' and percent-escapes.
_USERINFO_OK = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*")


class StoreError(OSError):
    """A location that cannot be used: unknown scheme, unreachable store, missing bucket."""


@dataclass(frozen=True)
class Location:
    """A filesystem and a path in it, with the URI it came from (credentials removed).

    ``store`` names the store the URI reached (see :mod:`cp_store.place`); with the path it makes
    :attr:`identity`, what tells two locations apart where the printable ``uri`` may not.
    """

    fs: pafs.FileSystem
    path: str
    uri: str
    store: str = ""

    def __str__(self) -> str:
        return self.uri

    @property
    def is_local(self) -> bool:
        """True for the local filesystem: rename is atomic and fsync means something."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def identity(self) -> str:
        """What names this place (store, account, host and port, bucket or container, path): the key
        of every per-process table about a location. Holds no credentials; not for printing."""
        if self.is_local and not self.store:
            return self.path
        return f"{self.store or store_of(self.fs)}|{self.path}"

    def join(self, *parts: str) -> Location:
        """The location of ``parts`` under this one (``/``-separated on every store)."""
        clean = [p.strip("/") for p in parts if p.strip("/")]
        return replace(self, path=posixpath.join(self.path, *clean), uri=_join_uri(self.uri, clean))

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def info(self) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(self.path)
        except OSError as e:
            raise StoreError(f"{self.uri}: {first_line(e)}") from None

    def children(self) -> list[pafs.FileInfo]:
        """What is directly under this location (empty if it does not exist)."""
        try:
            return self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except OSError as e:
            raise StoreError(f"{self.uri}: {first_line(e)}") from None

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path) as f:
                return bytes(f.read())
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StoreError(f"{self.uri}: {first_line(e)}") from None

    def write_bytes(self, data: bytes, durable: bool = False) -> None:
        """Write ``data`` so a reader sees all of it or nothing.

        Locally through a temporary file and a rename (fsynced first if ``durable``); on an object
        store one upload is already all-or-nothing (the object appears when the upload completes).
        """
        try:
            if self.is_local:
                self.fs.create_dir(posixpath.dirname(self.path), recursive=True)
                tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:12]}"
                atomic_write(self.path, data, durable, tmp=tmp, mode=0o666)  # an ordinary output's mode
                return
            with self.fs.open_output_stream(self.path) as out:
                out.write(data)
        except OSError as e:
            raise StoreError(f"{self.uri}: {first_line(e)}") from None

    def make_dirs(self) -> None:
        """Create this location as a directory (object stores have none to create: a no-op there)."""
        try:
            self.fs.create_dir(self.path, recursive=True)
        except OSError as e:
            raise StoreError(f"{self.uri}: {first_line(e)}") from None

    def delete(self) -> None:
        """Remove this file or directory tree; a missing one is not an error."""
        try:
            kind = self.info().type
            if kind == pafs.FileType.Directory:
                self.fs.delete_dir(self.path)
            elif kind != pafs.FileType.NotFound:
                self.fs.delete_file(self.path)
        except (FileNotFoundError, StoreError):
            return
        except OSError as e:
            raise StoreError(f"{self.uri}: {first_line(e)}") from None


def resolve(where: str | os.PathLike[str] | Location) -> Location:
    """The :class:`Location` of a path or URI; one-line :class:`StoreError` for an unknown scheme.

    Plain relative paths become absolute here, on the process that resolves them (a driver's
    working directory means nothing to an executor).
    """
    if isinstance(where, Location):
        return where
    raw = os.fspath(where)
    if not raw.strip():
        raise StoreError("empty path: give a directory or a URI such as s3://bucket/prefix")
    scheme = _scheme(raw)
    if not _USERINFO_OK.fullmatch(userinfo(raw)):  # what pyarrow would refuse, quoting the secret
        raise StoreError(
            f"{redact(raw)}: the credentials in the URI hold characters a URI cannot carry as they "
            "are (such as '/', '?', '#', '@', '%', '['): percent-encode them ('/' as %2F) or give "
            "them through the store's variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        )
    if scheme in _HADOOP_S3:
        raw = "s3" + raw[len(scheme) :]
        scheme = "s3"
    if scheme not in _PYARROW_SCHEMES:
        raise StoreError(
            f"{redact(raw)}: unknown scheme {scheme + '://'!r} "
            f"(supported: plain paths, file://, s3://, s3a://, gs://, hdfs://, abfs://)"
        )
    if scheme == "":
        path = os.path.abspath(os.path.expanduser(raw))
        return Location(pafs.LocalFileSystem(), path, path)
    try:
        fs, path = pafs.FileSystem.from_uri(_s3_single_put(raw) if scheme == "s3" else raw)
    except (ValueError, OSError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise StoreError(f"{redact(raw)}: {scrub(first_line(e), raw)}") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return Location(fs, path, path)
    uri = redact(raw).rstrip("/")
    store = store_of(fs, uri)
    fs, path = stand_in(fs, path.rstrip("/"))
    return Location(fs, path, uri, store)


def check_writable(loc: Location) -> None:
    """Fail now, in one line naming ``loc``, if its store cannot be reached or its bucket is missing.

    Used when a query starts, so a typo or a missing bucket does not surface as a task failure
    minutes later. Creates ``loc`` as a directory where directories exist.
    """
    if not loc.is_local:
        bucket = loc.path.split("/", 1)[0]
        root = replace(loc, path=bucket)
        if root.info().type == pafs.FileType.NotFound:
            raise StoreError(f"{loc.uri}: bucket {bucket!r} is missing or hidden from these credentials")
    loc.make_dirs()


def one_file(where: str, what: str, hint: str = "") -> Location:
    """The :class:`Location` of ``where`` if it names one file with bytes in it; otherwise a
    one-line ValueError naming the URI and why (``what``: the kind of file, e.g. "NDJSON file";
    ``hint``: said after a missing or wrong path, e.g. the option that named it)."""
    try:
        loc = resolve(where)
        kind = loc.info()
    except StoreError as e:  # it names the URI
        raise ValueError(f"{e}{hint}") from None
    if kind.type == pafs.FileType.NotFound:
        raise ValueError(f"{loc.uri}: no such {what}{hint}")
    if kind.type != pafs.FileType.File:
        raise ValueError(f"{loc.uri}: not a file (give one {what}){hint}")
    if kind.size == 0:
        raise ValueError(f"{loc.uri}: empty file (0 bytes): no rows to replay{hint}")
    return loc


def _s3_single_put(raw: str) -> str:
    """``raw`` with pyarrow's delayed open on: a small file (a manifest, a task's Parquet file) then
    goes up in one PUT at close instead of a three-request multipart upload, and is all-or-nothing
    either way. A URI that sets the option itself keeps its own value."""
    parts = urlsplit(raw)
    if "allow_delayed_open" in dict(parse_qsl(parts.query)):
        return raw
    query = f"{parts.query}&allow_delayed_open=true" if parts.query else "allow_delayed_open=true"
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def _scheme(raw: str) -> str:
    if not is_uri(raw):
        return ""
    return raw.split("://", 1)[0].lower()


def _join_uri(uri: str, parts: list[str]) -> str:
    if not parts:
        return uri
    split = urlsplit(uri)
    if not split.scheme or len(split.scheme) == 1:
        return posixpath.join(uri, *parts)
    path = posixpath.join(split.path or "/", *parts)
    return urlunsplit((split.scheme, split.netloc, path, split.query, split.fragment))


def describe(loc: Any) -> str:
    """How to name ``loc`` (a Location, path or URI) in a message: never with credentials."""
    return loc.uri if isinstance(loc, Location) else redact(os.fspath(loc))
