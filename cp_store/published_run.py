"""One run's records location, resolved once and its manifests read once, for every reader.

A report reads one run's records many ways: whole records (``cp_sink.records``), two stamp points
for translation and a waterfall (``cp_sync.translate.record_points``), the per-batch counts. Each
reader handed a path would resolve it and list ``_commits/`` again. ``published(where)`` does both
once; the readers take the ``Published`` it returns as well as a path or a ``Location``.

A ``Published`` is a snapshot: batches a query commits after it was made are not in it. Make one
for a run that has stopped (a report) or anew for each look at a live one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TypeAlias

from cp_store.location import Location, resolve
from cp_store.manifests import COMMITS, Manifest, current_files, read_manifests
from cp_store.tables import files_under


@dataclass
class Published:
    """A records location (``root``) and what its committed manifests list, read on first use."""

    root: Location
    _manifests: dict[int, Manifest] | None = field(default=None, init=False, repr=False)
    _sink: bool | None = field(default=None, init=False, repr=False)
    _listed: list[Location] | None = field(default=None, init=False, repr=False)

    @property
    def is_sink_path(self) -> bool:
        """A sink path has ``_commits/``; any other directory is read file by file."""
        if self._sink is None:
            self._sink = self.root.join(COMMITS).is_dir()
        return self._sink

    @property
    def manifests(self) -> dict[int, Manifest]:
        """The committed manifests by batch id, in order (empty for a directory that is not a sink path)."""
        if self._manifests is None:
            self._manifests = read_manifests(self.root) if self.is_sink_path else {}
        return self._manifests

    def record_files(self) -> list[Location]:
        """The Parquet files of the location: under a sink path exactly the files its committed
        manifests list (where each is now), so what a failed or speculative attempt left beside
        them is never read; under any other directory every Parquet file, none below a ``_`` or
        ``.`` name."""
        if not self.is_sink_path:
            return files_under(self.root)
        return [f for f in self._current() if f.path.endswith(".parquet")]

    def commit_stamps(self) -> dict[str, tuple[int, str] | None]:
        """Each listed file (its path where it is now) and the "committed" stamp of its batch
        (None: a manifest written without it); empty for a directory that is not a sink path."""
        stamps = [m.committed for m in self.manifests.values() for _ in m.files]
        return {loc.path: st for loc, st in zip(self._current(), stamps, strict=True)}

    def _current(self) -> list[Location]:
        # every listed file where it is now (moved in, or still staged): looked up once
        if self._listed is None:
            self._listed = current_files(self.root, self.manifests.values())
        return self._listed


# a records location as every reader takes it: a path, a URI, a Location, or one already published
Where: TypeAlias = str | os.PathLike[str] | Location | Published


def published(where: Where) -> Published:
    """``where`` resolved once (a ``Published`` is handed back as it is)."""
    return where if isinstance(where, Published) else Published(resolve(where))
