"""Cross-node time: C-timed MinRTT probes against a pure-Python probe loop, translation throughput, and
the error bounds of this method beside return-trip and NTP, all in one run.

Run: python benchmarks/sync.py [--json benchmarks/results/sync.json]
Responders run in their own processes (as on another node), so a round trip is
two processes on loopback. Ratios are what count on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa
from bench_common import arg_parser, make_table, print_goals, result_head, write_json
from rich.console import Console

import native_tsc
from cp_sync import probe, probe_python
from cp_sync.coordinator import Coordinator, run_phase
from cp_sync.ntp import ntp_bound
from cp_sync.returntrip import probe_returntrip
from cp_sync.sync_table import read_sync
from cp_sync.synthetic import DOMAINS, synth_phases, synth_probes
from cp_sync.translate import METHODS, Translator
from native_tsc.domain import VirtualDomain, make_virtual

_RESPONDER = """
import sys
from cp_sync.{mod} import Responder
r = Responder({kw}).start()
print(r.address[1], flush=True)
sys.stdin.read()
r.close()
"""


def _responder(kind: str) -> tuple[subprocess.Popen, int]:
    mod, kw = {
        "c": ("probe", "spin_us=0"),
        "c-spin": ("probe", "spin_us=2000"),
        "py": ("probe_python", ""),
    }[kind]
    p = subprocess.Popen(
        [sys.executable, "-c", _RESPONDER.format(mod=mod, kw=kw)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def _stop(p: subprocess.Popen) -> None:
    assert p.stdin is not None
    p.stdin.close()
    p.wait(10)


def probe_rtts(n: int, hz: float) -> dict[str, dict[str, float]]:
    """Round trips (us) of n probes per variant against a responder process."""
    out = {}
    for label, kind, loops in (
        ("C initiator + C responder (blocking)", "c", probe),
        ("C initiator + C responder (spins 2 ms after each answer)", "c-spin", probe),
        ("Python loop + Python responder", "py", probe_python),
    ):
        p, port = _responder(kind)
        try:
            loops.initiate("127.0.0.1", port, n, gap_us=20)  # warm-up
            rtt = loops.initiate("127.0.0.1", port, n, gap_us=20).rtt / hz * 1e6
        finally:
            _stop(p)
        out[label] = {
            "probes": len(rtt),
            "min_us": float(rtt.min()),
            "p50_us": float(np.median(rtt)),
            "p99_us": float(np.percentile(rtt, 99)),
        }
    return out


def translation_rate(n: int) -> dict[str, float]:
    """Records/s per method on one core: synthetic probes between four virtual domains, mixed scenarios."""
    rng = np.random.default_rng(1)
    t0 = 10**13
    table = synth_probes(DOMAINS, {"before": t0, "after": t0 + 2_600_000_000}, 100, rng)
    names = pa.array([d.domain for d in DOMAINS])
    ds = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 4, n).astype(np.int32)), names)
    de = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 4, n).astype(np.int32)), names)
    ys = t0 + rng.integers(0, 2_600_000_000, n)
    ye = ys + rng.integers(0, 10**6, n)
    tr = Translator(table, DOMAINS[0].domain)
    tr.translate(ys[:1000], ds[:1000], ye[:1000], de[:1000])  # compile and fit outside the timing
    rates = {}
    for m in METHODS:
        best = min(_cpu_timed(partial(tr.translate, ys, ds, ye, de, (m,))) for _ in range(5))
        rates[m] = n / best
    return rates


def translation_rate_phases(n: int, phases: tuple[int, ...] = (2, 10, 60)) -> dict[str, dict[str, float]]:
    """Records/s per method on one core with many sync phases (a periodic sync over one minute).

    Four virtual domains, every ordered pair probed 20 times per phase, records spread over the whole
    run with mixed scenarios, in time order as the sink writes them (``minrtt_shuffled``: the same
    records in random order, the worst case for finding each stamp's span). ``fit_s``: the time to
    fit every relation once (exact hulls, drift checks).
    """
    rng = np.random.default_rng(2)
    t0, span = 10**13, 60 * 2_600_000_000
    out: dict[str, dict[str, float]] = {}
    for p in phases:
        table = synth_phases(DOMAINS, [t0 + span * k // (p - 1) for k in range(p)], 20, rng)
        names = pa.array([d.domain for d in DOMAINS])
        codes = [pa.array(rng.integers(0, 4, n).astype(np.int32)) for _ in range(2)]
        ds, de = (pa.DictionaryArray.from_arrays(c, names) for c in codes)
        raw = np.sort(t0 + 10_000_000 + rng.integers(0, span - 20_000_000, n))
        ys = _stamps(raw, codes[0].to_numpy())
        ye = _stamps(raw + rng.integers(0, 10**6, n), codes[1].to_numpy())
        tr = Translator(table, DOMAINS[0].domain)
        fit = _timed(partial(tr.translate, ys[:1000], ds[:1000], ye[:1000], de[:1000]))
        rates: dict[str, float] = {"fit_s": fit}
        for m in METHODS:
            rates[m] = n / min(_cpu_timed(partial(tr.translate, ys, ds, ye, de, (m,))) for _ in range(5))
        perm = pa.array(rng.permutation(n))
        shuffled = (ys[perm.to_numpy()], ds.take(perm), ye[perm.to_numpy()], de.take(perm), ("minrtt",))
        rates["minrtt_shuffled"] = n / min(_cpu_timed(partial(tr.translate, *shuffled)) for _ in range(3))
        out[str(p)] = rates
    return out


def _stamps(raw: np.ndarray, dom: np.ndarray) -> np.ndarray:
    """Each raw instant read in DOMAINS[dom] (exact integer arithmetic, vectorised over domains)."""
    out = np.empty(len(raw), np.int64)
    for k, v in enumerate(DOMAINS):
        sel = dom == k
        r = raw[sel]
        # offset + r + floor(r * skew / 1e12), split so the product stays in int64
        hi, lo = np.divmod(r, 1_000_000)
        s = v.skew_e12
        out[sel] = (
            v.offset + r + (hi * s) // 1_000_000 + ((hi * s) % 1_000_000 * 1_000_000 + lo * s) // 10**12
        )
    return out


def _cpu_timed(fn: Callable[[], object]) -> float:
    """CPU seconds of this process (the machine is shared: wall time counts other jobs)."""
    t = time.process_time()
    fn()
    return time.process_time() - t


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _agent_phases(virt: list[VirtualDomain], rounds: int, gap_s: float) -> tuple[pa.Table, np.ndarray]:
    """Both sync phases, ``gap_s`` apart, with one agent process under each virtual domain.

    Returns the probes and the raw TSC reads taken between the phases (every ms or so),
    from which the records are made up: their true durations are known.
    """
    with tempfile.TemporaryDirectory() as tmp, Coordinator("127.0.0.1:0") as coord:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "cloudprofiler.cli", "sync", "agent", "--server", coord.address],
                env=dict(os.environ, CP_TSC_VIRTUAL=v.spec()),
                stdout=subprocess.DEVNULL,
            )
            for v in virt
        ]
        try:
            run_phase(coord.address, "before", rounds, tmp, expect=3, wait_s=60)
            raw = native_tsc.clock.raw
            reads = []
            end = time.monotonic() + gap_s
            while time.monotonic() < end:
                reads.append(raw())
                time.sleep(0.001)
            run_phase(coord.address, "after", rounds, tmp, expect=3)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
        table, _ = read_sync(tmp)
    return table, np.array(reads, dtype=np.int64)


def bounds_side_by_side(rounds: int, gap_s: float) -> dict:
    """Three agent processes under virtual domains: this method's bounds, return-trip's and NTP's (us)."""
    virt = [
        make_virtual("bench-a", "35", 10**13),
        make_virtual("bench-b", "-120", -(10**13)),
        make_virtual("bench-c", "240", 5 * 10**14),
    ]
    hz = native_tsc.clock.real_hz()
    table, raws = _agent_phases(virt, rounds, gap_s)
    rng = np.random.default_rng(0)
    n = 20_000
    a = rng.integers(0, len(raws), n)
    b = np.minimum(a + rng.integers(0, 5, n), len(raws) - 1)  # latencies up to a few ms
    si, ei = rng.integers(0, 3, n), rng.integers(0, 3, n)
    ys = np.array([virt[d].apply(int(raws[i])) for d, i in zip(si, a, strict=True)], dtype=np.int64)
    ye = np.array([virt[d].apply(int(raws[i])) for d, i in zip(ei, b, strict=True)], dtype=np.int64)
    ref = virt[0]
    truth = np.array([ref.apply(int(raws[j])) - ref.apply(int(raws[i])) for i, j in zip(a, b, strict=True)])
    names = np.array([v.domain for v in virt])
    tr = Translator(table, ref.domain)
    res: dict[str, dict] = {}
    scen_names = {1: "same-node", 2: "reference-node", 3: "two-nodes"}
    for t in tr.translate(ys, names[si], ye, names[ei]):
        err = np.abs(t.duration - truth[t.index])
        for code, name in scen_names.items():
            m = t.scenario == code
            res.setdefault(name, {})[t.method] = {
                "bound_median_us": float(np.median(t.bound[m]) / hz * 1e6),
                "bound_max_us": float(t.bound[m].max() / hz * 1e6),
                "err_max_us": float(err[m].max() / hz * 1e6),
                "holds": bool(np.all(err[m] <= t.bound[m])),
            }
    rt_est, rt_bound = probe_returntrip(table, ref.domain, virt[1].domain)
    del rt_est
    half_min = {
        k: min(v for v in (r.e_before, r.e_after)) / hz * 1e6
        for k, r in ((d.domain, tr.relation(d.domain, ref.domain, "minrtt")) for d in virt[1:])
    }
    nb, why = ntp_bound()
    return {
        "scenarios": res,
        "returntrip_median_us": float(np.median(rt_bound) / hz * 1e6),
        "returntrip_max_us": float(rt_bound.max() / hz * 1e6),
        "e_us": half_min,
        "ntp_us": None if nb is None else nb.bound_s * 1e6 * 2,
        "ntp_note": why,
    }


# The goals use the responder as `sync agent` runs it (spinning after each answer, the
# default); the blocking responder's ratio is printed beside it.
C_KEY = "C initiator + C responder (spins 2 ms after each answer)"
BLOCKING_KEY = "C initiator + C responder (blocking)"
PY_KEY = "Python loop + Python responder"
SCENARIOS = ("same-node", "reference-node", "two-nodes")


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "sync")
    ap.add_argument("--probes", type=int, default=5000)
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=100)
    return ap.parse_args()


