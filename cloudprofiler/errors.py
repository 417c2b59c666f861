"""Errors the command line reports as one line."""


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""
