"""Unknown option names of a Spark data source, refused in one line with a "did you mean".

Here, at the ground, because the reader (cp_source) and the sink (cp_sink) both refuse
unknown names and neither imports the other. Spark hands a Python data source its option
names lower-cased: a known option is named in its documented spelling (``periodMs``), and an
unknown one as received, saying that Spark lower-cased it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def canonical(name: str, spellings: Sequence[str]) -> str:
    """``name`` in its documented spelling (case-insensitive), or as given when unknown."""
    return next((s for s in spellings if s.lower() == name.lower()), name)


def suggestion(name: str, spellings: Sequence[str]) -> str | None:
    """The one documented option closest to ``name`` (case-insensitive), or None when none is near."""
    lowered = {s.lower(): s for s in spellings}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def unknown_options_error(given: Iterable[str], spellings: Sequence[str], what: str) -> str | None:
    """One line refusing the names of ``given`` that are none of ``spellings`` (case-insensitive):
    each quoted, with the nearest valid name, then the valid ones; None when all are known."""
    known = {s.lower() for s in spellings}
    unknown = sorted({str(k) for k in given if str(k).lower() not in known})
    if not unknown:
        return None
    named = []
    for name in unknown:
        near = suggestion(name, spellings)
        named.append(f"'{name}'" + (f", did you mean '{near}'?" if near else ""))
    # a name Spark handed over can only be quoted lower-cased: say so rather than misquote the user
    lowered = "names as Spark passes them, lower-cased; " if all(n == n.lower() for n in unknown) else ""
    s = "s" if len(unknown) > 1 else ""
    return f"unknown option{s} for {what}: {'; '.join(named)} ({lowered}valid: {', '.join(spellings)})"
