"""The methods the paper compares against: return-trip (validated against the truth) and NTP via chrony."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from cp_sync.compare.ntp import ntp_bound, parse_tracking
from cp_sync.compare.returntrip import probe_returntrip
from cp_sync.compare.synthetic import DOMAINS, invert, synth_probes

T0 = 10**13
CHRONY = """Reference ID    : A9FEA97B (169.254.169.123)
Stratum         : 4
Ref time (UTC)  : Sat Nov 21 06:00:00 2026
System time     : 0.000012500 seconds slow of NTP time
Last offset     : -0.000003100 seconds
RMS offset      : 0.000010000 seconds
Frequency       : 3.100 ppm fast
Residual freq   : -0.001 ppm
Skew            : 0.020 ppm
Root delay      : 0.000400000 seconds
Root dispersion : 0.000150000 seconds
Update interval : 16.0 seconds
Leap status     : Normal
"""


def test_returntrip_holds_and_is_wider_than_minrtt() -> None:
    rng = np.random.default_rng(9)
    a, b = DOMAINS[0], DOMAINS[1]
    table = synth_probes([a, b], {"before": T0, "after": T0 + 2_600_000_000}, 200, rng)
    est, bound = probe_returntrip(table, a.domain, b.domain)
    # Truth: the forward trip in a's cycles, from the raw instant b stamped (b's transform inverted).
    mask = pc.and_(pc.equal(table["initiator"], a.domain), pc.equal(table["responder"], b.domain))
    own = table.filter(mask)
    c_i = own["c_i"].to_numpy()
    raw_j = np.array([invert(b, int(v)) for v in own["c_j"].to_numpy()])
    truth = np.array([a.apply(int(r)) for r in raw_j]) - c_i
    assert np.all(np.abs(est - truth) <= bound)
    # Its bound is each event's whole round trip / 2: never below the MinRTT method's e.
    rtt = own["c_k"].to_numpy() - c_i
    phase = np.array(own["phase"].to_pylist())
    e = min(rtt[phase == p].min() / 2 for p in ("before", "after"))
    assert np.median(bound) > e
    assert bound.min() >= e


def test_chrony_tracking_bound() -> None:
    nb = parse_tracking(CHRONY)
    assert nb.offset_s == pytest.approx(-12.5e-6)
    assert nb.bound_s == pytest.approx(12.5e-6 + 150e-6 + 200e-6)
    with pytest.raises(ValueError, match="Root delay"):
        parse_tracking(CHRONY.replace("Root delay", "Root something"))


def _fake_chronyc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, status: int) -> None:
    """A ``chronyc`` first on PATH that prints ``output`` and exits with ``status``."""
    (tmp_path / "tracking.txt").write_text(output)
    exe = tmp_path / "chronyc"
    exe.write_text(f"#!/bin/sh\ncat '{tmp_path / 'tracking.txt'}'\nexit {status}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")


def test_ntp_bound_from_chronyc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_chronyc(tmp_path, monkeypatch, CHRONY, 0)
    nb, why = ntp_bound()
    assert why == "chronyc tracking"
    assert nb is not None and nb.bound_s == pytest.approx(362.5e-6)


def test_ntp_refusals_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_chronyc(tmp_path, monkeypatch, "506 Cannot talk to daemon\n", 1)
    nb, why = ntp_bound()
    assert nb is None and why == "NTP comparison skipped: chronyd is not running (506 Cannot talk to daemon)"
    _fake_chronyc(tmp_path, monkeypatch, CHRONY.replace("0.000150000", "-0.000150000"), 0)
    nb, why = ntp_bound()
    assert nb is None and "bound nothing" in why
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert ntp_bound() == (None, "NTP comparison skipped: chronyc is not installed (no chronyd on this node)")


def test_ntp_on_this_node() -> None:
    nb, why = ntp_bound()
    if nb is None:
        pytest.skip(why)
    # chronyd runs here: its bound is a real, finite positive figure that covers the offset it reports.
    assert why == "chronyc tracking"
    assert 0 < nb.bound_s < 10 and math.isfinite(nb.bound_s)
    assert nb.bound_s >= abs(nb.offset_s) + nb.root_delay_s / 2
