"""cp_common: the ground floor every package may import (it imports none of them).

``options``: the one toolkit that reads a data source's or a command's options (names
lower-cased once; ints with bounds, seconds, durations, choices, paths and URIs, flags) and
refuses a bad one in one line naming the option and the value, with a "did you mean".
"""

from __future__ import annotations

from cp_common.options import (
    MAX_DURATION_MS,
    Options,
    canonical,
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
    raw_option,
    seconds_option,
    suggestion,
    unknown_options_error,
)

__all__ = [
    "MAX_DURATION_MS",
    "Options",
    "canonical",
    "check_names",
    "choice_option",
    "duration_ms",
    "flag_option",
    "given",
    "int_option",
    "lower_keys",
    "lower_names",
    "path_option",
    "port_option",
    "raw_option",
    "seconds_option",
    "suggestion",
    "unknown_options_error",
]
