"""Type stub for the C extension cp_source.factory._ysb (the all-string NDJSON row parser)."""

from typing import Any

def parse(
    buf: Any, keys: Any, key_off: Any, max_rows: int, offsets: Any, data: Any, start: Any, r0: int
) -> int:
    """Parse all-string NDJSON rows (uint8 buf; keys uint8, key_off int64 of len(keys)+1 entries):
    column k's values go to data[k, start[k]:] (uint8, nk rows), its Arrow offsets to offsets[k, r0:]
    (int32, nk rows). Returns the row count (start, int64, advanced), or -1 (start unchanged) when the
    payload needs the generic parser. TypeError/ValueError for arrays that do not fit."""