def report_probes(console: Console, rtts: dict[str, dict[str, float]], probes: int) -> dict[str, float]:
    """Print the round-trip table and the Python / C ratios; return the ratios."""
    title = f"Loopback MinRTT probes, {probes} per variant, responder in another process (us)"
    cells = [(k, f"{v['min_us']:.2f}", f"{v['p50_us']:.2f}", f"{v['p99_us']:.2f}") for k, v in rtts.items()]
    console.print(make_table(title, ("probe loop", "min", "p50", "p99"), cells))
    ratios = {
        "python_over_c_min": rtts[PY_KEY]["min_us"] / rtts[C_KEY]["min_us"],
        "python_over_c_p50": rtts[PY_KEY]["p50_us"] / rtts[C_KEY]["p50_us"],
        "python_over_c_blocking_min": rtts[PY_KEY]["min_us"] / rtts[BLOCKING_KEY]["min_us"],
    }
    print(
        f"Python / C MinRTT (agent's default responder): {ratios['python_over_c_min']:.2f}x; "
        f"median: {ratios['python_over_c_p50']:.2f}x; "
        f"against the blocking responder: {ratios['python_over_c_blocking_min']:.2f}x"
    )
    return ratios


def report_translation(console: Console, rates: dict[str, float], records: int) -> None:
    title = f"Translation, {records:,} records, mixed scenarios, one core"
    cells = [(m, f"{r / 1e6:.1f}") for m, r in rates.items()]
    console.print(make_table(title, ("method", "M records/s"), cells))


