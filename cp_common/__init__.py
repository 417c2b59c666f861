"""cp_common: the ground floor every package may import (it imports none of them).

What every package shares and none owns; none of it is the clock (``native_tsc``).

``options``: the one toolkit that reads a data source's or a command's options (names
lower-cased once; ints with bounds, seconds, durations, choices, paths and URIs, flags) and
refuses a bad one in one line naming the option and the value, with a "did you mean".
``printable``: what a message may show (a URI without its credentials, an exception's first
line). ``faces``: the lazy public faces of the packages and the old import paths that warn.
``stamp_columns``: the names of the stamp columns. ``zmq_bounds``: the capped read of a ZeroMQ
message every server uses. ``curve_keys``: CurveZMQ keys for every server and client
(``cloudprofiler keys``). ``process_times``: a process's start and CPU seconds and the start-up
trace. ``self_cost``: the profiler's own CPU per query. ``console``, ``cli_options``: the
commands' rich console and the options they hand on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cp_common.faces import lazy_face

if TYPE_CHECKING:
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
    from cp_common.printable import first_line, redact, scrub

__all__ = [
    "MAX_DURATION_MS",
    "Options",
    "canonical",
    "check_names",
    "choice_option",
    "duration_ms",
    "first_line",
    "flag_option",
    "given",
    "int_option",
    "lower_keys",
    "lower_names",
    "path_option",
    "port_option",
    "raw_option",
    "redact",
    "scrub",
    "seconds_option",
    "suggestion",
    "unknown_options_error",
]
# name -> the module defining it, imported on first use: importing the clock (which takes
# ``faces`` from here) does not pay for the options toolkit
_FACE = {
    name: "cp_common.printable" if name in ("first_line", "redact", "scrub") else "cp_common.options"
    for name in __all__
}
__getattr__, __dir__ = lazy_face(__name__, _FACE)
