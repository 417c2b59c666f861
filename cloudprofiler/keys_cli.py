"""``cloudprofiler keys generate --out DIR``: the CurveZMQ key pairs that ``--curve-keys DIR`` uses."""

from __future__ import annotations

import argparse

from native_tsc import curve_keys

DESCRIPTION = """\
Make the CurveZMQ key pairs for authenticated, encrypted sockets.

example:
  cloudprofiler keys generate --out ~/.cloudprofiler-keys
  cloudprofiler factory --spool /data/spool --endpoint tcp://0.0.0.0:5555 --curve-keys ~/.cloudprofiler-keys

DIR gets server.key / server.key_secret, client.key / client.key_secret and
authorized/ (the client public keys servers accept). DIR is created 0700 and
secret files 0600. Then pass --curve-keys DIR to every command (and the
curveKeys option to the reader): servers accept only the clients in
DIR/authorized. Existing keys are never overwritten.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["generate"], help="generate: create the key pairs")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to create the keys in")


def run(args: argparse.Namespace) -> int:
    paths = curve_keys.generate(args.out)
    for name, path in paths.items():
        print(f"{name:<14}{path}")
    print(f"use: --curve-keys {args.out} (reader option curveKeys)")
    return 0
