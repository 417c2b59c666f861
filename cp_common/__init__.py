"""cp_common: the ground floor every package may import (it imports none of them).

``options``: the one toolkit that reads a data source's or a command's options (names
lower-cased once; ints with bounds, seconds, durations, choices, paths and URIs, flags) and
refuses a bad one in one line naming the option and the value, with a "did you mean".
"""
