"""Alembic integration: where the migrations are, schema checks and ``eosink db upgrade``.

Alembic itself is imported only to change a schema (or to name an unknown revision): a
process that opens a current meta store (each ``format("eosink")`` micro-batch's commit runs
in a new Python worker) checks the revision with one query, without importing Alembic
(about a second of a worker's start).
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from ..errors import SchemaOutdatedError

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger("eosink.metastore")

if logging.getLogger("alembic").level == logging.NOTSET:
    logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per open is noise

_PKG = Path(__file__).resolve().parent.parent


def migrations_dir() -> Path:
    """The Alembic script directory: inside the wheel, or ``alembic/`` of a source checkout."""
    for cand in (_PKG / "_migrations", _PKG.parent / "alembic"):
        if (cand / "env.py").is_file():
            return cand
    raise FileNotFoundError("eosink's Alembic migrations are missing from this installation")


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


_HEAD: str | None = None
_REVISION = re.compile(r"^revision(?:: str)? = ['\"]([^'\"]+)['\"]", re.MULTILINE)
_DOWN = re.compile(r"^down_revision(?:: [^=]+)? = (None|['\"]([^'\"]+)['\"])", re.MULTILINE)


def head_revision() -> str:
    """The newest revision of the migrations: the one no other revision comes down from.

    Read from the scripts' ``revision`` / ``down_revision`` lines (tests/test_metastore.py
    checks it against Alembic's own answer)."""
    global _HEAD
    if _HEAD is None:
        revs: set[str] = set()
        downs: set[str] = set()
        for script in (migrations_dir() / "versions").glob("*.py"):
            body = script.read_text()
            rev, down = _REVISION.search(body), _DOWN.search(body)
            if rev is None:
                continue
            revs.add(rev.group(1))
            if down is not None and down.group(2):
                downs.add(down.group(2))
        heads = sorted(revs - downs)
        if len(heads) != 1:
            raise FileNotFoundError(
                f"eosink's Alembic migrations in {migrations_dir()} have heads {heads}, not one"
            )
        _HEAD = heads[0]
    return _HEAD


def current_revision(conn: Connection) -> str | None:
    """The revision the database is at (Alembic's ``alembic_version`` table), None if none."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise SchemaOutdatedError(
            f"meta store {conn.engine.url.render_as_string(hide_password=True)} has several "
            f"schema revisions {sorted(rows)}; it was not made by eosink"
        )
    return str(rows[0]) if rows else None


# Alembic's `context` is one proxy per process: two upgrades in two threads would mix their
# connections (seen as KeyError: 'script' and SQLite connections used across threads).
_ALEMBIC = threading.Lock()
# The key of the PostgreSQL advisory lock every eosink takes before it changes a schema.
_PG_SCHEMA_LOCK = int.from_bytes(b"eosink.schema", "big") % (2**63)
_LOCK_WAIT_S = 60


def lock_schema(conn: Connection) -> None:
    """Hold, until ``conn``'s transaction ends, the lock every eosink takes to change the schema.

    Drivers that open one new meta store at the same instant would otherwise all create its
    tables, and all but one fail. PostgreSQL: a transaction-scoped advisory lock; SQLite:
    ``BEGIN IMMEDIATE`` (the database's write lock). Either waits at most 60 s. Other
    databases: no lock. Taking it again in the same transaction is a no-op.
    """
    backend = conn.dialect.name
    if backend == "postgresql":
        conn.execute(text(f"SET LOCAL lock_timeout = '{_LOCK_WAIT_S}s'"))
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK})
    elif backend == "sqlite":
        dbapi = conn.connection.dbapi_connection
        if dbapi is not None and not getattr(dbapi, "in_transaction", True):
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # waits up to the busy timeout


def upgrade(conn: Connection, revision: str = "head") -> None:
    """Upgrade the schema of the database behind ``conn`` (SQLite-safe batch mode).

    Takes :func:`lock_schema` first; the caller commits ``conn``.
    """
    from alembic import command

    lock_schema(conn)
    cfg = _config()
    cfg.attributes["connection"] = conn
    with _ALEMBIC:
        command.upgrade(cfg, revision)


def ensure_schema(conn: Connection, *, create: bool) -> None:
    """Create an empty database's schema, or check that an existing one is current.

    Raises:
        SchemaOutdatedError: the schema is older (or newer) than this eosink.
    """
    head = head_revision()
    cur = current_revision(conn)
    if cur == head:
        return
    if cur is None and create:
        # Another driver may be creating this new store right now: wait for it, look again.
        lock_schema(conn)
        cur = current_revision(conn)
        if cur == head:
            return
    if cur is None and not inspect(conn).has_table("pending_sink_state") and create:
        log.info("creating eosink meta store schema (revision %s)", head)
        upgrade(conn)
        return
    url = conn.engine.url.render_as_string(hide_password=True)
    # Revision ids are zero-padded numbers: an unknown one above head is from a newer eosink.
    if (
        cur is not None
        and cur not in _known_revisions()
        and not (cur.isdigit() and head.isdigit() and int(cur) < int(head))
    ):
        raise SchemaOutdatedError(
            f"meta store {url} has schema revision {cur}, newer than this eosink ({head}); "
            "upgrade eosink"
        )
    raise SchemaOutdatedError(
        f"meta store {url} has schema revision {cur or '(none)'}, older than this eosink "
        f"({head}). Run: eosink db upgrade --url '{url}'"
    )


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}
