"""``eosink demo`` and ``eosink new-sink``."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_demo(args: argparse.Namespace) -> int:
    from .._demo import demo

    return demo(
        args.sink,
        args.dir,
        rows=args.rows,
        batches=args.batches,
        bootstrap_servers=args.bootstrap_servers,
    )


def cmd_new_sink(args: argparse.Namespace) -> int:
    from .._scaffold import new_sink, next_steps

    print(next_steps(new_sink(args.name, args.dir)))
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser("demo", help="write, crash-free re-run and verify, on embedded defaults")
    sp.add_argument("--sink", default="file", choices=["file", "iceberg", "kafka"])
    sp.add_argument("--dir", help="working directory (default: a new temporary one)")
    sp.add_argument(
        "--bootstrap-servers",
        help="--sink kafka: the Kafka broker(s) to write to, host:port (the demo starts none)",
    )
    sp.add_argument("--rows", type=int, default=30000)
    sp.add_argument("--batches", type=int, default=3)
    sp.set_defaults(fn=cmd_demo)
    sp = sub.add_parser(
        "new-sink", help="write a new sink plugin package: a working SQLite sink and its tests"
    )
    sp.add_argument("name", help="the sink's name: lowercase letters, digits, underscores")
    sp.add_argument("--dir", default=".", help="where eosink-NAME/ is created (default: here)")
    sp.set_defaults(fn=cmd_new_sink)
