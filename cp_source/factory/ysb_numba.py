"""The numba YSB kernel: the schema-specialised row parser compiled by numba (``parser="numba"``).

The factory's default is the same function in C (``cp_source.factory._ysb``), which needs no JIT at
a worker's start; this one stays as the reference the C one is checked against and as a choice.
Importing this module imports numba and picks where numba caches the compiled code.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from numba import njit
from numba.core import config as numba_config


def _writable_dir(path: Path) -> bool:
    """``path`` exists or can be made, and a file can be created in it (numba's own test)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def numba_cache_dir(tree: Path, user: Path, fallback: Path) -> Path | None:
    """Where the compiled parser is cached when numba finds no place of its own, else None.

    numba caches beside the source (``tree``) or in the user's cache (``user``); in a read-only
    install run by a user without a writable home neither works, and every factory worker
    would compile the parser again at start (seconds). Then a private directory under the
    temp dir (``fallback``) is used.
    """
    if _writable_dir(tree) or _writable_dir(user):
        return None
    fallback.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = fallback.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None  # another user's or a shared directory: compiling is slower, not unsafe
    return fallback if _writable_dir(fallback) else None


def _use_numba_cache_dir() -> None:
    if getattr(numba_config, "CACHE_DIR", ""):
        return  # the user chose one (NUMBA_CACHE_DIR)
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"
    fallback = Path(tempfile.gettempdir()) / f"cloudprofiler-numba-{os.getuid()}"
    chosen = numba_cache_dir(Path(__file__).parent / "__pycache__", user, fallback)
    if chosen is not None:
        os.environ["NUMBA_CACHE_DIR"] = str(chosen)  # numba rereads its config from the environment
        setattr(numba_config, "CACHE_DIR", str(chosen))  # noqa: B010 - not in numba's stubs


_use_numba_cache_dir()  # before the decorators below: they pick the cache's place


@njit(cache=True, nogil=True, inline="always")
def _key_is(buf, s, ln, keys, key_off, k):
    a = key_off[k]
    if key_off[k + 1] - a != ln:
        return False
    for j in range(ln):  # noqa: SIM110 - numba compiles loops, not generator expressions
        if buf[s + j] != keys[a + j]:
            return False
    return True


# One function on purpose: helpers taking arrays cost 10-30% per row (numba refcounts them per call).
@njit(cache=True, nogil=True)
def _parse(buf, keys, key_off, max_rows, offsets, data, start, r0):
    """One pass: validate rows and append each value to its column's data row.

    Column k's values go to data[k, start[k]:] and its Arrow offsets to offsets[k, r0:]; the
    caller guarantees room for max_rows rows and len(buf) bytes per column. Returns the row
    count (and advances ``start``), or -1, leaving ``start`` as it was, when the payload needs
    the generic parser.
    """
    n = len(buf)
    nk = len(key_off) - 1
    full = (1 << nk) - 1
    pos = start.copy()
    i = 0
    row = 0
    while True:
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
            i += 1
        if i >= n:
            break
        if row >= max_rows or buf[i] != 123:  # '{'
            return -1
        i += 1
        seen = 0
        field = 0
        while True:
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n or buf[i] != 34:  # '"'
                return -1
            i += 1
            ks = i
            k = -1
            # keys usually come in schema order: match the expected one in place, without a scan
            if field < nk:
                a = key_off[field]
                ln = key_off[field + 1] - a
                if ks + ln < n and buf[ks + ln] == 34:
                    k = field
                    for j in range(ln):
                        if buf[ks + j] != keys[a + j]:
                            k = -1
                            break
            if k >= 0:
                i = ks + ln
            else:
                while i < n and buf[i] != 34:
                    c = buf[i]
                    if c == 92 or c < 32 or c >= 128:
                        return -1
                    i += 1
                if i >= n:
                    return -1
                for kk in range(nk):
                    if _key_is(buf, ks, i - ks, keys, key_off, kk):
                        k = kk
                        break
            if k < 0 or (seen >> k) & 1:
                return -1
            i += 1
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n or buf[i] != 58:  # ':'
                return -1
            i += 1
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n or buf[i] != 34:
                return -1
            i += 1
            p = pos[k]
            offsets[k, r0 + row] = p
            while i < n:
                c = buf[i]
                if c == 34:
                    break
                if c == 92 or c < 32 or c >= 128:
                    return -1
                data[k, p] = c
                p += 1
                i += 1
            if i >= n:
                return -1
            pos[k] = p
            seen |= 1 << k
            field += 1
            i += 1
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n:
                return -1
            if buf[i] == 44:  # ','
                i += 1
                continue
            if buf[i] == 125:  # '}'
                i += 1
                break
            return -1
        if seen != full:
            return -1
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
            i += 1
        if i < n and buf[i] != 10:
            return -1
        row += 1
    for k in range(nk):
        offsets[k, r0 + row] = pos[k]
        start[k] = pos[k]
    return row
