"""The demo's directories: the local work directory (spools, checkpoints, records) and where its
results go (``--out``, a path or URI), both checked before anything starts; the work files removed
once the run no longer needs them."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cloudprofiler.errors import CommandError
from cp_store.location import resolve

if TYPE_CHECKING:
    import argparse

    from cp_store.location import Location


def _check_results(results: Location) -> None:
    from cp_store.location import check_writable

    try:
        check_writable(results)
    except OSError as e:
        raise CommandError(f"--out {e}") from None


def prepare_out(args: argparse.Namespace) -> tuple[Path, Location]:
    """The local work directory (spools, checkpoints, records) and where the results go (--out).

    Both are checked before anything starts. With a URI, the work directory is a local temp dir:
    spools live on the factory's local disk, and the windows query writes through Spark's own
    file sink."""
    from cp_store.tables import resolve_option

    results = resolve_option("--out", args.out) if args.out else None
    if results is not None:
        _check_results(results)
    if results is not None and results.is_local:
        out = Path(results.path)
    elif results is not None:
        out = Path(tempfile.mkdtemp(prefix="cloudprofiler-demo-"))  # removed at the end (clean_up)
    else:
        out = Path(time.strftime("cloudprofiler-demo-%Y%m%d-%H%M%S")).absolute()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("spool", "spool-latency"):
        spool = out / name
        if spool.exists() and any(spool.iterdir()):
            raise CommandError(f"{spool} already holds a spool: give an empty --out directory")
    return out, results or resolve(out)


WORK_DIRS = ("spool", "spool-latency", "checkpoint", "checkpoint-latency")


def clean_up(out: Path, results: Location) -> None:
    """Remove the work files the run no longer needs: the spools and checkpoints (tens of MB), and the
    whole local work directory when the results went to a URI."""
    import shutil

    if not results.is_local:
        shutil.rmtree(out, ignore_errors=True)
        return
    for name in WORK_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
