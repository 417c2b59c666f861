"""The stamps translation reads: tuple ids and two stamp points' columns from a records location.

A records location is a directory or URI of Parquet files: the cloudprofiler sink's path, or any
dataset whose files carry ``tuple_id`` and ``cp_tsc_<point>``/``cp_node_<point>`` columns (such as
window results a Spark query wrote). Names starting with ``_`` or ``.`` (staging, publication in
progress, the sync tables under ``_sync``) are never read; under a sink path, only the files its
committed manifests list (``cp_store.batch_log``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cp_common.stamp_columns import (
    COMMITTED,
    TSC_PREFIX,
    is_stamp_column,
    stamp_columns,
    stamp_points,
    tsc_column,
)
from cp_store.location import Location
from cp_store.published_run import Published, Where, published
from cp_store.tables import missing, read_schema

# What a sink record holds besides stamps and kept columns (cp_sink.records.RECORD_OWN_COLUMNS).
RECORD_COLUMNS = ("tuple_id", "partition", "batch_id", "role")


def record_files(root: Where) -> list[Location]:
    """The Parquet files of a records location (``Published.record_files``)."""
    return published(root).record_files()


def points_in_files(records_dir: Where) -> tuple[int, dict[str, int]]:
    """(record files, files holding each stamp point): the points in the order their columns first
    appear; "committed" counts the files whose batch's manifest stamped it."""
    run = _existing(records_dir)
    held: dict[str, int] = {}
    stamps = run.commit_stamps()
    n = 0
    for f in run.record_files():
        names = read_schema(f).names
        if "tuple_id" in names:
            n += 1
            for p in [*stamp_points(names), *([COMMITTED] if stamps.get(f.path) is not None else [])]:
                held[p] = held.get(p, 0) + 1
    return n, held


def read_points(
    records_dir: Where,
    from_point: str,
    to_point: str,
    keys: Sequence[str] = (),
) -> pa.Table:
    """tuple_id, the two points' stamp columns and the ``keys`` columns (the sink's ``keepColumns``)
    from a records directory or URI (staging ignored); records lacking either stamp are left out.

    Files without ``tuple_id`` (such as the sink's per-period counts) are not records and are skipped.
    A key column is read with the type its files give it (dictionary-encoded strings as plain strings).
    """
    t = read_stamps(records_dir, [from_point, to_point], keys)
    valid = pc.and_(pc.is_valid(t[tsc_column(from_point)]), pc.is_valid(t[tsc_column(to_point)]))
    return t.filter(valid)


def read_stamps(records_dir: Where, points: Sequence[str], keys: Sequence[str] = ()) -> pa.Table:
    """tuple_id, every point's stamp columns (in the order given) and the ``keys`` columns, every
    record of the files that hold all of them (a stamp may be null: the caller decides)."""
    import pyarrow.dataset as pds

    run = _existing(records_dir)
    root = run.root
    points = list(dict.fromkeys(points))  # one point asked twice is read once
    cols = ["tuple_id", *(c for p in points for c in stamp_columns(p))]
    # "committed" is not in the files: it comes from each file's manifest (one stamp per batch)
    from_manifest = [c for c in cols if c in stamp_columns(COMMITTED)]
    in_files = [c for c in cols if c not in from_manifest]
    files, seen, keyless = [], set(from_manifest), []
    key_types: dict[str, pa.DataType] = {}
    for f in run.record_files():
        schema = read_schema(f)
        if "tuple_id" in schema.names:
            seen.update(schema.names)
            if all(c in schema.names for c in in_files):
                if not all(k in schema.names for k in keys):
                    keyless.append(f.uri)
                    continue
                files.append(f.path)
                key_types.update({k: _plain_type(schema.field(k).type) for k in keys})
    if not seen:
        raise ValueError(f"no record files (Parquet with tuple_id) under {root.uri}")
    _check_found(root, cols, keys, seen, files)
    if keyless:  # never a silent drop: a run whose sink kept the keys only for a while is refused
        raise ValueError(
            f"{len(keyless)} record file(s) under {root.uri} have no column {', '.join(keys)} to group by "
            f"(first: {keyless[0]})"
        )
    schema = pa.schema(
        [
            ("tuple_id", pa.int64()),
            *((c, pa.int64() if c.startswith(TSC_PREFIX) else pa.string()) for c in cols[1:]),
            *((k, key_types[k]) for k in keys),
        ]
    )
    if from_manifest:
        return _with_commit_stamps(run, files, schema, in_files, keys).select([*cols, *keys])
    return pds.dataset(files, format="parquet", schema=schema, filesystem=root.fs).to_table(
        columns=[*cols, *keys]
    )


def _with_commit_stamps(
    run: Published, files: list[str], schema: pa.Schema, in_files: list[str], keys: Sequence[str]
) -> pa.Table:
    """The files' columns with their batch's "committed" stamp (from the manifests) on every row; a
    file of a batch whose commit was not stamped is refused in one line, never dropped."""
    import pyarrow.dataset as pds

    root = run.root
    stamps = run.commit_stamps()
    unstamped = [f for f in files if stamps.get(f) is None]
    if unstamped:
        raise ValueError(
            f"{len(unstamped)} record file(s) under {root.uri} have no committed stamp: their batches "
            f"were published by a sink that did not stamp its commits, or outside one (first: {unstamped[0]})"
        )
    own = pa.schema([f for f in schema if f.name not in stamp_columns(COMMITTED)])
    tsc, node = stamp_columns(COMMITTED)
    parts = []
    for frag in pds.dataset(files, format="parquet", schema=own, filesystem=root.fs).get_fragments():
        t = frag.to_table(columns=[*in_files, *keys], schema=own)
        stamp_tsc, stamp_node = stamps[frag.path]  # type: ignore[misc]
        t = t.append_column(tsc, pa.repeat(pa.scalar(stamp_tsc, pa.int64()), len(t)))
        parts.append(t.append_column(node, pa.repeat(pa.scalar(stamp_node, pa.string()), len(t))))
    return pa.concat_tables(parts)


def _existing(records_dir: Where) -> Published:
    """The records location, resolved once; one that does not exist is refused in one line."""
    run = published(records_dir)
    if not run.root.is_dir():
        raise ValueError(str(missing(run.root, "records directory")))
    return run


def _check_found(
    root: Location, cols: list[str], keys: Sequence[str], seen: set[str], files: list[str]
) -> None:
    """One line naming what the records lack: a key column (with the ones they have), or stamps."""
    absent_keys = [k for k in keys if k not in seen]
    if absent_keys:
        held = sorted(c for c in seen if not is_stamp_column(c) and c not in RECORD_COLUMNS)
        raise ValueError(
            f"records in {root.uri} have no column {', '.join(absent_keys)} to group by "
            f"(kept columns: {', '.join(held) or 'none; the sink option keepColumns keeps them'})"
        )
    if not files:
        absent = [c for c in cols if c not in seen]
        raise ValueError(
            f"records in {root.uri} lack {', '.join(absent) or 'both points together'} "
            f"(stamp points present: {', '.join(stamp_points(sorted(seen))) or 'none'})"
        )


def _plain_type(t: pa.DataType) -> pa.DataType:
    # The sink stores string columns dictionary-encoded; every file is read as the plain type.
    return t.value_type if pa.types.is_dictionary(t) else t
