"""The stamps translation reads: tuple ids and two stamp points' columns from a records location.

A records location is a directory or URI of Parquet files: the cloudprofiler sink's path, or any
dataset whose files carry ``tuple_id`` and ``cp_tsc_<point>``/``cp_node_<point>`` columns (such as
window results a Spark query wrote). Names starting with ``_`` or ``.`` (staging, publication in
progress, the sync tables under ``_sync``) are never read; under a sink path, only the files its
committed manifests list (``cp_store.batch_log``).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc

from cp_store.location import Location, resolve
from cp_store.tables import files_under, missing, read_schema
from native_tsc.stamp_columns import node_column, stamp_points, tsc_column


def record_files(root: Location) -> list[Location]:
    """The Parquet files of a records location.

    A sink path (one with ``_commits/``): exactly the files its committed manifests list, so what a
    failed or speculative task attempt left beside them is never read. Any other directory (files
    a Spark query wrote, say): every Parquet file, none below a ``_`` or ``.`` name.
    """
    from cp_store.batch_log import COMMITS, read_manifests

    if not root.join(COMMITS).is_dir():
        return files_under(root)
    listed = [f for m in read_manifests(root).values() for f in m.data(root)]
    return [f for f in listed if f.path.endswith(".parquet")]


def read_points(records_dir: str | os.PathLike[str] | Location, from_point: str, to_point: str) -> pa.Table:
    """tuple_id and the two points' stamp columns from a records directory or URI (staging ignored).

    Files without ``tuple_id`` (such as the sink's per-period counts) are not records and are skipped.
    """
    import pyarrow.dataset as pds

    root = resolve(records_dir)
    if not root.is_dir():
        raise ValueError(str(missing(root, "records directory")))
    cols = [
        "tuple_id",
        tsc_column(from_point),
        node_column(from_point),
        tsc_column(to_point),
        node_column(to_point),
    ]
    files, seen = [], set()
    for f in record_files(root):
        names = read_schema(f).names
        if "tuple_id" in names:
            seen.update(names)
            if all(c in names for c in cols):
                files.append(f.path)
    if not seen:
        raise ValueError(f"no record files (Parquet with tuple_id) under {root.uri}")
    if not files:
        absent = [c for c in cols if c not in seen]
        raise ValueError(
            f"records in {root.uri} lack {', '.join(absent) or 'both points together'} "
            f"(stamp points present: {', '.join(stamp_points(sorted(seen))) or 'none'})"
        )
    schema = pa.schema(
        [
            ("tuple_id", pa.int64()),
            (cols[1], pa.int64()),
            (cols[2], pa.string()),
            (cols[3], pa.int64()),
            (cols[4], pa.string()),
        ]
    )
    t = pds.dataset(files, format="parquet", schema=schema, filesystem=root.fs).to_table(columns=cols)
    valid = pc.and_(pc.is_valid(t[cols[1]]), pc.is_valid(t[cols[3]]))
    return t.filter(valid)
