"""Opening the meta store a command names, refusing what is no meta store (nothing is
created by a command that only reads)."""

from __future__ import annotations

from typing import Any

from ..errors import MetaStoreError

EOSINK_TABLE = "pending_sink_state"


def not_a_store(url: str, why: str) -> MetaStoreError:
    from .._metastore import redact_url

    return MetaStoreError(f"{redact_url(url)} is not an eosink meta store: {why}")


def describe_tables(tables: set[str]) -> str:
    if not tables:
        return "the database is empty (create a meta store with `eosink db upgrade --url ...`)"
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    return f"it has no {EOSINK_TABLE} table (its tables: {shown})"


def check_sqlite(url: str, *, tables: bool = True) -> None:
    """Refuse, without creating or changing anything, a SQLite URL that is no meta store.

    Args:
        url: the meta store URL (other databases than SQLite pass unchecked).
        tables: also refuse a database without eosink's tables (an empty one included).

    Raises:
        MetaStoreError: no such file, or a file that is not an eosink meta store (an
            unparseable URL is left to the meta store, which says what is wrong with it).
    """
    import sqlite3
    from pathlib import Path
    from urllib.parse import quote

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return  # the meta store says what is wrong with it
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return
    if u.database.startswith("file:"):
        return  # a SQLite URI filename: left to the meta store
    path = Path(u.database)
    if path.is_dir():
        raise not_a_store(url, f"{path} is a directory")
    if not path.is_file():
        raise MetaStoreError(
            f"there is no eosink meta store at {path} (no such file; nothing was created). "
            "Check --metastore-url / EOSINK_METASTORE_URL"
        )
    try:
        # mode=rw: never creates the file; a read changes nothing (no WAL switch).
        con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=rw", uri=True)
        try:
            found = {
                str(r[0]) for r in con.execute("select name from sqlite_master where type='table'")
            }
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise not_a_store(url, str(exc)) from None
    if tables and EOSINK_TABLE not in found:
        raise not_a_store(url, describe_tables(found))


def open_store(url: str | None, create: bool = False) -> Any:
    from .._metastore import MetaStore, default_url
    from ..errors import SchemaOutdatedError

    url = url or default_url()
    if not create:
        check_sqlite(url)
    try:
        return MetaStore(url, create=create)
    except SchemaOutdatedError:
        tables = None if create else tables_of(url)
        if tables is not None and EOSINK_TABLE not in tables:
            raise not_a_store(url, describe_tables(tables)) from None
        raise


def tables_of(url: str) -> set[str] | None:
    """The tables of the database at ``url``, or None if that cannot be found out."""
    from sqlalchemy import inspect

    from .._metastore.engine import _make_engine

    try:
        engine = _make_engine(url, create=False)
        try:
            with engine.connect() as conn:
                return set(inspect(conn).get_table_names())
        finally:
            engine.dispose()
    except Exception:
        return None
