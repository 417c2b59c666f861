"""Type stub for the C extension native_tsc._probe (MinRTT probe loops timed in C)."""

PACKET_SIZE: int
KEYED_PACKET_SIZE: int
KEY_SIZE: int
MAX_ALLOW: int
MAX_PROBES: int
ROW_FIELDS: int

def respond(
    fd: int,
    stop_fd: int,
    timeout_ms: int,
    max_packets: int,
    virtual_on: bool,
    skew_e12: int,
    offset: int,
    spin_us: int = 0,
    allow: bytes | None = None,
    key: bytes | None = None,
) -> tuple[int, int, int, int]:
    """Answer probes on a bound UDP socket until stop_fd is readable (reason 0), no packet came for
    timeout_ms (1, -1 waits forever) or max_packets were answered (2); after each answer busy-poll for
    spin_us. allow: packed IPv4 sources (4 bytes each, network order) to answer, None for any; key: 16
    bytes to answer only keyed probes with a valid tag. Returns (served, ignored, refused, reason)."""

def initiate(
    fd: int,
    host: str,
    port: int,
    count: int,
    probe_id: int,
    timeout_ms: int,
    gap_us: int,
    spin: bool,
    key: bytes | None = None,
) -> tuple[bytes, int, int]:
    """Send count probes to host:port (keyed with a 16-byte key); returns (rows, lost, ignored) where rows
    holds int64 [seq, c_i raw, c_j (responder domain), c_k raw, CLOCK_MONOTONIC_RAW ns before c_i]."""

def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of data under a 16-byte key (the keyed probes' tag)."""

def transform(raw: int, virtual_on: bool, skew_e12: int, offset: int) -> int:
    """The responder's stamp transform (identical to native_tsc._tsc's)."""
