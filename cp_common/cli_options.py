"""Keyword arguments taken from a parsed command line, for the commands (of every package) that
hand their options on to a function under the option's own name or a given one.

It sits at the ground so all the packages' commands share it.
"""

from __future__ import annotations

import argparse
from typing import Any


def options_of(args: argparse.Namespace, *names: str, **renamed: str) -> dict[str, Any]:
    """``{name: args.name}`` for each of ``names``, and ``{keyword: args.<option>}`` for each
    ``keyword="option"`` of ``renamed`` (an option whose keyword reads differently)."""
    picked = {name: getattr(args, name) for name in names}
    picked.update({keyword: getattr(args, option) for keyword, option in renamed.items()})
    return picked
