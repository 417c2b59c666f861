"""The cost of CurveZMQ: the same runs with keys off and on, side by side in one run.

Run: python benchmarks/curve_cost.py [--quick]

* **transport**: one DEALER sending 64 KiB messages to a ROUTER on loopback as
  fast as it can for a few seconds: MB/s, the cipher's cost with nothing else;
* **ingest**: the generator offering a rate above what the factory (2 workers)
  can publish on this machine, for a few seconds: tuples/s published to the spool;
* **segment fetch**: an executor fetching one 3 MB segment from the segment
  server again and again: MB/s.

Keys off and on alternate, each pair repeated, and the best of each side is kept
(the least disturbed by other load on a shared machine). Writes
benchmarks/results/curve_cost.json.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import add_show, arg_parser, committed_factory, make_table, result_head, shown, write_json
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq

from cp_common import curve_keys
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.hosts.segment_client import fetch_segment
from cp_source.hosts.segment_protocol import SegmentRef
from cp_source.hosts.segment_server import SegmentServer
from cp_source.spool.segments import Spool

MSG_BYTES = 64 << 10


def bench_transport(keys: str | None, seconds: float) -> float:
    """MB/s one DEALER pushes through a ROUTER on loopback."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.linger = dealer.linger = 0
    if keys:
        curve_keys.server_secure(router, keys)
        curve_keys.client_secure(dealer, keys)
    router.bind("tcp://127.0.0.1:*")
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    got = [0]
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            if router.poll(100):
                got[0] += len(router.recv_multipart()[1])

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    payload = b"x" * MSG_BYTES
    dealer.send(payload)  # the handshake before the clock starts
    while got[0] == 0:
        time.sleep(0.01)
    got[0] = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dealer.send(payload)
    stop.set()
    t.join()
    mbs = got[0] / (time.perf_counter() - t0) / 1e6
    router.close()
    dealer.close()
    curve_keys.release(ctx)
    ctx.term()
    return mbs


def bench_ingest(keys: str | None, rate: float, seconds: float) -> dict[str, Any]:
    """Tuples/s a 2-worker factory publishes when offered ``rate`` for ``seconds``."""
    with tempfile.TemporaryDirectory() as d, committed_factory(d, workers=2, curve_keys=keys) as f:
        s = run_generator(
            f.endpoint, GeneratorSettings(rate=rate, duration=seconds, bucket=1000, curve_keys=keys)
        )
        f.wait_drained(60)
        st = Spool(d).stats()
    return {
        "offered": s["offered"],
        "dropped": s["dropped"],
        "published": st.rows,
        "elapsed_s": s["elapsed_s"],
        "published_per_s": st.rows / s["elapsed_s"],
    }


def bench_fetch(keys: str | None, seconds: float) -> float:
    """MB/s of repeated fetches of one 3 MB segment."""
    with tempfile.TemporaryDirectory() as d:
        seg = Path(d) / "w0-0.arrow"
        seg.write_bytes(b"s" * (3 << 20))
        ref = SegmentRef(str(seg), 1, seg.stat().st_size)
        server = SegmentServer(lambda w, n: ref, d, curve_keys=keys)
        ctx = zmq.Context()
        try:
            fetch_segment(server.endpoint, "w0", 0, ctx=ctx, curve_keys=keys)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                n += len(fetch_segment(server.endpoint, "w0", 0, ctx=ctx, curve_keys=keys))
            return n / (time.perf_counter() - t0) / 1e6
        finally:
            ctx.term()
            server.stop()


def report(doc: dict[str, Any]) -> None:
    """The table of a result file: each path's best figure with keys off and on."""
    best = doc["best"]
    labels = {
        "transport_mb_s": "transport, 64 KiB messages (MB/s)",
        "fetch_mb_s": "segment fetch, 3 MB (MB/s)",
        "ingest_per_s": f"ingest, offered {doc['rate']:,.0f}/s (tuples/s published)",
    }
    rows = [
        (label, f"{best['off'][k]:,.0f}", f"{best['on'][k]:,.0f}", f"{best['on'][k] / best['off'][k]:.2f}")
        for k, label in labels.items()
    ]
    Console().print(make_table("CurveZMQ: keys off vs on", ["run", "keys off", "keys on", "on / off"], rows))


def main(argv: list[str] | None = None) -> int:
    ap = arg_parser(__doc__, "curve_cost")
    ap.add_argument("--quick", action="store_true", help="shorter runs, one pair each")
    ap.add_argument("--rate", type=float, default=3e6, help="ingest offer rate, tuples/s (default 3e6)")
    add_show(ap)
    args = ap.parse_args(argv)
    if shown(args.show, report):
        return 0
    secs, pairs = (1.0, 1) if args.quick else (2.0, 2)
    with tempfile.TemporaryDirectory() as kd:
        keys = str(Path(kd) / "keys")
        curve_keys.generate(keys)
        sides: dict[str, dict[str, list[Any]]] = {"off": {}, "on": {}}
        for _ in range(pairs):
            for side, k in (("off", None), ("on", keys)):
                r = sides[side]
                r.setdefault("transport", []).append(bench_transport(k, secs))
                r.setdefault("fetch", []).append(bench_fetch(k, secs))
                r.setdefault("ingest", []).append(bench_ingest(k, args.rate, secs * 1.5))
    best = {
        side: {
            "transport_mb_s": max(r["transport"]),
            "fetch_mb_s": max(r["fetch"]),
            "ingest_per_s": max(x["published_per_s"] for x in r["ingest"]),
        }
        for side, r in sides.items()
    }
    doc = {**result_head("curve_cost"), "rate": args.rate, "seconds": secs, "best": best, "runs": sides}
    doc["ratio_on_off"] = {k: best["on"][k] / best["off"][k] for k in best["on"]}
    report(doc)
    write_json(args.json, doc, announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
