"""The ``eosink`` command: demo, status, plugins, db upgrade."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from .errors import EosinkError

__all__ = ["main"]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def cmd_plugins(args: argparse.Namespace) -> int:
    from .registry import list_sinks

    sinks = list_sinks()
    if args.json:
        print(json.dumps([s.__dict__ for s in sinks], indent=2))
        return 0
    print(
        _table(
            [[s.name, s.package, s.version, s.description] for s in sinks],
            ["sink", "package", "version", "description"],
        )
    )
    return 0


def _store(url: str | None, create: bool = False) -> Any:
    from ._metastore import MetaStore, default_url

    return MetaStore(url or default_url(), create=create)


def cmd_status(args: argparse.Namespace) -> int:
    from ._metastore import ABORTED, COMMITTED, PENDING

    store = _store(args.metastore_url)
    try:
        out = []
        for s in store.sinks():
            if args.sink_id and s.sink_id != args.sink_id:
                continue
            pending = [e.epoch for e in store.epochs(s.sink_id, (PENDING,))]
            aborted = [e.epoch for e in store.epochs(s.sink_id, (ABORTED,))]
            recent = store.epochs(s.sink_id, (COMMITTED,), limit=args.recent)
            out.append(
                {
                    "sink_id": s.sink_id,
                    "plugin": s.plugin,
                    "generation": s.generation,
                    "owner": s.owner,
                    "last_committed_epoch": s.high_water if s.high_water >= 0 else None,
                    "committed_epochs": s.committed_epochs,
                    "pending_epochs": pending,
                    "aborted_epochs": aborted,
                    "recent_commits": [
                        {
                            "epoch": r.epoch,
                            "rows": r.rows,
                            "files": r.files,
                            "pre_commit_ms": round(r.pre_commit_ms or 0.0, 2),
                            "commit_ms": round(r.commit_ms or 0.0, 2),
                            "visibility_lag_s": round(
                                (r.committed_at or 0.0) - (r.batch_end_at or 0.0), 3
                            ),
                        }
                        for r in reversed(recent)
                    ],
                }
            )
    finally:
        store.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"meta store: {store.url_redacted}")
    if not out:
        print("no sinks recorded yet")
    for s in out:
        print(
            f"\nsink {s['sink_id']} (plugin {s['plugin']}, generation {s['generation']}, "
            f"owner {s['owner']})"
        )
        print(
            f"  last committed epoch: {s['last_committed_epoch']}  "
            f"committed epochs: {s['committed_epochs']}"
        )
        print(
            f"  pending: {s['pending_epochs'] or 'none'}  aborted: {s['aborted_epochs'] or 'none'}"
        )
        if s["recent_commits"]:
            rows = [
                [
                    str(r["epoch"]),
                    str(r["rows"]),
                    str(r["files"]),
                    f"{r['pre_commit_ms']:.1f}",
                    f"{r['commit_ms']:.1f}",
                    f"{r['visibility_lag_s']:.3f}",
                ]
                for r in s["recent_commits"]
            ]
            print(
                "  "
                + _table(
                    rows, ["epoch", "rows", "files", "pre_commit_ms", "commit_ms", "lag_s"]
                ).replace("\n", "\n  ")
            )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from ._metastore import default_url, redact_url
    from ._metastore.migrations import current_revision, head_revision, upgrade
    from ._metastore.store import _make_engine

    url = args.url or default_url()
    engine = _make_engine(url)
    try:
        with engine.begin() as conn:
            before = current_revision(conn)
            if args.action == "upgrade":
                upgrade(conn)
            after = current_revision(conn)
    finally:
        engine.dispose()
    if args.action == "upgrade":
        print(
            f"{redact_url(url)}: schema {before or '(empty)'} -> {after} (head {head_revision()})"
        )
    else:
        print(f"{redact_url(url)}: schema {after or '(empty)'} (this eosink: {head_revision()})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import demo

    return demo(args.sink, args.dir, rows=args.rows, batches=args.batches)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="eosink", description="Exactly-once sinks for PySpark.")
    p.add_argument("-v", "--verbose", action="store_true", help="log every state change")
    sub = p.add_subparsers(dest="cmd", required=True)

    sp = sub.add_parser("plugins", help="list installed sinks with their packages and versions")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_plugins)

    sp = sub.add_parser("status", help="sinks, last committed epoch, pending/aborted epochs")
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument("--sink-id")
    sp.add_argument("--recent", type=int, default=5, help="recent commits shown per sink")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_status)

    sp = sub.add_parser("db", help="meta store schema")
    sp.add_argument("action", choices=["upgrade", "current"])
    sp.add_argument("--url", help="default: EOSINK_METASTORE_URL or ~/.eosink/metastore.db")
    sp.set_defaults(fn=cmd_db)

    sp = sub.add_parser("demo", help="write, crash-free re-run and verify, on embedded defaults")
    sp.add_argument("--sink", default="file", choices=["file", "iceberg"])
    sp.add_argument("--dir", help="working directory (default: a new temporary one)")
    sp.add_argument("--rows", type=int, default=30000)
    sp.add_argument("--batches", type=int, default=3)
    sp.set_defaults(fn=cmd_demo)

    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.fn(args))
    except EosinkError as exc:
        print(f"eosink: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