def report_phases(console: Console, rates: dict[str, dict[str, float]], records: int) -> None:
    title = f"Translation with many sync phases, {records:,} records over 60 s, mixed scenarios, one core"
    keys = (*METHODS, "minrtt_shuffled")
    cells = [(p, f"{r['fit_s']:.2f}", *(f"{r[m] / 1e6:.1f}" for m in keys)) for p, r in rates.items()]
    console.print(make_table(title, ("phases", "fit s", *(f"{m} M/s" for m in keys)), cells))


def report_bounds(console: Console, b: dict) -> None:
    """Print this method's bounds per scenario beside return-trip's and NTP's, then the e per node."""
    sc = b["scenarios"]
    cells = [
        (
            f"{m} (median)",
            *(f"{sc[s][m]['bound_median_us']:.2f}" for s in SCENARIOS),
            str(all(sc[s][m]["holds"] for s in sc)),
        )
        for m in METHODS
    ]
    cells.append(("return-trip (median RTT/2)", "-", f"{b['returntrip_median_us']:.2f}", "-", "-"))
    ntp = "skipped" if b["ntp_us"] is None else f"{b['ntp_us']:.1f}"
    cells.append(("NTP (chrony, both ends)", ntp, ntp, ntp, "-"))
    title = "Error bounds on the same run (3 virtual domains on loopback, phases 1 s apart, us)"
    columns = ("method", "same node", "reference <-> node", "two nodes", "all hold")
    console.print(make_table(title, columns, cells))
    print(b["ntp_note"] if b["ntp_us"] is None else f"NTP from {b['ntp_note']}")
    print("e (half MinRTT) per node: " + ", ".join(f"{k} {v:.2f} us" for k, v in b["e_us"].items()))


