"""TSC domain identity: which counter a stamp was taken on.

A TSC restarts at boot, so one domain is one host and one boot. Virtual
domains (a known affine transform of the real counter under another id)
let one machine stand in for several nodes in tests and simulations.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from cp_common.faces import deprecated_names

ENV_VIRTUAL = "CP_TSC_VIRTUAL"
_ID_RE = re.compile(r"^[A-Za-z0-9._@+\-]{1,64}$")
_E12 = 10**12


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip().replace("-", "")
    except OSError:
        return "noboot00"


def host_domain_id() -> str:
    """Stable id of this host's TSC for this boot, e.g. ``node3@1f2e3d4c``."""
    host = re.sub(r"[^A-Za-z0-9.\-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}@{_boot_id()[:8]}"


def check_domain_id(domain: str) -> str:
    """Return ``domain`` if it is a valid id, else raise ValueError naming the problem."""
    if not isinstance(domain, str) or not _ID_RE.match(domain):
        raise ValueError(f"invalid TSC domain id {domain!r}: use 1-64 characters from A-Z a-z 0-9 . _ @ + -")
    return domain


@dataclass(frozen=True)
class VirtualDomain:
    """offset + (1 + skew_ppm * 1e-6) * tsc, under the id ``domain``."""

    domain: str
    skew_ppm: Decimal
    offset: int

    @property
    def skew_e12(self) -> int:
        """Skew in parts per 1e12, the integer the counter arithmetic uses."""
        return int(self.skew_ppm * 1_000_000)

    def apply(self, tsc: int) -> int:
        """The virtual reading for a raw counter value (exact integer arithmetic)."""
        return self.offset + tsc + (tsc * self.skew_e12) // _E12

    def rate(self) -> float:
        """Virtual counts per real count."""
        return 1.0 + float(self.skew_ppm) * 1e-6

    def spec(self) -> str:
        """The ``CP_TSC_VIRTUAL`` string that recreates this domain."""
        return f"{self.domain}:{self.skew_ppm}:{self.offset}"


def make_virtual(domain: str, skew_ppm: float | str | Decimal, offset: int) -> VirtualDomain:
    """Build a VirtualDomain, checking every field."""
    check_domain_id(domain)
    try:
        skew = Decimal(str(skew_ppm))
    except InvalidOperation:
        raise ValueError(f"invalid skew {skew_ppm!r}: expected a number of ppm") from None
    if not skew.is_finite():
        raise ValueError(f"invalid skew {skew_ppm!r}: must be finite")
    if skew * 1_000_000 != int(skew * 1_000_000):
        raise ValueError(f"invalid skew {skew_ppm!r}: at most 6 decimal places of ppm")
    if not -100_000 < skew < 100_000:
        raise ValueError(f"invalid skew {skew_ppm!r}: must be within +-100000 ppm")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"invalid offset {offset!r}: expected an integer cycle count")
    if not -(2**62) <= offset <= 2**62:
        raise ValueError(f"invalid offset {offset!r}: must be within +-2**62")
    return VirtualDomain(domain, skew, offset)


def parse_virtual(spec: str) -> VirtualDomain:
    """Parse ``<domain-id>:<skew-ppm>:<offset-cycles>``."""
    parts = spec.rsplit(":", 2)
    if len(parts) != 3:
        raise ValueError(f"invalid {ENV_VIRTUAL}={spec!r}: expected <domain-id>:<skew-ppm>:<offset-cycles>")
    domain, skew, offset = parts
    try:
        off = int(offset)
    except ValueError:
        raise ValueError(f"invalid {ENV_VIRTUAL}={spec!r}: offset {offset!r} is not an integer") from None
    try:
        return make_virtual(domain, skew, off)
    except ValueError as e:
        raise ValueError(f"invalid {ENV_VIRTUAL}={spec!r}: {e}") from None


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "native_tsc", ["make_virtual"])
