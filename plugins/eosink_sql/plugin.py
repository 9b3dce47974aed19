"""The ``sql`` sink: PostgreSQL (and SQLite) tables, exactly once, with appends, upserts and
change-data-capture deletes.

Writers (Spark tasks) load each task attempt's rows into a staging table of their own in the
target database (PostgreSQL: binary ``COPY`` through ADBC, or CSV); the commit moves an epoch's
rows into the target and records the epoch in one database transaction
(:mod:`eosink_sql.coordinator`). Written against eosink's public plugin API only, as a third
party would.

The package: :mod:`~eosink_sql.options`, :mod:`~eosink_sql.db` (names, types, eosink's
tables), :mod:`~eosink_sql.writer`, :mod:`~eosink_sql.coordinator` (the phases) and its parts
(:mod:`~eosink_sql.target`, :mod:`~eosink_sql.statements`, :mod:`~eosink_sql.holds`,
:mod:`~eosink_sql.marker`), :mod:`~eosink_sql.status`.
"""

from __future__ import annotations

from typing import Any

import eosink
from eosink import JsonCodec, SinkPlugin

from .coordinator import SqlCoordinator, make_coordinator
from .options import SqlSinkOptions
from .status import describe_open
from .target import validate_schema
from .writer import SqlWriter, make_writer

__all__ = ["SINK", "SqlCoordinator", "SqlSinkOptions", "SqlWriter", "eosink_sinks"]


def _default_sink_id(o: SqlSinkOptions) -> str:
    # The database and the table, never the credentials or the driver's name.
    return f"sql:{o.target_label}"


SINK: SinkPlugin[SqlSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="sql",
    options_model=SqlSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    # 2: the mode, keys, order and deletes come from the core's epoch spec (1 carried them)
    committable_codec=JsonCodec[dict[str, Any]](version=2),
    default_sink_id=_default_sink_id,
    validate_schema=validate_schema,
    description="PostgreSQL (and SQLite) tables: appends, upserts and CDC deletes, one "
    "transaction per epoch",
    # SQLAlchemy is a core dependency; PostgreSQL needs psycopg 3 (checked when used).
    requires={},
    path_options=("url",),  # a SQLite database's file
    describe_open=describe_open,
    capabilities=eosink.Capabilities(
        target_marker=True, staged_epochs=True, epoch_spec=True, retirable=True
    ),
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    """The sql sink."""
    return [SINK]
