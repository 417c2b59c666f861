"""The probe API shared by the C-timed loops (``native``) and their twin ``python_twin``.

Both speak one wire format and return one result type, so a caller (the
agent, the benchmark, a test) picks an implementation by module and nothing
else changes. The Protocols are checked by mypy and at run time for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


def initiator_address(host: str, bind: str | None) -> tuple[str, int]:
    """Where an initiator's socket binds: ``bind``, else the loopback address for a responder on
    loopback and any address otherwise; port 0, a free one."""
    return (bind or ("127.0.0.1" if host.startswith("127.") else "0.0.0.0"), 0)


@dataclass(frozen=True)
class ProbeResult:
    """Answered probes of one initiator -> responder run (int64 arrays, one entry per probe).

    c_i and c_k are the initiator's send and return stamps in its own domain, c_j the responder's
    receipt stamp in the responder's domain, ns_i the initiator's CLOCK_MONOTONIC_RAW ns at send.
    """

    seq: np.ndarray
    c_i: np.ndarray
    c_j: np.ndarray
    c_k: np.ndarray
    ns_i: np.ndarray
    lost: int
    ignored: int

    @property
    def rtt(self) -> np.ndarray:
        """Round trips in initiator cycles."""
        return self.c_k - self.c_i

    @staticmethod
    def from_rows(rows: np.ndarray, lost: int, ignored: int) -> ProbeResult:
        """From an int64 array of rows [seq, c_i, c_j, c_k, ns_i]."""
        r = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
        seq, c_i, c_j, c_k, ns_i = (r[:, k].copy() for k in range(5))
        return ProbeResult(seq, c_i, c_j, c_k, ns_i, int(lost), int(ignored))


@runtime_checkable
class ProbeResponder(Protocol):
    """Answers probes on a UDP socket from a background thread between ``start()`` and ``close()``.

    ``served`` counts answers, ``ignored`` malformed datagrams, ``refused`` requests from a source not
    on the allow-list or without a valid tag when keyed.
    """

    served: int
    ignored: int
    refused: int

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the responder listens on."""
        ...

    def start(self) -> ProbeResponder:
        """Start answering; returns the responder."""
        ...

    def set_allowed(self, hosts: Iterable[str] | None) -> None:
        """Answer only these IPv4 sources from now on (None: any)."""
        ...

    def set_key(self, key: bytes | None) -> None:
        """Answer only probes tagged with this 16-byte key from now on (None: unkeyed probes)."""
        ...

    def close(self) -> None:
        """Stop answering and release the socket."""
        ...

    def __enter__(self) -> ProbeResponder: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class ProbeLoops(Protocol):
    """A probe implementation (a module): its label, its responder and its initiator."""

    LABEL: str  # how results are labelled: "c" or "python"

    # Capitalised because each module provides it as a class; a class is a callable returning a responder.
    def Responder(
        self, bind: str = ..., port: int = ..., *, allow: Iterable[str] | None = ..., key: bytes | None = ...
    ) -> ProbeResponder:
        """A responder bound to bind:port (0: any free port), not yet started.

        ``allow``: the IPv4 sources it answers (None: any); ``key``: 16 bytes for keyed probes.
        """
        ...

    def initiate(
        self,
        host: str,
        port: int,
        count: int,
        timeout_ms: int = ...,
        gap_us: int = ...,
        spin: bool = ...,
        bind: str | None = ...,
        key: bytes | None = ...,
    ) -> ProbeResult:
        """Send ``count`` probes to the responder at host:port and return the answered ones.

        ``key``: 16 bytes to send keyed probes; a reply without a valid tag is ignored.
        """
        ...
