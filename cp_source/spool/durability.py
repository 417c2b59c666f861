"""How much of what the factory and the reader write survives a crash: the ``durability`` setting.

``process`` (the default): everything survives a crash of any process, because
every file is published by rename or by whole appends that recovery repairs; but
nothing is fsynced, so an OS crash or power loss can lose or reorder whatever
the kernel had not yet written back (on Linux, up to ~30 s of writes).

``strict``: also survives an OS crash or power loss. Every file is fsynced
before it is named, and its directory after, so whatever a manifest line, a
ledger or a commit claims is on disk is on disk:

* a segment: write ``seg-N.arrow.tmp``, fsync it, rename, fsync the directory,
  append the bucket records and fsync them, then the manifest line and fsync it;
* an atomic replace (``committed.json``, ``planned.json``, ``_front/ledger.json``,
  ``spool.json``, ``stats.json``): write a temp file, fsync it, rename (or link),
  fsync the directory;
* an append to the ledger (``rejected.bin``, ``eos.ndjson``): fsync after it.
"""

from __future__ import annotations

from cp_common.options import choice_option

DURABILITY_LEVELS = ("process", "strict")


class DurabilityError(RuntimeError):
    """An fsync failed after readers could already see what it was to make durable.

    Not an OSError on purpose: it must not be taken for a full disk and retried (a retry
    would publish twice). A factory worker dies of it and its restart recovers from disk.
    """


def check_durability(value: str, name: str = "durability") -> str:
    """``value`` as a level (case-insensitive); a bad one raises a one-line ValueError naming ``name``."""
    return choice_option({name.lower(): str(value)}, name, DURABILITY_LEVELS)
