"""One JSON object parsed from bytes and checked to be an object, for the readers that take
nothing else (a batch manifest, a line of the file workload): each raises its own error type, in
its own words for a value that is JSON but not an object.

It sits at the ground so the readers of every package share it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from cp_common.printable import first_line


def json_object(
    data: bytes | str, where: str, error: type[Exception], not_object: Callable[[Any], str]
) -> dict[str, Any]:
    """``data`` parsed; ``error("<where>: not JSON (<why>)")`` when it does not parse and
    ``error("<where>: <not_object(value)>")`` when it parses to something other than an object."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise error(f"{where}: not JSON ({first_line(e)})") from None
    if not isinstance(doc, dict):
        raise error(f"{where}: {not_object(doc)}")
    return doc
