"""What a message may show: a URI without its credentials, and an exception's first line.

Every error, log line and printed result that names a place (a path or a URI: ``s3://``,
``hdfs://``, ...) names it through :func:`redact`, and an error quoting a store library's message
about a URI takes the URI's user info out of it with :func:`scrub`. :func:`first_line` keeps a
long message (pyarrow's S3 errors run over several lines) to the line that says what failed.
:func:`format_duration` is how every table and line prints a duration.
"""

from __future__ import annotations

import math
import re
from urllib.parse import unquote

_SECRET_QUERY = re.compile(r"(secret|token|key|password|credential|sas|sig)", re.IGNORECASE)
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_HOST_PORT = re.compile(r"[A-Za-z0-9._-]*:[0-9]*")
_PORTED = ("hdfs", "viewfs", "abfs", "abfss", "file", "local")  # stores whose hosts have ports (not s3, gs)
_HOST_AFTER_AT = re.compile(r"@(?=[A-Za-z0-9._-]*(?::[0-9]*)?(?:[/?#]|$))")


def is_uri(text: str) -> bool:
    """True for ``scheme://...``; False for a plain or a Windows path (``C:\\dir``)."""
    return "://" in text and not _WINDOWS_DRIVE.match(text)


def redact(uri: str) -> str:
    """``uri`` without user info or secret-looking query values: safe for logs and errors.

    The user info is cut before anything parses the URI, since a secret may hold ``/``, ``?``,
    ``#``, ``@`` or ``[`` unencoded (AWS secret keys often hold ``/``): see :func:`_userinfo_end`
    for the rule. Never raises; a plain or Windows path comes back as it is.
    """
    if not is_uri(uri):
        return uri
    scheme, rest = uri.split("://", 1)
    rest = rest[_userinfo_end(scheme, rest) :]
    rest, hashmark, fragment = rest.partition("#")
    rest, mark, query = rest.partition("?")
    pairs = [p.partition("=") for p in query.split("&")] if mark else []
    query = "&".join(k + eq + ("***" if eq and _SECRET_QUERY.search(k) else v) for k, eq, v in pairs)
    return f"{scheme}://{rest}{mark}{query}{hashmark}{fragment}"


def scrub(text: str, raw: str) -> str:
    """``text`` (a store library's message about ``raw``) with ``raw``'s user info taken out,
    as written and percent-decoded: pyarrow quotes the URI it was given in its errors."""
    if not is_uri(raw):
        return text
    info = userinfo(raw)
    secrets = {info, unquote(info), info.partition(":")[2], unquote(info.partition(":")[2])}
    for s in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def userinfo(raw: str) -> str:
    """The user info of ``raw`` as written (``KEY:SECRET``), "" if none."""
    if not is_uri(raw):
        return ""
    scheme, rest = raw.split("://", 1)
    return rest[: max(_userinfo_end(scheme, rest) - 1, 0)]


def _userinfo_end(scheme: str, rest: str) -> int:
    """Where the host starts in ``rest`` (a URI after ``scheme://``): 0 if it has no user info.

    User info ends at an ``@`` followed by a host name (letters, digits, ``.``, ``_``, ``-``,
    an optional ``:port``) and then ``/``, ``?``, ``#`` or the end. If the text before the first
    ``/``, ``?`` or ``#`` holds an ``@`` or a ``:`` (``KEY:SECRET`` with a secret holding an
    unencoded ``/``), the LAST such ``@`` in the whole URI ends it: a secret can never show
    through, at the price of cutting up to an ``@`` in an object key after such credentials
    (``s3://K:S/X@bucket/a@b`` prints as ``s3://b``). Otherwise (``s3://bucket/key@x``, or
    ``hdfs://host:8020/key@x`` on a store whose hosts have ports) there is no user info and the
    key is left alone.
    """
    first = re.search(r"[/?#]", rest)
    head = rest[: first.start()] if first else rest
    if "@" not in head and (":" not in head or _HOST_PORT.fullmatch(head) and scheme.lower() in _PORTED):
        return 0
    ends = [m.start() + 1 for m in _HOST_AFTER_AT.finditer(rest)]
    return ends[-1] if ends else 0


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (pyarrow's S3 errors run over several)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))  # a duration's units, largest first
NEGLIGIBLE_NS = 1.0  # below a nanosecond (a TSC cycle): one TSC domain's bound, drawn as 0, printed "<1 ns"


def format_duration(ns: float) -> str:
    """A duration given in nanoseconds, as every table and line prints one: 3 significant digits in the
    unit that suits its size (ns, us, ms or s), so six seconds read "6.23 s", not "6,234,567.891 us";
    "n/a" for NaN, and below a nanosecond (under a TSC cycle: a rounding margin) "<1 ns". Machine-readable
    outputs keep the exact number."""
    if not math.isfinite(ns):
        return "n/a"
    if ns == 0:
        return "0 ns"
    if abs(ns) < NEGLIGIBLE_NS:
        return "<1 ns" if ns > 0 else ">-1 ns"
    r = float(f"{ns:.3g}")  # rounded first, so 999.7 us reads 1.00 ms, not 1,000 us
    unit, per = next(((u, n) for u, n in UNITS if abs(r) >= n), ("ns", 1.0))
    v = r / per
    decimals = max(0, 2 - math.floor(math.log10(abs(v))))
    return f"{v:,.{decimals}f} {unit}"
