"""Cross-node time: C-timed MinRTT probes against a pure-Python probe loop, translation throughput
(also over many sync phases), the error bounds of this method beside return-trip and NTP, and the
probing load of continuous sync (a coordinator and three agent processes on loopback).

Run: python benchmarks/sync.py [--only PART ...] [--every S --duration S] [--json FILE]
Responders run in their own processes (as on another node), so a round trip is
two processes on loopback. Ratios are what count on a shared 2-core machine.
With --only, the parts run are replaced in an existing result file and the others kept.
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
import orjson
import pyarrow as pa
from bench_common import (
    add_show,
    arg_parser,
    make_table,
    print_goals,
    proc_cpu_s,
    result_head,
    shown,
    write_json,
)
from rich.console import Console

import native_tsc
from cp_sync.compare.ntp import ntp_bound
from cp_sync.compare.returntrip import probe_returntrip
from cp_sync.compare.synthetic import DOMAINS, synth_phases, synth_probes
from cp_sync.nodes.coordinator import Coordinator, run_phase
from cp_sync.nodes.periodic import Schedule, run_periodic, wait_agents
from cp_sync.probe import native as probe
from cp_sync.probe import python_twin as probe_python
from cp_sync.sync_table import read_sync
from cp_sync.translate.relation import METHODS
from cp_sync.translate.translator import Translator
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
    half_min = {}
    for d in virt[1:]:
        rel = tr.relation(d.domain, ref.domain, "minrtt")
        if rel is None:
            raise RuntimeError(f"no relation {d.domain} -> {ref.domain}: {tr.violations}")
        half_min[d.domain] = min(rel.e_before, rel.e_after) / hz * 1e6
    nb, why = ntp_bound()
    return {
        "scenarios": res,
        "returntrip_median_us": float(np.median(rt_bound) / hz * 1e6),
        "returntrip_max_us": float(rt_bound.max() / hz * 1e6),
        "e_us": half_min,
        "ntp_us": None if nb is None else nb.bound_s * 1e6 * 2,
        "ntp_note": why,
    }


def continuous_overhead(every: float, duration: float, rounds: int) -> dict:
    """``sync run --every``'s probing load: a coordinator here, three agent processes on loopback.

    The figures are ``Load``'s (what the phases report). Beside them, the agents' whole-process
    CPU (probe loops, heartbeats, the interpreter idling) and this process's (the coordinator and
    the schedule), both from the moment every agent is registered to the end of the run.
    """
    virt = [make_virtual(f"cont-{k}", skew, off) for k, skew, off in (("a", "35", 10**13),
            ("b", "-120", -(10**13)), ("c", "240", 5 * 10**14))]  # fmt: skip
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
            # The agents' start-up (imports, registration) is not probing: sample once all are there.
            wait_agents(coord.address, len(virt), 60.0)
            t0, agents0, here0 = time.monotonic(), proc_cpu_s([p.pid for p in procs]), time.process_time()
            load = run_periodic(
                coord.address, tmp, Schedule(every, duration), rounds=rounds, expect=3, wait_s=60.0
            )
            span = time.monotonic() - t0
            agents_cpu = proc_cpu_s([p.pid for p in procs]) - agents0
            here_cpu = time.process_time() - here0
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    r = load.rates()
    return {
        "every_s": every,
        "duration_s": duration,
        "rounds": rounds,
        "agents": len(virt),
        "phases": load.phases,
        "failed_phases": load.failed_phases,
        "pairs": load.pairs,
        "failed_pairs": load.failed_pairs,
        "probes_sent": load.sent,
        "probes_lost": load.lost,
        "seconds": load.seconds,
        "probes_per_s": r["probes_per_s"],
        "kb_per_s": None if r["bytes_per_s"] is None else r["bytes_per_s"] / 1e3,
        "probing_share": r["busy_share"],
        "probe_loop_cpu_pct_of_core": None if r["cpu_share"] is None else r["cpu_share"] * 100,
        "agent_process_cpu_pct_of_core": agents_cpu / span * 100,
        "coordinator_process_cpu_pct_of_core": here_cpu / span * 100,
        "summary": load.summary(),
    }


# The goals use the responder as `sync agent` runs it (spinning after each answer, the
# default); the blocking responder's ratio is printed beside it.
C_KEY = "C initiator + C responder (spins 2 ms after each answer)"
BLOCKING_KEY = "C initiator + C responder (blocking)"
PY_KEY = "Python loop + Python responder"
SCENARIOS = ("same-node", "reference-node", "two-nodes")


PARTS = ("probes", "translation", "phases", "bounds", "continuous")


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "sync")
    add_show(ap)
    ap.add_argument("--probes", type=int, default=5000, help="probes per variant in the round-trip table")
    ap.add_argument("--records", type=int, default=5_000_000, help="records per translation timing")
    ap.add_argument("--rounds", type=int, default=100, help="probes per ordered pair and sync phase")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), metavar="PART",
                    help=f"run only these parts ({', '.join(PARTS)}; default all)")  # fmt: skip
    ap.add_argument("--every", type=float, default=2.0, help="continuous sync: seconds between phases")
    ap.add_argument("--duration", type=float, default=20.0, help="continuous sync: seconds to run")
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


def report_continuous(console: Console, c: dict) -> None:
    title = (
        f"Continuous sync probing load: {c['agents']} agent processes on loopback, --every {c['every_s']:g} "
        f"--duration {c['duration_s']:g}, {c['rounds']} probes per ordered pair and phase"
    )
    cells = [
        ("phases (failed)", f"{c['phases']} ({c['failed_phases']})"),
        ("pairs probed (failed)", f"{c['pairs']} ({c['failed_pairs']})"),
        ("probes sent (lost)", f"{c['probes_sent']} ({c['probes_lost']})"),
        ("probes/s", f"{c['probes_per_s']:.1f}"),
        ("kB/s on the wire (IP+UDP)", f"{c['kb_per_s']:.2f}"),
        ("share of time probing", f"{c['probing_share'] * 100:.2f}%"),
        ("agents' probe-loop CPU, % of one core", _pct(c["probe_loop_cpu_pct_of_core"])),
        ("agent processes' whole CPU, % of one core", _pct(c["agent_process_cpu_pct_of_core"])),
        ("coordinator process CPU, % of one core", _pct(c["coordinator_process_cpu_pct_of_core"])),
    ]
    console.print(make_table(title, ("figure", "value"), cells))
    print(c["summary"])


def _pct(v: float | None) -> str:
    return "not reported" if v is None else f"{v:.3f}%"


def check_goals(r: dict) -> dict[str, bool]:
    """The goals of the parts that ran (``r``: their results by part)."""
    goals: dict[str, bool] = {}
    if "probes" in r:
        goals["MinRTT <= 15 us with probes timed in C"] = r["probes"][C_KEY]["min_us"] <= 15.0
        goals["C MinRTT well below the Python loop's (>= 2x)"] = r["ratios"]["python_over_c_min"] >= 2.0
    if "translation" in r:
        goals[">= 20 M records/s per core (minrtt)"] = r["translation"]["minrtt"] >= 20e6
    if "phases" in r:
        most = max(r["phases"], key=int)
        goals[f">= 20 M records/s per core with {most} phases (minrtt)"] = r["phases"][most]["minrtt"] >= 20e6
    if "bounds" in r:
        sc = r["bounds"]["scenarios"]
        goals["every bound holds against the truth"] = all(
            v["holds"] for s in sc.values() for v in s.values()
        )
    if "continuous" in r:
        c = r["continuous"]
        goals["continuous sync: every phase and pair succeeded"] = (
            c["failed_phases"] == c["failed_pairs"] == 0
        )
    return goals


def run_parts(args: argparse.Namespace, hz: float, console: Console) -> tuple[dict, dict[str, float]]:
    """Run and print the parts asked for; their results by part, and the load average before each."""
    r: dict = {}
    loads: dict[str, float] = {}
    for part in (p for p in PARTS if p in args.only):
        loads[part] = os.getloadavg()[0]
        if part == "probes":
            r["probes"] = probe_rtts(args.probes, hz)
            r["ratios"] = report_probes(console, r["probes"], args.probes)
        elif part == "translation":
            r["translation"] = translation_rate(args.records)
            report_translation(console, r["translation"], args.records)
        elif part == "phases":
            r["phases"] = translation_rate_phases(args.records)
            report_phases(console, r["phases"], args.records)
        elif part == "bounds":
            r["bounds"] = bounds_side_by_side(args.rounds, 1.0)
            report_bounds(console, r["bounds"])
        else:
            r["continuous"] = continuous_overhead(args.every, args.duration, args.rounds)
            report_continuous(console, r["continuous"])
    return r, loads


def show(doc: dict) -> None:
    """The report of a result file: each part's table as the run printed it, then the goals."""
    console = Console(width=120)
    # a file written before "records" was kept comes from a run at the default record count
    records = doc.get("records", 5_000_000)
    if "probes" in doc:
        report_probes(console, doc["probes"], next(iter(doc["probes"].values()))["probes"])
    if "translation_records_per_s" in doc:
        report_translation(console, doc["translation_records_per_s"], records)
    if "translation_records_per_s_by_phases" in doc:
        report_phases(console, doc["translation_records_per_s_by_phases"], records)
    if "bounds" in doc:
        report_bounds(console, doc["bounds"])
    if "continuous_sync_load" in doc:
        report_continuous(console, doc["continuous_sync_load"])
    print_goals(doc["goals"])


def main() -> None:
    args = parse_args()
    if shown(args.show, show):
        return
    hz = native_tsc.clock.real_hz()
    console = Console(width=120)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    r, loads = run_parts(args, hz, console)
    goals = check_goals(r)
    print_goals(goals)
    keys = {
        "probes": "probes",
        "translation": "translation_records_per_s",
        "phases": "translation_records_per_s_by_phases",
        "bounds": "bounds",
        "continuous": "continuous_sync_load",
    }
    out = {**result_head("sync"), "cpu_hz": hz, "load": os.getloadavg()[0], "records": args.records}
    if len(args.only) < len(PARTS) and os.path.exists(args.json):
        # A partial run replaces its own parts in the existing results and keeps the others.
        with open(args.json, "rb") as f:
            out = {**orjson.loads(f.read()), **out}
    out.update({keys[k]: v for k, v in r.items() if k in keys})
    out.update(r.get("ratios", {}))
    out["load_by_part"] = {**out.get("load_by_part", {}), **loads}
    out["goals"] = {**out.get("goals", {}), **goals}
    write_json(args.json, out)


if __name__ == "__main__":
    main()
