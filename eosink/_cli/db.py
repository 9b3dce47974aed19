"""``eosink db upgrade|current``: the meta store's schema."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import MetaStoreUnavailableError
from .stores import check_sqlite, not_a_store


def cmd_db(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import DatabaseError, OperationalError

    from .._metastore import default_url, redact_url
    from .._metastore.engine import _make_engine
    from .._metastore.migrations import current_revision, head_revision, upgrade

    url = args.url or default_url()
    if args.action != "upgrade":
        check_sqlite(url, tables=False)  # `current` never creates a meta store
    engine = _make_engine(url, create=args.action == "upgrade")
    try:
        with engine.begin() as conn:
            before = current_revision(conn)
            if args.action == "upgrade":
                upgrade(conn)
            after = current_revision(conn)
    except OperationalError as exc:
        raise MetaStoreUnavailableError(
            f"meta store {redact_url(url)} is unreachable: {exc.orig}"
        ) from None
    except DatabaseError as exc:
        raise not_a_store(url, str(exc.orig)) from None
    finally:
        engine.dispose()
    if args.action == "upgrade":
        print(
            f"{redact_url(url)}: schema {before or '(empty)'} -> {after} (head {head_revision()})"
        )
    else:
        print(f"{redact_url(url)}: schema {after or '(empty)'} (this eosink: {head_revision()})")
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser("db", help="meta store schema")
    sp.add_argument("action", choices=["upgrade", "current"])
    sp.add_argument("--url", help="default: EOSINK_METASTORE_URL or ~/.eosink/metastore.db")
    sp.set_defaults(fn=cmd_db)
