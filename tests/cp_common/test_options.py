"""The options toolkit: every reader takes any spelling of a name and refuses a bad value in one line."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from cp_common.options import (
    Options,
    check_names,
    choice_option,
    duration_ms,
    flag_option,
    given,
    int_option,
    lower_keys,
    lower_names,
    path_option,
    port_option,
    seconds_option,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cp_common", "native_tsc", "cp_store", "cp_source", "cp_sink", "cp_sync", "cloudprofiler")


def test_readers_take_any_spelling_and_fill_defaults() -> None:
    opts = lower_keys({"Workers": 4, "fetchTimeout": "2.5", "FETCH": " Local ", "klinkDir": " /k ", "N": 3})
    assert opts == {"workers": "4", "fetchtimeout": "2.5", "fetch": " Local ", "klinkdir": " /k ", "n": "3"}
    assert int_option(opts, "workers", 2, 1, 64) == 4
    assert int_option(opts, "segmentsPerPartition", 1000, 1, 10) == 1000  # absent: the default, unchecked
    assert seconds_option(opts, "fetchTimeout", 60.0, 3600) == 2.5
    assert choice_option(opts, "fetch", ("auto", "local", "network")) == "local"
    assert choice_option(opts, "ordering", ("arrival", "ready")) == "arrival"
    assert path_option(opts, "klinkDir") == "/k" and path_option(opts, "statusDir") is None
    assert given(opts, ("statusDir", "klinkDir", "workers")) == ["klinkDir", "workers"]
    assert flag_option(lower_keys({"durability": "STRICT"}), "durability", ("process", "strict"), "strict")
    assert port_option(opts, "syncPort") == 0 and port_option({"syncport": "5000"}, "syncPort") == 5000
    assert duration_ms("window", "10 seconds") == 10_000 and duration_ms("slide", "1.5s") == 1500
    assert duration_ms("watermarkDelay", "0", allow_zero=True) == 0
    assert lower_names({"periodMs": 5, "X": True}) == {"periodms": 5, "x": True}  # values kept as given


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (lambda o: int_option(o, "workers", 2, 1, 64), "option workers='two': expected an integer"),
        (lambda o: int_option(o, "rows", 2, 1, 64), "option rows=0: expected 1 <= rows <= 64"),
        (
            lambda o: seconds_option(o, "fetchTimeout", 60.0, 3600),
            "option fetchTimeout='soon': expected seconds",
        ),
        (
            lambda o: seconds_option(o, "senderTimeout", 1.0, 60),
            "option senderTimeout=0: expected 0 < senderTimeout <= 60",
        ),
        (
            lambda o: seconds_option(o, "factoryTimeout", 0.0, 604800, zero="0: wait forever"),
            "option factoryTimeout=-1: expected 0 <= factoryTimeout <= 604800",
        ),
        (
            lambda o: seconds_option(o, "syncEvery", 60.0, 86400, lo=0.5),
            "option syncEvery='nan': expected seconds from 0.5 to 86400",
        ),
        (
            lambda o: choice_option(o, "fetch", ("auto", "local")),
            "option fetch='Nowhere': expected one of auto, local",
        ),
        (lambda o: path_option(o, "klinkDir"), "option klinkDir='  ': expected a directory path"),
        (
            lambda o: port_option(o, "syncPort"),
            "option syncPort='80': expected 0 (any free port) or a port from 1024 to 65535",
        ),
        (
            lambda o: duration_ms("window", o["window"]),
            "option window='soon': expected a duration such as '10 seconds' or '500 ms'",
        ),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_option(
    read: Callable[[Options], object], message: str
) -> None:
    opts = lower_keys(
        {"Workers": "two", "rows": "0", "fetchTimeout": "soon", "senderTimeout": "0", "window": "soon"}
        | {"factoryTimeout": "-1", "syncEvery": "nan", "fetch": "Nowhere", "klinkDir": "  ", "syncPort": "80"}
    )
    with pytest.raises(ValueError) as e:
        read(opts)
    assert str(e.value) == message


def test_an_unknown_name_gets_a_did_you_mean() -> None:
    with pytest.raises(ValueError) as e:
        check_names(["handlr", "path"], ("path", "handler", "periodMs"), "the cloudprofiler sink")
    assert str(e.value) == (
        "unknown option for the cloudprofiler sink: 'handlr', did you mean 'handler'? "
        "(names as Spark passes them, lower-cased; valid: path, handler, periodMs)"
    )
    check_names(["PATH", "periodms"], ("path", "handler", "periodMs"), "the cloudprofiler sink")


def _lowered_option_maps(path: Path) -> list[int]:
    """Lines of ``{k.lower(): v for k, v in m.items()}``: an option map lower-cased by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.DictComp):
            continue
        key, source = node.key, node.generators[0].iter
        lowers = (
            isinstance(key, ast.Call) and isinstance(key.func, ast.Attribute) and key.func.attr == "lower"
        )
        items = (
            isinstance(source, ast.Call)
            and isinstance(source.func, ast.Attribute)
            and source.func.attr == "items"
        )
        if lowers and items:
            found.append(node.lineno)
    return found


def test_option_names_are_lower_cased_in_one_place() -> None:
    by_hand = {
        f"{f.relative_to(ROOT)}:{line}"
        for pkg in PACKAGES
        for f in (ROOT / pkg).rglob("*.py")
        for line in _lowered_option_maps(f)
    }
    assert {p.split(":")[0] for p in by_hand} == {"cp_common/options.py"}, sorted(by_hand)
