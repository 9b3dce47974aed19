"""Reaching the meta store's database: the default URL, the SQLAlchemy engine (SQLite in WAL
mode, drivers checked), redaction of URLs, and which of its errors are permanent."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Engine,
    create_engine,
    event,
    func,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .._transient import classify_error
from ..errors import ConfigError, MetaStoreError, MissingExtraError

log = logging.getLogger("eosink.metastore")


def redact_url(url: str) -> str:
    """The URL with its password hidden, for logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable meta store URL>"


def _permanent(exc: BaseException) -> str | None:
    """Why an operational error of the meta store is permanent (eosink's one rule,
    :func:`eosink.util.classify_error`), or None (transient)."""
    verdict = classify_error(exc)
    return None if verdict.transient else verdict.why


def default_url(checkpoint_location: str | None = None) -> str:
    """The meta store URL used when none is given.

    ``EOSINK_METASTORE_URL`` if set; otherwise ``$EOSINK_HOME/metastore.db`` (``~/.eosink``
    by default): one store for the batch and the streaming runs of every sink on this
    machine, so that they share state and fencing, and so that deleting a checkpoint never
    deletes a sink's history. A checkpoint written by a pre-release eosink keeps the store it holds
    (``<checkpoint>/eosink/metastore.db``), with a warning.
    """
    env = os.environ.get("EOSINK_METASTORE_URL")
    if env:
        return env
    if checkpoint_location and "://" not in checkpoint_location.removeprefix("file://"):
        legacy = Path(checkpoint_location.removeprefix("file://")) / "eosink" / "metastore.db"
        if legacy.is_file():
            log.warning(
                "using the meta store inside the checkpoint (%s), as pre-release eosink did; "
                "batch runs of this sink do not see it. Pass metastore_url= to choose one store "
                "for all runs",
                legacy,
            )
            return f"sqlite:///{legacy.resolve()}"
    # Not created here: a read-only command (eosink status) must create nothing.
    return f"sqlite:///{(eosink_home() / 'metastore.db').resolve()}"


def eosink_home() -> Path:
    """eosink's directory on this machine: ``$EOSINK_HOME``, by default ``~/.eosink``."""
    return Path(os.environ.get("EOSINK_HOME", Path.home() / ".eosink")).expanduser()


def _greatest(dialect: str, column: Any, value: Any) -> Any:
    """SQL ``max(column, value)`` of two values (SQLite's scalar max, elsewhere greatest)."""
    return func.max(column, value) if dialect == "sqlite" else func.greatest(column, value)


def _make_engine(url: str, create: bool = True) -> Engine:
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"invalid meta store URL {redact_url(url)!r}: {exc}. Expected a SQLAlchemy URL "
            "such as sqlite:////abs/path/metastore.db or postgresql://user@host/db"
        ) from None
    if u.get_backend_name() == "postgresql" and u.get_driver_name() in ("", "psycopg2"):
        # psycopg 3 is the driver that the `postgres` extra installs.
        u = u.set(drivername="postgresql+psycopg")
    if u.get_backend_name() == "sqlite":
        memory = (
            not u.database
            or u.database == ":memory:"
            or u.query.get("mode") == "memory"
            or u.database.startswith("file::memory:")
        )
        if memory:
            raise ConfigError(
                f"meta store {url!r} is an in-memory SQLite database: it forgets every "
                "committed epoch when the process ends, so a re-run would write them again. "
                "Use a file (sqlite:////abs/path/metastore.db) or leave metastore_url unset "
                "for the default ($EOSINK_HOME/metastore.db)"
            )
        assert u.database is not None
        try:
            if not create and not Path(u.database).is_file():
                raise MetaStoreError(f"there is no eosink meta store at {u.database}")
            if create:
                Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot use {u.database!r} as a SQLite meta store: {exc}") from None
    try:
        if u.get_backend_name() == "sqlite":
            engine = create_engine(u, connect_args={"timeout": 60})

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                if create:  # never change a file a read-only open may not own
                    _wal(cur)
                cur.execute("PRAGMA synchronous=FULL")
                cur.close()

            return engine
        return create_engine(
            u, pool_pre_ping=True, pool_size=2, connect_args={"connect_timeout": 10}
        )
    except (ModuleNotFoundError, NoSuchModuleError) as exc:
        if u.get_backend_name() == "postgresql":
            raise MissingExtraError("psycopg", "postgres", "a PostgreSQL meta store") from exc
        raise MetaStoreError(f"no driver for meta store {redact_url(url)}: {exc}") from exc


def _wal(cur: Any) -> None:
    """``PRAGMA journal_mode=WAL``, waiting out other connections for up to 60 s.

    Switching a new database file to WAL takes an exclusive lock for which SQLite does not
    call the busy handler: six drivers opening one new store at once failed ~2 % of the
    time with "database is locked" (an error a driver should never see at start).
    """
    import sqlite3

    deadline = time.monotonic() + 60
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
