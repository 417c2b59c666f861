"""Type stub for the C extension native_tsc._probe (MinRTT probe loops timed in C)."""

PACKET_SIZE: int
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
) -> tuple[int, int, int]:
    """Answer probes on a bound UDP socket until stop_fd is readable (reason 0), no packet came for
    timeout_ms (1, -1 waits forever) or max_packets were answered (2); after each answer busy-poll for
    spin_us. Returns (served, ignored, reason)."""

def initiate(
    fd: int, host: str, port: int, count: int, probe_id: int, timeout_ms: int, gap_us: int, spin: bool
) -> tuple[bytes, int, int]:
    """Send count probes to host:port; returns (rows, lost, ignored) where rows holds int64
    [seq, c_i raw, c_j (responder domain), c_k raw, CLOCK_MONOTONIC_RAW ns before c_i] per answer."""

def transform(raw: int, virtual_on: bool, skew_e12: int, offset: int) -> int:
    """The responder's stamp transform (identical to native_tsc._tsc's)."""
