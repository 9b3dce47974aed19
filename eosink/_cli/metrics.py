"""``eosink metrics serve``: a Prometheus endpoint with the state of a meta store's sinks,
in a process that outlives the drivers (alerts fire when a driver is dead)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any


def cmd_serve(args: argparse.Namespace) -> int:
    from ..metrics import serve_metastore

    watch = serve_metastore(args.metastore_url, args.port, args.addr, args.every)
    print(
        f"eosink: serving the meta store's figures on http://{args.addr}:{watch.port}/metrics "
        f"(read every {args.every:g}s; Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: watch.stop())
    try:
        watch.run()
    except KeyboardInterrupt:
        pass
    finally:
        watch.stop()
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser("metrics", help="serve sinks' figures for Prometheus")
    msub = sp.add_subparsers(dest="metrics_cmd", required=True)
    s = msub.add_parser(
        "serve",
        help="a Prometheus endpoint with every sink's state read from the meta store "
        "(needs eosink[metrics])",
    )
    s.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    s.add_argument("--port", type=int, default=9464, help="default: 9464")
    s.add_argument("--addr", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    s.add_argument(
        "--every", type=float, default=15.0, help="seconds between reads of the store (15)"
    )
    s.set_defaults(fn=cmd_serve)
