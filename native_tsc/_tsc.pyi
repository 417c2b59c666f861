"""Type stub for the C extension native_tsc._tsc."""

BACKEND: str

def now() -> int:
    """The TSC, virtual transform applied."""

def now_cpu() -> tuple[int, int]:
    """The TSC and the CPU id from rdtscp's aux value."""

def raw() -> int:
    """The TSC with no virtual transform."""

def clock_pair() -> tuple[int, int, int]:
    """(TSC, CLOCK_MONOTONIC_RAW ns, gap in cycles) read back to back."""

def transform(value: int) -> int:
    """Apply this process's virtual transform to a raw reading."""

def set_transform(skew_e12: int, offset: int) -> None:
    """Virtual domain: offset + t + floor(t * skew_e12 / 1e12)."""

def clear_transform() -> None:
    """Remove the virtual transform."""

def cpuid_invariant() -> bool:
    """CPUID 0x80000007 EDX bit 8."""

def cpuid_hz() -> int:
    """TSC frequency from CPUID 0x15, 0 when the CPU does not give it."""