def check_goals(
    rtts: dict, ratio_min: float, rates: dict[str, float], b: dict, phased: dict[str, dict[str, float]]
) -> dict[str, bool]:
    sc = b["scenarios"]
    most = max(phased, key=int)
    return {
        "MinRTT <= 15 us with probes timed in C": rtts[C_KEY]["min_us"] <= 15.0,
        "C MinRTT well below the Python loop's (>= 2x)": ratio_min >= 2.0,
        ">= 20 M records/s per core (minrtt)": rates["minrtt"] >= 20e6,
        f">= 20 M records/s per core with {most} phases (minrtt)": phased[most]["minrtt"] >= 20e6,
        "every bound holds against the truth": all(v["holds"] for s in sc.values() for v in s.values()),
    }


def main() -> None:
    args = parse_args()
    hz = native_tsc.clock.real_hz()
    console = Console(width=120)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    rtts = probe_rtts(args.probes, hz)
    ratios = report_probes(console, rtts, args.probes)
    rates = translation_rate(args.records)
    report_translation(console, rates, args.records)
    phased = translation_rate_phases(args.records)
    report_phases(console, phased, args.records)
    b = bounds_side_by_side(args.rounds, 1.0)
    report_bounds(console, b)

    goals = check_goals(rtts, ratios["python_over_c_min"], rates, b, phased)
    print_goals(goals)
    out = {
        **result_head("sync"),
        "cpu_hz": hz,
        "load": os.getloadavg()[0],
        "probes": rtts,
        **ratios,
        "translation_records_per_s": rates,
        "translation_records_per_s_by_phases": phased,
        "bounds": b,
        "goals": goals,
    }
    write_json(args.json, out)


if __name__ == "__main__":
    main()
