"""Names of stamp columns: the one place that spells ``cp_tsc_<point>`` and ``cp_node_<point>``.

A stamp point ``p`` adds two columns to a table: ``cp_tsc_p`` (int64 TSC
reading) and ``cp_node_p`` (the TSC domain id the reading belongs to). Every
package that writes or reads stamps builds the names here, so the generator,
factory, reader, sink and translation cannot disagree on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

TSC_PREFIX = "cp_tsc_"
NODE_PREFIX = "cp_node_"
_POINT_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

# Points the product stamps itself, in pipeline order. ``intended`` is not a reading but the time the
# generator's schedule meant a bucket to leave (on the generator's TSC): intended -> gen is the time a
# sender was held by the factory's credit or ran behind its schedule (coordinated omission).
# ``planned`` is the driver's reading as its latestOffset first offered a batch's tuples to Spark (one per
# batch, carried by the partition plan): factory -> planned is the wait in the spool for a trigger.
INTENDED, GEN, FACTORY, PLANNED, SOURCE, SINK = "intended", "gen", "factory", "planned", "source", "sink"
# The driver's reading as the sink's commit publishes a batch (one per batch, kept in its manifest).
COMMITTED = "committed"


def check_point(point: str) -> str:
    """A stamp point name: lower case letters, digits and underscores, starting with a letter."""
    if not isinstance(point, str) or not _POINT_RE.match(point):
        raise ValueError(f"invalid stamp point name {point!r}: use [a-z][a-z0-9_]*, at most 32 characters")
    return point


def tsc_column(point: str) -> str:
    """``cp_tsc_<point>``: the int64 TSC column of a stamp point."""
    return TSC_PREFIX + check_point(point)


def node_column(point: str) -> str:
    """``cp_node_<point>``: the TSC domain id column of a stamp point."""
    return NODE_PREFIX + check_point(point)


def stamp_columns(point: str) -> tuple[str, str]:
    """The (TSC, domain id) column names of a stamp point."""
    return tsc_column(point), node_column(point)


def is_stamp_column(name: str) -> bool:
    """True for ``cp_tsc_<point>`` and ``cp_node_<point>`` columns."""
    return name.startswith(TSC_PREFIX) or name.startswith(NODE_PREFIX)


def stamp_points(names: Iterable[str]) -> list[str]:
    """The points whose TSC column is among ``names``, in the order the columns appear."""
    return [n[len(TSC_PREFIX) :] for n in names if n.startswith(TSC_PREFIX)]
