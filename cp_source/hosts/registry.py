"""Factory hosts that register themselves: ``cloudprofiler factory --serve ... --register DIR``.

Each factory host writes ``factory-<spool id>.json`` (its segment server's
address) into the directory a query's ``factoriesDir`` names; the reader reads
the directory on every trigger, so a factory host joins a running query by
starting. A file that is not a registration is reported and ignored.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import orjson

from cp_source.hosts.host_options import check_endpoint
from cp_source.ready.offsets import MAX_FACTORIES
from cp_source.spool.names import SPOOL_ID, SPOOL_ID_RE

REGISTRY_NAME_RE = re.compile(rf"^factory-({SPOOL_ID})\.json$")
MAX_REGISTRATION_BYTES = 4096
MAX_REGISTRY_ENTRIES = 4096  # directory entries looked at per trigger


def register_factory(directory: str | os.PathLike[str], spool_id: str, server: str) -> Path:
    """Write this factory host's registration (``factory-<spool id>.json``: its segment server) into
    the directory a query's ``factoriesDir`` names, atomically; the path written."""
    from cp_store.atomic_files import atomic_write

    check_endpoint(server, "--register")
    if not SPOOL_ID_RE.match(spool_id):
        raise ValueError(f"spool id {spool_id!r} is malformed")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"factory-{spool_id}.json"
    body = {"server": server, "spool": spool_id, "pid": os.getpid(), "written_wall": time.time()}
    atomic_write(path, orjson.dumps(body))
    return path


def read_registry(directory: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The registrations in ``directory``: spool id -> segment server, and the files ignored -> why.
    A missing directory has none (the first factory creates it)."""
    found: dict[str, str] = {}
    ignored: dict[str, str] = {}
    try:
        with os.scandir(directory) as it:
            entries = [e for _, e in zip(range(MAX_REGISTRY_ENTRIES), it, strict=False)]
    except FileNotFoundError:
        return found, ignored
    for e in sorted(entries, key=lambda e: e.name):
        m = REGISTRY_NAME_RE.match(e.name)
        if m is None:
            if e.name.startswith("factory-") and not e.name.startswith("."):
                ignored[e.name] = "not factory-<spool id>.json"
            continue
        try:
            with open(e.path, "rb") as f:
                raw = f.read(MAX_REGISTRATION_BYTES + 1)
            if len(raw) > MAX_REGISTRATION_BYTES:
                raise ValueError(f"larger than {MAX_REGISTRATION_BYTES} bytes")
            doc = orjson.loads(raw)
            if not isinstance(doc, dict) or doc.get("spool") != m.group(1):
                raise ValueError("its spool is not the one its name says")
            found[m.group(1)] = check_endpoint(str(doc.get("server")), "server")
        except (OSError, ValueError) as err:  # orjson's decode error is a ValueError
            ignored[e.name] = str(err)
        if len(found) >= MAX_FACTORIES:
            break
    return found, ignored
