"""The statements every epoch runs, built once.

Building a SQLAlchemy statement (ORM attributes coerced, a cache key generated from the new
tree) costs more than running it on SQLite: an epoch runs about a dozen, so building them
anew took about half of the protocol's CPU time per epoch. Built once here, on the Core
tables, with bound parameters, each is compiled once per engine (SQLAlchemy's compiled
cache) and only its parameters change. Parameter names start with ``b_``: a bound
parameter may not share a name with a column an UPDATE sets.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import BindParameter, Table, bindparam, insert, select, update

from .engine import _greatest
from .models import EpochRow, SinkRow

SINKS: Table = SinkRow.__table__  # type: ignore[assignment]
EPOCHS: Table = EpochRow.__table__  # type: ignore[assignment]

_SID: BindParameter[str] = bindparam("b_sid")
_EPOCH: BindParameter[int] = bindparam("b_epoch")

FENCE = (
    update(SINKS)
    .where(SINKS.c.sink_id == _SID, SINKS.c.generation == bindparam("b_gen"))
    .values(updated_at=bindparam("b_now"))
)
"""Bump the sink row if ``b_gen`` is still its generation (rowcount 1), in a write's
transaction: it locks the row until the write commits, so a newer coordinator's acquire
waits for it or fences it."""

GENERATION = select(SINKS.c.generation).where(SINKS.c.sink_id == _SID)
"""The sink's current generation (a fencing check outside a write)."""

SINK = select(SINKS).where(SINKS.c.sink_id == _SID)
"""The sink's row."""

EPOCH = select(EPOCHS).where(EPOCHS.c.sink_id == _SID, EPOCHS.c.epoch == _EPOCH)
"""An epoch's row."""

EPOCH_STATE = select(
    EPOCHS.c.status, EPOCHS.c.generation, EPOCHS.c.committable, EPOCHS.c.origin
).where(EPOCHS.c.sink_id == _SID, EPOCHS.c.epoch == _EPOCH)
"""An epoch's status, generation, committable and origin."""

INSERT_EPOCH = insert(EPOCHS)
"""A new epoch row; executed with its columns as parameters (``bytes``, not ``nbytes``).
A taken key raises ``IntegrityError``, which ends a PostgreSQL transaction: run it in a
savepoint, or use :func:`insert_epoch_if_new`."""


@functools.cache
def insert_epoch_if_new(dialect: str) -> Any | None:
    """A new epoch row unless its key is taken (the transaction goes on: no savepoint, two
    round trips fewer on PostgreSQL), with :func:`inserted` to tell which; None on a
    dialect without ``ON CONFLICT DO NOTHING`` (SQLite since 3.24, PostgreSQL). Built once
    per dialect."""
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        # RETURNING: psycopg's rowcount of this INSERT reaches SQLAlchemy as -1
        return postgresql.insert(EPOCHS).on_conflict_do_nothing().returning(EPOCHS.c.epoch)
    if dialect == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.insert(EPOCHS).on_conflict_do_nothing()
    return None


def inserted(result: Any) -> bool:
    """Whether :func:`insert_epoch_if_new` inserted its row (PostgreSQL's returns it)."""
    if result.returns_rows:
        return result.first() is not None
    return bool(result.rowcount == 1)


TRANSITION = update(EPOCHS).where(
    EPOCHS.c.sink_id == _SID, EPOCHS.c.epoch == _EPOCH, EPOCHS.c.status == bindparam("b_src")
)
"""``b_src`` -> the ``status`` parameter; the columns it sets are the parameters' other
keys that name columns."""


@functools.cache
def raise_high_water(dialect: str) -> Any:
    """The sink's high-water mark raised to ``b_epoch`` and its committed count + 1 (built
    once per dialect: :func:`~.engine._greatest`)."""
    return (
        update(SINKS)
        .where(SINKS.c.sink_id == _SID)
        .values(
            high_water=_greatest(dialect, SINKS.c.high_water, _EPOCH),
            committed_epochs=SINKS.c.committed_epochs + 1,
        )
    )
