"""``eosink retire``: remove what a decommissioned sink keeps outside its target's data."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from typing import Any

from .owners import refuse_unless_stopped
from .recover import sink_options
from .stores import open_store


def cmd_retire(args: argparse.Namespace) -> int:
    from .._metastore import PENDING
    from .._retire import retire, survey
    from .._setup import prepare_sink

    setup = prepare_sink(
        args.sink,
        sink_options(args),
        streaming=False,
        sink_id=args.sink_id,
        metastore_url=args.metastore_url,
    )
    store = open_store(setup.metastore_url)
    try:
        refused = refuse_unless_stopped(store, setup.sink_id, "retire")
        if refused is not None:
            return refused
        pending = [r.epoch for r in store.epochs(setup.sink_id, (PENDING,))]
    finally:
        store.close()
    if pending:
        print(
            f"eosink retire: sink {setup.sink_id!r} has PENDING epoch(s) {pending}: their rows "
            "are complete but not yet published. Publish them with `eosink recover`, or give "
            "them up with `eosink abandon`, then retire the sink",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        plan = survey(setup)
        print(f"eosink retire --dry-run: retiring sink {setup.sink_id!r} would remove:")
    else:
        by = f"{getpass.getuser()}@{socket.gethostname()}"
        plan = retire(setup, by)
        print(f"retired sink {setup.sink_id!r}; removed:")
    for line in plan.removed:
        print(f"  - {line}")
    print("kept:")
    for line in plan.kept:
        print(f"  - {line}")
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser(
        "retire",
        help="remove what a decommissioned sink keeps outside its data (meta-store rows, "
        "marker, journal, staging, its own records); later runs of its sink_id start above it",
    )
    sp.add_argument("--sink", required=True, help="the sink's name (eosink plugins)")
    sp.add_argument("--sink-id", help="default: the sink's default for its target")
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a sink option, as the job gives it (VALUE in JSON, or a string); repeatable",
    )
    sp.add_argument("--options-json", help="the sink's options as one JSON object")
    sp.add_argument(
        "--dry-run", action="store_true", help="list what would be removed; change nothing"
    )
    sp.set_defaults(fn=cmd_retire)
