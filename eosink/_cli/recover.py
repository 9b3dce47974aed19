"""``eosink recover``: finish a stopped sink now (commit PENDING epochs, finish aborts,
delete staged data without a committable; ``--drop-lost-open-files``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ConfigError
from .owners import refuse_unless_stopped
from .stores import open_store
from .text import one_line


def sink_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--options-json`` merged with each ``--option KEY=VALUE`` (a JSON value, else the
    string)."""
    opts: dict[str, Any] = {}
    if args.options_json:
        loaded = json.loads(args.options_json)
        if not isinstance(loaded, dict):
            raise ConfigError("--options-json must be a JSON object of the sink's options")
        opts.update(loaded)
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option takes KEY=VALUE, not {item!r}")
        try:
            opts[key] = json.loads(value)
        except ValueError:
            opts[key] = value
    return opts


def cmd_recover(args: argparse.Namespace) -> int:
    from .._metastore import ABORTED, COMMITTED, PENDING
    from .._setup import open_runtime, prepare_sink

    setup = prepare_sink(
        args.sink,
        sink_options(args),
        streaming=False,
        sink_id=args.sink_id,
        metastore_url=args.metastore_url,
    )
    store = open_store(setup.metastore_url)
    try:
        refused = refuse_unless_stopped(store, setup.sink_id, "recover")
        if refused is not None:
            return refused
        before = {r.epoch: r.status for r in store.epochs(setup.sink_id, (PENDING, ABORTED))}
    finally:
        store.close()
    if args.drop_lost_open_files and not (args.accept_data_loss and args.reason):
        print(
            "eosink recover: --drop-lost-open-files gives up the rows of the open files it "
            "drops (recorded as known losses, shown by `eosink status`): run again with "
            "--reason and --accept-data-loss",
            file=sys.stderr,
        )
        return 2
    from .._batch import finish_stopped

    rt = open_runtime(setup)  # fences every other coordinator; the sink's init runs
    try:
        done = finish_stopped(
            rt, drop_lost_open_files=args.reason if args.drop_lost_open_files else None
        )
        after = {r.epoch: r.status for r in rt.store.epochs(setup.sink_id)}
    finally:
        rt.close()
        rt.store.close()
    failure, dropped, rolled = done.failure, done.dropped, done.rolled
    for d in dropped:
        print(
            f"dropped the open file {d['final']} (epochs {d['start']}..{d['end']}, "
            f"{d['rows']} rows): {d['why']}; recorded as a known loss"
        )
    if args.drop_lost_open_files and failure is None and not dropped:
        print("no open file has lost data: nothing dropped")
    if failure is not None:
        print(f"eosink recover: {one_line(str(failure))}", file=sys.stderr)
    committed = sorted(e for e, st in before.items() if st == PENDING and after.get(e) == COMMITTED)
    aborted = sorted(e for e, st in before.items() if st == ABORTED and e not in after)
    left = sorted(e for e in before if after.get(e) in (PENDING, ABORTED))
    print(
        f"sink {setup.sink_id}: committed the PENDING epoch(s) {committed or 'none'}; finished "
        f"the abort of {aborted or 'none'}; deleted staged data without a committable"
        + (f"; dropped {len(dropped)} lost open file(s)" if dropped else "")
        + (f"; published {rolled} open file(s)" if rolled else "")
        + (f"; still not finished: {left} (see `eosink status`)" if left else "")
    )
    return 1 if left or failure is not None else 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser(
        "recover",
        help="finish a stopped sink now: commit its PENDING epochs, abort what must be "
        "aborted (e.g. lingering Kafka transactions)",
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
        "--drop-lost-open-files",
        action="store_true",
        help="file sink: drop the open rolling files whose committed rows were destroyed "
        "outside eosink (an S3 upload aborted, staged data deleted), recorded as known "
        "losses; needs --reason and --accept-data-loss",
    )
    sp.add_argument("--reason", help="--drop-lost-open-files: why, kept with the losses")
    sp.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="--drop-lost-open-files: confirm that the rows of those files are given up",
    )
    sp.set_defaults(fn=cmd_recover)
