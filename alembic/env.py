"""Alembic environment of eosink's meta store.

Run through ``eosink db upgrade`` (which passes the connection in ``config.attributes``), or
with the plain ``alembic`` command and ``-x url=...``.
"""

from __future__ import annotations

from sqlalchemy import create_engine

from alembic import context

config = context.config


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("pass the meta store URL: alembic -x url=sqlite:///path.db upgrade head")
    with create_engine(url).connect() as conn:
        _run(conn)
