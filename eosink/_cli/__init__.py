"""The ``eosink`` command: one module per command (``status``, ``recover``, ``abandon``,
``retire``, ``plugins``, ``db``, ``demo``, ``metrics`` and ``new-sink``), each adding its own
sub-parser here."""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import EosinkError
from . import abandon, db, demo, metrics, plugins, recover, retire, status
from .text import one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``eosink`` command's parser (docs/cli.md's synopsis is checked against it)."""
    p = argparse.ArgumentParser(prog="eosink", description="Exactly-once sinks for PySpark.")
    p.add_argument("-v", "--verbose", action="store_true", help="log every state change")
    sub = p.add_subparsers(dest="cmd", required=True)

    for command in (plugins, status, abandon, recover, retire, db, demo, metrics):
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.fn(args))
    except EosinkError as exc:
        print(f"eosink: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.verbose:
            raise
        print(
            f"eosink: error: {type(exc).__name__}: {one_line(str(exc))} "
            "(run with -v for the traceback)",
            file=sys.stderr,
        )
        return 2
