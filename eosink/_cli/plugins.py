"""``eosink plugins``: the installed sinks, their packages, versions and readiness."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .text import table


def cmd_plugins(args: argparse.Namespace) -> int:
    from ..registry import list_sinks

    sinks = list_sinks()
    if args.json:
        listed = [
            {
                "name": s.name,
                "package": s.package,
                "version": s.version,
                "description": s.description,
                "status": s.status,
                "missing_modules": list(s.missing),
                "install": s.install or None,
                "error": s.error or None,
            }
            for s in sinks
        ]
        print(json.dumps(listed, indent=2))
        return 0
    print(
        table(
            [[s.name, s.package, s.version, s.status, s.description] for s in sinks],
            ["sink", "package", "version", "status", "description"],
        )
    )
    fixes = [s for s in sinks if s.missing]
    if fixes:
        print()
    for s in fixes:
        what = ", ".join(s.missing) + (" is" if len(s.missing) == 1 else " are")
        print(f"{s.name}: {what} not installed; to use the sink: {s.install}")
    broken = [s for s in sinks if s.error]
    if broken:
        print()
    for s in broken:
        print(
            f"{s.name}: the plugin of package {s.package} {s.version} failed to load "
            f"({s.error}); fix or uninstall it: pip uninstall {s.package}"
        )
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser("plugins", help="list installed sinks with their packages and versions")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_plugins)
