"""Alembic integration: where the migrations are, schema checks and ``eosink db upgrade``."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from alembic import command

from ..errors import SchemaOutdatedError

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
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


_HEAD: str | None = None


def head_revision() -> str:
    global _HEAD
    if _HEAD is None:
        _HEAD = ScriptDirectory.from_config(_config()).get_current_head()
    assert _HEAD is not None
    return _HEAD


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(conn: Connection, revision: str = "head") -> None:
    """Upgrade the schema of the database behind ``conn`` (SQLite-safe batch mode)."""
    cfg = _config()
    cfg.attributes["connection"] = conn
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
    return {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}
