"""The cost of the probe responder's guard: MinRTT on loopback, plain against an allow-list and keyed.

Run: python benchmarks/probe_guard.py [--rounds 3] [--probes 3000]
(writes benchmarks/results/probe_guard.json)
The C loops answer 3,000 probes per case; the cases alternate round by round, so
load drifting on a shared machine hits each alike. The allow-list has 512 entries
(the limit) with the prober's address last; keyed probes carry a SipHash-2-4 tag.
Ratios are to the plain case of the same run.
"""

from __future__ import annotations

import numpy as np
from bench_common import add_show, arg_parser, make_table, result_head, shown, write_json
from rich.console import Console

import native_tsc
from cp_sync.probe import native as probe

KEY = bytes(range(16))
ALLOW = [f"10.9.{i // 256}.{i % 256}" for i in range(511)] + ["127.0.0.1"]
CASES: dict[str, dict] = {
    "plain": {},
    "allow-list, 512 entries": {"allow": ALLOW},
    "keyed": {"key": KEY},
    "allow-list + keyed": {"allow": ALLOW, "key": KEY},
}


def measure(rounds: int, probes: int) -> dict[str, np.ndarray]:
    """Round-trip times (ns) of every answered probe, per case."""
    hz = native_tsc.frequency_hz()
    rtts: dict[str, list[np.ndarray]] = {name: [] for name in CASES}
    for _ in range(rounds):
        for name, kw in CASES.items():
            with probe.Responder(allow=kw.get("allow"), key=kw.get("key")) as r:
                out = probe.initiate(*r.address, probes, gap_us=20, key=kw.get("key"))
            if out.lost:
                raise RuntimeError(f"{name}: {out.lost} probes lost on loopback")
            rtts[name].append(out.rtt / hz * 1e9)
    return {name: np.concatenate(parts) for name, parts in rtts.items()}


def report(doc: dict) -> None:
    """The table of a result file: each case's round trips, its minimum against the plain case's."""
    base = doc["cases"]["plain"]["min_ns"]
    rows = [
        [
            name,
            f"{fig['min_ns'] / 1e3:.1f}",
            f"{fig['p10_ns'] / 1e3:.1f}",
            f"{fig['median_ns'] / 1e3:.1f}",
            f"{fig['min_ns'] / base:.2f}",
        ]
        for name, fig in doc["cases"].items()
    ]
    cols = ["case", "min RTT us", "p10 us", "median us", "min / plain"]
    Console().print(make_table("MinRTT probes on loopback, C loops", cols, rows))


def main() -> None:
    ap = arg_parser(__doc__, "probe_guard")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--probes", type=int, default=3000)
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, report):
        return
    rtts = measure(args.rounds, args.probes)
    doc = result_head("probe_guard") | {"rounds": args.rounds, "probes": args.probes, "cases": {}}
    for name, a in rtts.items():
        fig = {"min_ns": float(a.min()), "p10_ns": float(np.percentile(a, 10))}
        fig["median_ns"] = float(np.median(a))
        doc["cases"][name] = fig
    report(doc)
    write_json(args.json, doc, announce=True)


if __name__ == "__main__":
    main()
