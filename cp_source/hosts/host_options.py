"""The reader options of a query over factory hosts (``factories=...``, ``factoriesDir=...``).

``hosts_options`` checks them together with the options they exclude (a query
over factory hosts has no factory or spool of its own), one line per refusal.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from cp_common.options import Options, given, path_option, seconds_option
from cp_source.ready.offsets import MAX_FACTORIES

_ENDPOINT_RE = re.compile(r"^tcp://([A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):([0-9]{1,5})$")
# Options of a query's own factory and spool: a query over factory hosts has neither.
EXCLUSIVE_OPTIONS = (
    "endpoint",
    "spool",
    "workers",
    "factory",
    "maxSpoolBytes",
    "durability",
    "serverBind",
    "serverHost",
)
# Not supported with factories in this version: refused with one line, never ignored.
NOT_YET = {
    "startingoffsets": ("latest", "startingOffsets=latest is not supported with factories yet"),
    "scheduling": ("klink", "scheduling=klink is not supported with factories yet"),
}
HOST_OPTIONS = ("factories", "factoriesDir", "factoryTimeout", "statusDir")


def parse_factories(raw: str) -> tuple[str, ...]:
    """``tcp://h1:p1,tcp://h2:p2`` -> the endpoints; ValueError naming the option when malformed."""
    items = [x.strip() for x in raw.split(",") if x.strip()]
    if not items:
        raise ValueError(f"option factories={raw!r}: expected tcp://HOST:PORT,tcp://HOST:PORT,...")
    if len(items) > MAX_FACTORIES:
        raise ValueError(f"option factories: {len(items)} factories, at most {MAX_FACTORIES}")
    for ep in items:
        check_endpoint(ep, "option factories")
    dup = sorted({ep for ep in items if items.count(ep) > 1})
    if dup:
        raise ValueError(f"option factories: {dup[0]} is listed twice")
    return tuple(items)


def check_endpoint(ep: str, name: str) -> str:
    """A factory host's ``tcp://HOST:PORT``; ValueError naming where it came from otherwise."""
    m = _ENDPOINT_RE.match(ep)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{name}: {ep!r} is not tcp://HOST:PORT (a factory host's --serve address)")
    return ep


def default_status_dir(factories: tuple[str, ...], registry: str | None = None) -> str:
    """Where the reader writes ``_factories.json`` when ``statusDir`` is not given: per user, per list."""
    from cp_store.private_dirs import default_spool_root

    key = ",".join(factories) + (f"|{os.path.abspath(registry)}" if registry else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return str(default_spool_root() / f"factories-{digest}")


def hosts_options(opts: Options) -> dict[str, Any]:
    """``factories`` and the options only it takes, checked against the ones it excludes (one line)."""
    raw = opts.get("factories")
    registry = (opts.get("factoriesdir") or "").strip() or None
    if raw is None and registry is None:
        hosts_only = given(opts, ("factoryTimeout", "statusDir"))
        if hosts_only:
            raise ValueError(f"option {hosts_only[0]}: only factories=... (or factoriesDir) takes it")
        return {}
    if registry is not None:
        path_option(opts, "factoriesDir")  # refuses a NUL byte in one line
    factories = parse_factories(raw) if raw is not None else ()
    clash = given(opts, EXCLUSIVE_OPTIONS)
    if clash:
        raise ValueError(
            f"option {clash[0]}: not with factories=... (each factory host has its own spool and "
            f"endpoint: `cloudprofiler factory --serve`); leave {clash[0]} out"
        )
    for name, (value, why) in NOT_YET.items():
        if opts.get(name, "").strip().lower() == value:
            raise ValueError(f"option {name}: {why}")
    if opts.get("fetch", "network").strip().lower() == "local":
        raise ValueError("option fetch=local: with factories executors fetch from the factory hosts")
    timeout = seconds_option(opts, "factoryTimeout", 0.0, 86400 * 7, zero="0: wait forever")
    status = (opts.get("statusdir") or "").strip()
    if "\0" in status:
        raise ValueError(f"option statusDir={status!r}: expected a directory path")
    return {
        "factories": factories,
        "factories_dir": registry,
        "factory_timeout": timeout,
        "status_dir": status or default_status_dir(factories, registry),
    }
