"""A JSON object checked against the TypedDict that documents it: the keys a user reads are the keys
the object holds, in every nested section whose type is itself a TypedDict."""

from __future__ import annotations

import types
import typing
from typing import Any, is_typeddict


def _check(value: Any, hint: Any, where: str) -> None:
    """``value`` against ``hint``: TypedDicts by their keys, dicts and lists by their items."""
    origin = typing.get_origin(hint)
    if is_typeddict(hint):
        assert_keys(value, hint, where)
    elif origin in (typing.Union, types.UnionType):
        typed = [h for h in typing.get_args(hint) if h is not type(None)]
        if value is not None and len(typed) == 1:
            _check(value, typed[0], where)
    elif origin is dict and isinstance(value, dict):
        for k, v in value.items():
            _check(v, typing.get_args(hint)[1], f"{where}[{k!r}]")
    elif origin is list and isinstance(value, list):
        for i, v in enumerate(value):
            _check(v, typing.get_args(hint)[0], f"{where}[{i}]")


def assert_keys(doc: Any, typed: Any, where: str = "status") -> None:
    """Every required key of ``typed`` is in ``doc``, no key outside it, and so on down."""
    assert isinstance(doc, dict), f"{where} is not an object: {doc!r}"
    # from the hints, not __required_keys__: Python 3.11 counts a NotRequired written as a postponed
    # annotation (from __future__ import annotations) as required
    extras = typing.get_type_hints(typed, include_extras=True)
    optional = {k for k, h in extras.items() if typing.get_origin(h) is typing.NotRequired}
    required = extras.keys() - optional
    assert required <= doc.keys() <= required | optional, (
        f"{where}: keys {sorted(doc)} are not those of {typed.__name__} "
        f"(required {sorted(required)}, optional {sorted(optional)})"
    )
    hints = typing.get_type_hints(typed)
    for key, value in doc.items():
        _check(value, hints[key], f"{where}[{key!r}]")
