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


def _recorded(args: argparse.Namespace, sink_id: str) -> tuple[str, dict[str, Any]] | int:
    """The sink's name and options as its meta store knows them (the options its newest
    epoch was staged with, without secrets), the ones given on the command line winning; or
    the exit status after saying why they cannot be had."""
    from .._spec import EpochSpec

    store = open_store(args.metastore_url)
    try:
        rec = store.sink(sink_id)
        if rec is None:
            refuse_unless_stopped(store, sink_id, "retire")  # says there is no such sink
            return 1
        specs = [r.spec for r in store.epochs(sink_id) if r.spec]
    finally:
        store.close()
    options: dict[str, Any] = {}
    if specs:
        options.update(EpochSpec.decode(specs[-1], f"sink {sink_id}'s newest epoch").options)
    given = sink_options(args)
    if not specs and not given:
        print(
            f"eosink retire: the meta store has no options of sink {sink_id!r} (no epoch "
            "record keeps them): give them as the job gives them (--option KEY=VALUE, "
            "--options-json)",
            file=sys.stderr,
        )
        return 2
    options.update(given)
    return (args.sink or rec.plugin), options


def cmd_retire(args: argparse.Namespace) -> int:
    from .._metastore import PENDING
    from .._retire import retire, survey
    from .._setup import prepare_sink

    sink_id = args.sink_id_arg or args.sink_id
    if sink_id is None and args.sink is None:
        print("eosink retire: give the sink's SINK_ID (see `eosink status`)", file=sys.stderr)
        return 2
    if sink_id is not None and (args.sink is None or not (args.option or args.options_json)):
        got = _recorded(args, sink_id)
        if isinstance(got, int):
            return got
        name, options = got
    else:
        name, options = args.sink, sink_options(args)
    setup = prepare_sink(
        name,
        options,
        streaming=False,
        sink_id=sink_id,
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
        again = f" (retired before, {plan.already})" if plan.already else ""
        print(f"eosink retire --dry-run: retiring sink {setup.sink_id!r}{again} would remove:")
    else:
        by = f"{getpass.getuser()}@{socket.gethostname()}"
        plan = retire(setup, by)
        if plan.already:
            print(
                f"sink {setup.sink_id!r} was retired before ({plan.already}); retired again "
                f"with epochs up to {plan.high}; removed:"
            )
        else:
            print(f"retired sink {setup.sink_id!r} with epochs up to {plan.high}; removed:")
    for line in plan.removed:
        print(f"  - {line}")
    if not plan.removed:
        print("  - nothing: none of it was left")
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
    sp.add_argument(
        "sink_id_arg",
        nargs="?",
        metavar="SINK_ID",
        help="the sink to retire, as `eosink status` shows it; its name and options are "
        "taken from the meta store (the options its newest epoch was staged with, without "
        "secrets: give those with --option)",
    )
    sp.add_argument("--sink", help="the sink's name (default: the one the meta store records)")
    sp.add_argument("--sink-id", help="as SINK_ID (default: the sink's default for its target)")
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a sink option, as the job gives it (VALUE in JSON, or a string); repeatable; "
        "with SINK_ID, over the recorded ones",
    )
    sp.add_argument("--options-json", help="the sink's options as one JSON object")
    sp.add_argument(
        "--dry-run", action="store_true", help="list what would be removed; change nothing"
    )
    sp.set_defaults(fn=cmd_retire)
