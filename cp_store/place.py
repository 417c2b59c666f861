"""What names a place on a store: the identity of a :class:`cp_store.location.Location`.

Per-process tables (the sweeps and last commits of ``cp_store.batch_log``, the sink's reachability
checks, the sync coordinators' registry) are keyed by a location's identity, never by its printable
URI: the printable form leaves out the user info, and on Azure that part names the place
(``abfs://alpha@acct.dfs.core.windows.net/records`` and ``abfs://beta@...`` print the same).

The identity is the store (pyarrow's filesystem class, so the scheme), its address as pyarrow parsed
it from the URI, and the path in it, which starts with the bucket or container. The address is taken
from the filesystem's own options, never from the URI's text, so user info is read the way the store
reads it: on ``s3://`` and ``gs://`` it holds credentials (``KEY:SECRET@``), on ``hdfs://`` the user
acting (``user@namenode``), on ``abfs://`` the container (``alpha@acct.dfs.core.windows.net``, then the
first part of the path) or the account (``acct:password@host:port``, an emulator). Only options that say
which server holds the data are kept; credentials, users and settings (region, timeouts, ``http``)
are not, so the identity holds no secret. It is never printed either: messages name the URI.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

# pyarrow's options that name the server: S3 and GCS endpoints, Azure's account and authorities,
# HDFS's namenode.
_ADDRESS = (
    "endpoint_override",
    "account_name",
    "blob_storage_authority",
    "dfs_storage_authority",
    "host",
    "port",
)

# Tests only: a local directory standing in for every remote store (``<dir>/<bucket>/<key>``), so
# two Azure containers can be written without Azure. Set in the environment of every process; the
# identity stays the one of the store the URI names.
STAND_IN = "CLOUDPROFILER_STORE_STAND_IN"


def store_of(fs: pafs.FileSystem, printable: str = "") -> str:
    """The store ``fs`` reaches: its class and the options that say where it is, without credentials.

    ``printable`` is the URI it came from, credentials removed: what names the store if pyarrow
    cannot give its options back."""
    try:
        options = fs.__reduce__()[1][0]  # how pyarrow pickles a filesystem: its constructor's options
    except (TypeError, IndexError, AttributeError, ValueError):
        # ValueError: pyarrow decodes every option, credentials too, and a secret that is not UTF-8
        # fails there. The URI as printed names the store then (the path holds the bucket).
        options = None
    if not isinstance(options, dict):
        return f"{type(fs).__name__}?uri={printable}"
    address = "&".join(f"{k}={options[k]}" for k in _ADDRESS if options.get(k) not in (None, "", -1))
    return f"{type(fs).__name__}?{address}"


def stand_in(fs: pafs.FileSystem, path: str) -> tuple[pafs.FileSystem, str]:
    """``fs`` and ``path``, or (tests) the same path under the local directory set in :data:`STAND_IN`."""
    root = os.environ.get(STAND_IN)
    if not root:
        return fs, path
    return pafs.LocalFileSystem(), os.path.join(os.path.abspath(root), path)
