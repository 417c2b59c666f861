"""Options as Spark hands them to a data source (case-insensitive strings), read and checked.

Spark passes a Python data source its option names lower-cased; ``lower_keys`` lower-cases a map
once and every reader below takes such a map and the option's documented spelling (``fetchTimeout``),
which names it in an error. A bad value raises ValueError in one line naming the option and the
value as given; an unknown name is refused with the nearest valid one ("did you mean").
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Options = Mapping[str, str]  # names lower-cased (``lower_keys``), values as given

_DURATION = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?)?\s*$", re.I
)
_UNIT_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "sec": 1000, "second": 1000}
_UNIT_MS |= {"seconds": 1000, "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000}
_UNIT_MS |= {"h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000}
MAX_DURATION_MS = 7 * 86_400_000


def lower_keys(options: Mapping[Any, Any]) -> dict[str, str]:
    """The option map with its names lower-cased and its values as strings (as Spark passes them)."""
    return {k: str(v) for k, v in lower_names(options).items()}


def lower_names(options: Mapping[Any, Any] | None) -> dict[str, Any]:
    """The map with its names lower-cased and its values kept (a program's keyword parameters)."""
    return {str(k).lower(): v for k, v in dict(options or {}).items()}


def given(opts: Options, names: Iterable[str]) -> list[str]:
    """Those of ``names`` (documented spellings) that ``opts`` holds, in the order of ``names``."""
    return [n for n in names if n.lower() in opts]


def raw_option(opts: Options, name: str) -> str | None:
    """The value of option ``name`` (any spelling) as given, or None when absent."""
    return opts.get(name.lower())


def int_option(opts: Options, name: str, default: int, lo: int, hi: int) -> int:
    """An integer from ``lo`` to ``hi``; ``default`` when the option is absent."""
    raw = raw_option(opts, name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name}={raw!r}: expected an integer") from None
    if not lo <= value <= hi:
        raise ValueError(f"option {name}={value}: expected {lo} <= {name} <= {hi}")
    return value


def seconds_option(
    opts: Options,
    name: str,
    default: float,
    hi: float,
    zero: str | None = None,
    lo: float | None = None,
) -> float:
    """Seconds, more than 0 and at most ``hi``. With ``zero`` (what 0 means) 0 is allowed too; with
    ``lo``, from ``lo`` to ``hi`` (either error then says so)."""
    raw = raw_option(opts, name)
    if raw is None:
        return default
    span = None if lo is None else f"seconds from {lo:g} to {hi:g}"
    try:
        value = float(raw)
    except ValueError:
        note = f" ({zero})" if zero else ""
        raise ValueError(f"option {name}={raw!r}: expected {span or 'seconds' + note}") from None
    low_ok = value >= lo if lo is not None else value >= 0 if zero else value > 0
    if not (low_ok and value <= hi):  # NaN fails too
        if span:
            raise ValueError(f"option {name}={raw!r}: expected {span}")
        raise ValueError(f"option {name}={value:g}: expected 0 {'<=' if zero else '<'} {name} <= {hi:g}")
    return value


def port_option(opts: Options, name: str) -> int:
    """A TCP/UDP port from 1024 to 65535, or 0 (any free port, also when absent)."""
    raw = raw_option(opts, name)
    if raw is None:
        return 0
    value = int(raw) if raw.strip().isdigit() else -1
    if value != 0 and not 1024 <= value <= 65535:
        raise ValueError(f"option {name}={raw!r}: expected 0 (any free port) or a port from 1024 to 65535")
    return value


def duration_ms(name: str, raw: str, allow_zero: bool = False) -> int:
    """``"10 seconds"``, ``"500 ms"``, ``"2s"`` or plain milliseconds, as whole milliseconds."""
    m = _DURATION.match(str(raw))
    if m is None:
        raise ValueError(f"option {name}={raw!r}: expected a duration such as '10 seconds' or '500 ms'")
    value = float(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()]
    if value != int(value) or value > MAX_DURATION_MS or (value == 0 and not allow_zero):
        raise ValueError(f"option {name}={raw!r}: expected whole milliseconds, more than 0, at most 7 days")
    return int(value)


def choice_option(opts: Options, name: str, choices: Sequence[str], default: str | None = None) -> str:
    """One of ``choices`` (case-insensitive); ``default`` (else the first choice) when absent."""
    raw = raw_option(opts, name)
    written = str(choices[0] if default is None else default) if raw is None else raw
    value = written.strip().lower()
    if value not in choices:  # the value as the user wrote it, the option as the docs spell it
        raise ValueError(f"option {name}={written!r}: expected one of {', '.join(choices)}")
    return value


def flag_option(opts: Options, name: str, choices: Sequence[str], on: str) -> bool:
    """A two-way choice (``durability``: process or strict) as "is it ``on``"."""
    return choice_option(opts, name, choices) == on


def path_option(opts: Options, name: str) -> str | None:
    """A directory path or URI, stripped; None when absent; empty or with a NUL byte refused."""
    raw = raw_option(opts, name)
    if raw is None:
        return None
    path = raw.strip()
    if not path or "\0" in path:
        raise ValueError(f"option {name}={raw!r}: expected a directory path")
    return path


# ---- option names -------------------------------------------------------------------------------
def canonical(name: str, spellings: Sequence[str]) -> str:
    """``name`` in its documented spelling (case-insensitive), or as given when unknown."""
    return next((s for s in spellings if s.lower() == name.lower()), name)


def suggestion(name: str, spellings: Sequence[str]) -> str | None:
    """The one documented name closest to ``name`` (case-insensitive), or None when none is near."""
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


def check_names(options: Iterable[str], spellings: Sequence[str], what: str) -> None:
    """Refuse unknown option names in one line (``unknown_options_error``)."""
    message = unknown_options_error(options, spellings, what)
    if message is not None:
        raise ValueError(message)
