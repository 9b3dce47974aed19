"""``eosink abandon``: give up a PENDING epoch for good, recorded as a known loss."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from typing import Any

from .owners import refuse_unless_stopped
from .stores import open_store
from .text import iso


def cmd_abandon(args: argparse.Namespace) -> int:
    from .._metastore import ABORTED, PENDING

    store = open_store(args.metastore_url)
    try:
        refused = refuse_unless_stopped(store, args.sink_id, "abandon")
        if refused is not None:
            return refused
        rec = store.epoch(args.sink_id, args.epoch)
        if rec is None or rec.status not in (PENDING, ABORTED):
            state = "unknown to this meta store" if rec is None else rec.status
            print(
                f"eosink abandon: sink {args.sink_id!r} epoch {args.epoch} is {state}; only a "
                "PENDING epoch (see `eosink status`) can be abandoned",
                file=sys.stderr,
            )
            return 1
        what = f"epoch {args.epoch} of sink {args.sink_id!r} ({rec.rows} rows, {rec.files} files)"
        if not args.accept_data_loss:
            print(
                f"eosink abandon: this would give up {what} for good: its rows are never "
                "published, and the loss is recorded in the meta store (shown by `eosink "
                "status` forever after). Stop every job of the sink, then run again with "
                "--accept-data-loss",
                file=sys.stderr,
            )
            return 2
        by = f"{getpass.getuser()}@{socket.gethostname()} (eosink abandon)"
        loss = store.abandon(args.sink_id, args.epoch, args.reason, by)
    finally:
        store.close()
    print(
        f"abandoned {what}, recorded as a known loss at {iso(loss.recorded_at)}. "
        "The next run of the sink deletes its staged data; every coordinator of the sink "
        "that was running is fenced and stops."
    )
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser(
        "abandon",
        help="give up a PENDING epoch that can never be published, recorded as a known loss",
    )
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument("--sink-id", required=True)
    sp.add_argument("--epoch", type=int, required=True)
    sp.add_argument("--reason", required=True, help="why: kept with the loss record")
    sp.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="required: the epoch's rows are never published",
    )
    sp.set_defaults(fn=cmd_abandon)
