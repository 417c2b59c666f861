"""Errors the command line reports as one line."""


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class TrialError(RuntimeError):
    """A maxrate trial could not be judged (the query died, or sink partitions mixed two trials)."""
