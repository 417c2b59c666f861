"""Scale out: one factory host against two at the same offered rate, and what crossed the driver's host.

Hosts are network namespaces on this machine, routed by a hub namespace over veth pairs
(tests/helpers/netns_hosts.py): each factory host runs `cloudprofiler factory --serve` with its spool on
a tmpfs only its own mount namespace sees, and its generator in the same namespace; a Spark
standalone master and worker (2 cores) run on a host of their own, and the driver on another. The
driver runs one query, ``factories=`` every factory host, into the cloudprofiler sink (records on
a path every host but the factory hosts shares). Configurations, one run each, in this order:

* ``1 host``: one factory host, its generator offering ``--rate`` tuples/s for ``--duration`` s;
* ``2 hosts``: two factory hosts, each generator offering ``--rate``/2 (the same total);
* ``on the driver``: for contrast, the layout before factory hosts: one factory (and its
  generator) on the driver's host, so the executors' segment fetches cross the driver's link.

Per configuration: tuples delivered (checked exactly once against the generators' ledgers and the
spools), the sustained rate (tuples over the time from the first generator stamp to the last sink
stamp), latency p50/p99 (generator stamp to sink stamp; one machine, so one TSC), each segment
server's served segments/bytes (its stats op), and the RX/TX bytes of the veth links of the
driver's host and of the Spark worker's host between the generators' start and the last tuple in
the sink. Each configuration starts with ``--warmup`` s of unmeasured generation (the executor's
Python workers start on the first tuples); the figures but "delivered" are the measured part's.
Executors fetch segments from the factory hosts directly, so the driver's bytes are
Spark's control traffic and the factories' offsets and commits, not the data.

This machine has 2 cores: every host shares them, so two factory hosts are no faster than one
here. What the run shows is the data path, not a parallel gain.

    sudo python benchmarks/scaleout.py               # about 4 minutes
    python benchmarks/scaleout.py --show benchmarks/results/scaleout.json
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from bench_common import add_show, arg_parser, finish, make_table, print_load, run_head, shown
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER_COUNTS = ("segments_served", "rows_served", "bytes_served", "latest_requests", "commits")
# (name, factory hosts, on the driver's host: the layout before factory hosts, for contrast)
CONFIGS: list[tuple[str, int, bool]] = [
    ("1 host", 1, False),
    ("2 hosts", 2, False),
    ("on the driver", 1, True),
]


def _sink_ids(path: Path) -> Any:
    from cp_sink.records import read_records

    return read_records(path)["tuple_id"].to_numpy()


def _sink_stamps(path: Path) -> tuple[Any, Any]:
    """The generator and sink TSC stamps of every record under ``path``."""
    from cp_common.stamp_columns import GEN, SINK, tsc_column
    from cp_sink.records import read_records

    rec = read_records(path)
    return rec.column(tsc_column(GEN)).to_numpy(), rec.column(tsc_column(SINK)).to_numpy()


def _latency(path: Path, after: int) -> dict[str, float]:
    """Generator stamp to sink stamp over the tuples generated after the TSC ``after`` (the end of
    the warm-up), and their rate from the first generator stamp to the last sink stamp."""
    import numpy as np

    import native_tsc

    gen, sink = _sink_stamps(path)
    measured = gen > after
    gen, sink = gen[measured], sink[measured]
    hz = native_tsc.frequency_hz()
    lat = (sink - gen) / hz
    span = (sink.max() - gen.min()) / hz
    return {
        "p50_ms": float(np.percentile(lat, 50)) * 1e3,
        "p99_ms": float(np.percentile(lat, 99)) * 1e3,
        "max_ms": float(lat.max()) * 1e3,
        "span_s": float(span),
        "measured": int(len(lat)),
        "sustained_rate": float(len(lat) / span),
    }


def _links(nets: Any, names: dict[str, str]) -> dict[str, tuple[int, int]]:
    from tests.helpers.netns_hosts import link_bytes

    return {role: link_bytes(ns, nets.links[ns]) for role, ns in names.items()}


def _start_driver(nets: Any, ns: str, addr: str, master: str, servers: list[str], work: Path) -> Any:
    from tests.helpers.netns_hosts import CLUSTER_DRIVER, wait_for

    argv = [sys.executable, "-c", CLUSTER_DRIVER, master, addr, ",".join(servers)]
    argv += [str(work / p) for p in ("status", "records", "ck")] + [str(work / "stop")]
    log = work / "driver.log"
    driver = nets.start(ns, argv, log, dict(os.environ, SPARK_LOCAL_IP=addr))
    wait_for(
        lambda: (work / "status" / "_factories.json").exists() or driver.poll() is not None, 240, "the query"
    )
    if driver.poll() is not None:
        raise RuntimeError(f"the driver ended: {log.read_text(errors='replace')[-2000:]}")
    return driver


def _generate(hosts: list[Any], work: Path, name: str, base: int, rate: int, duration: float) -> list[Any]:
    """One generator on each factory host (in its namespace), all at once; their summaries."""
    gens = [h.generate(work / f"{name}-{i}.json", base + i, rate, duration) for i, h in enumerate(hosts)]
    for g in gens:
        if g.wait(duration + 180) != 0:
            raise RuntimeError(f"a generator exited {g.returncode}")
    return [orjson.loads((work / f"{name}-{i}.json").read_bytes()) for i in range(len(hosts))]


def _wait_sink(work: Path, hosts: list[Any], summaries: list[Any], driver: Any, duration: float) -> Any:
    """The ids the factory hosts published for ``summaries``, once that many are in the sink."""
    import numpy as np

    from tests.helpers.netns_hosts import wait_for

    per_host = len(summaries) // len(hosts)
    want = []
    for j, s in enumerate(summaries):
        path = work / f"summary-{j}.json"
        path.write_bytes(orjson.dumps(s))
        want.append(hosts[j % len(hosts)].expected(path, work / f"want-{j}.npy"))
    ids = np.sort(np.concatenate(want))
    wait_for(
        lambda: len(_sink_ids(work / "records")) >= len(ids) or driver.poll() is not None,
        duration + 300,
        f"{len(ids)} tuples in the sink ({per_host} runs per host)",
        0.5,
    )
    return ids


def run_config(
    nets: Any,
    roles: dict[str, tuple[str, str]],
    master: str,
    cfg: tuple[str, int, bool],
    args: Any,
    work: Path,
    first_net: int,
) -> dict[str, Any]:
    import numpy as np

    from tests.helpers.netns_hosts import NetnsHost

    name, n, on_driver = cfg
    on = roles["driver"] if on_driver else None
    work.mkdir(parents=True)
    hosts: list[Any] = []
    driver = None
    try:
        for i in range(n):
            hosts.append(NetnsHost(nets.tag, first_net + i, work / f"host-{i}", nets.hub, 204, on))
        d_ns, d_addr = roles["driver"]
        driver = _start_driver(nets, d_ns, d_addr, master, [h.server for h in hosts], work)
        rate = round(args.rate / n)
        # unmeasured: the executor's Python workers start on the first tuples
        warm = _generate(hosts, work, "warm", 900 + 10 * first_net, rate, args.warmup)
        _wait_sink(work, hosts, warm, driver, args.warmup)
        after_warm = int(_sink_stamps(work / "records")[0].max())
        before = _links(nets, {r: ns for r, (ns, _) in roles.items()})
        served0 = [h.server_stats() for h in hosts]
        t0 = time.monotonic()
        summaries = _generate(hosts, work, "gen", 950 + 10 * first_net, rate, args.duration)
        want = _wait_sink(work, hosts, warm + summaries, driver, args.duration)
        delivered_s = time.monotonic() - t0
        after = _links(nets, {r: ns for r, (ns, _) in roles.items()})
        served = [h.server_stats() for h in hosts]
        (work / "stop").touch()
        if driver.wait(120) != 0:
            raise RuntimeError((work / "driver.log").read_text(errors="replace")[-2000:])
        got = np.sort(_sink_ids(work / "records"))
    finally:
        if driver is not None and driver.poll() is None:
            (work / "stop").touch()
            driver.wait(120)
        for h in hosts:
            h.stop()
    exactly_once = bool(len(got) == len(want) and np.array_equal(got, want))
    return {
        "config": name,
        "factory_hosts": n,
        "on_driver_host": on_driver,
        "rate_per_host": rate,
        "offered_rate": sum(s["emitted"] for s in summaries) / max(s["elapsed_s"] for s in summaries),
        "emitted": sum(s["emitted"] for s in summaries),
        "dropped": sum(s["dropped"] for s in summaries),
        "warmup_emitted": sum(s["emitted"] for s in warm),
        "expected": int(len(want)),
        "delivered": int(len(got)),
        "exactly_once": exactly_once,
        "wall_s": delivered_s,
        **_latency(work / "records", after_warm),
        "servers": [
            {
                k: s1[k] - s0[k]
                for k in ("segments_served", "rows_served", "bytes_served", "latest_requests", "commits")
            }
            for s0, s1 in zip(served0, served, strict=True)
        ],
        "links": {r: {"rx": after[r][0] - before[r][0], "tx": after[r][1] - before[r][1]} for r in before},
    }


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _served(r: dict[str, Any], key: str) -> int:
    return sum(s[key] for s in r["servers"])


def _link(r: dict[str, Any], role: str) -> str:
    return f"{_mb(r['links'][role]['rx'])} / {_mb(r['links'][role]['tx'])}"


def _share(r: dict[str, Any]) -> str:
    driver = r["links"]["driver"]["rx"] + r["links"]["driver"]["tx"]
    return f"{driver / max(1, _served(r, 'bytes_served')):.3f}"


def _segments(r: dict[str, Any]) -> str:
    each = ", ".join(str(s["segments_served"]) for s in r["servers"])
    return f"{_served(r, 'segments_served'):,} ({each})"


def print_report(doc: dict[str, Any]) -> None:
    runs = doc["runs"]
    figures: list[tuple[str, Any]] = [
        ("machine cores (shared by every host)", lambda r: str(doc["cores"])),
        ("offered tuples/s (per host)", lambda r: f"{r['offered_rate']:,.0f} ({r['rate_per_host']:,})"),
        ("emitted / dropped", lambda r: f"{r['emitted']:,} / {r['dropped']:,}"),
        ("delivered, exactly once", lambda r: f"{r['delivered']:,} {'yes' if r['exactly_once'] else 'NO'}"),
        ("sustained tuples/s", lambda r: f"{r['sustained_rate']:,.0f}"),
        ("latency p50 / p99 ms", lambda r: f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}"),
        ("segments served (per host)", _segments),
        ("MB served by the factory hosts", lambda r: _mb(_served(r, "bytes_served"))),
        ("MB RX / TX, driver's host", lambda r: _link(r, "driver")),
        ("MB RX / TX, Spark worker's host", lambda r: _link(r, "worker")),
        ("driver's bytes / bytes served", _share),
    ]
    rows = [[label, *(fn(r) for r in runs)] for label, fn in figures]
    title = (
        f"scale out: {doc['rate']:,.0f} tuples/s in total for {doc['duration_s']:.0f} s, Spark standalone "
        f"(1 worker, 2 cores); this machine has {doc['cores']} cores, shared by every host"
    )
    Console(width=140).print(make_table(title, ["", *(r["config"] for r in runs)], rows))
    print_load(doc)


def main() -> int:
    ap = arg_parser(__doc__, "scaleout")
    ap.add_argument("--rate", type=int, default=20_000, help="tuples/s offered in total (default 20000)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of generation (default 15)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of unmeasured generation first (3)")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nsenter")):
        print("scaleout: needs root, iproute2 and nsenter (hosts are network namespaces)", file=sys.stderr)
        return 2
    from tests.helpers.netns_hosts import Namespaces, spark_cluster

    doc = run_head(
        "scaleout",
        rate=args.rate,
        duration_s=args.duration,
        cores=os.cpu_count(),
        spark="standalone: master and 1 worker (2 cores) on one host, the driver on another",
        runs=[],
    )
    t0 = time.monotonic()
    nets = Namespaces(secrets.token_hex(2))
    with tempfile.TemporaryDirectory(prefix="scaleout-") as tmp:
        try:
            logs = Path(tmp) / "logs"
            logs.mkdir()
            roles = {"worker": nets.host("s", 3), "driver": nets.host("d", 4)}
            master = spark_cluster(nets, roles["worker"][0], roles["worker"][1], logs)
            for i, cfg in enumerate(CONFIGS):
                r = run_config(nets, roles, master, cfg, args, Path(tmp) / f"run-{i}", 10 + 10 * i)
                doc["runs"].append(r)
                print(
                    f"{cfg[0]}: {r['delivered']:,} tuples, {r['sustained_rate']:,.0f}/s, driver "
                    f"{_mb(r['links']['driver']['rx'] + r['links']['driver']['tx'])} MB",
                    flush=True,
                )
        finally:
            nets.close()
    return finish(doc, t0, args.json, print_report)


if __name__ == "__main__":
    sys.exit(main())
