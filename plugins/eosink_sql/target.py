"""The sql sink's checks before anything is written: the DataFrame's columns and types, the
target table (created when asked, checked against the DataFrame: missing columns, NOT NULL
columns the DataFrame lacks, the unique key upserts need) and the staging statement the
writers run, with the target's column types.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from eosink import ConfigError, SchemaMismatchError, SinkError

from .db import check_types, sql_type_of
from .options import SqlSinkOptions
from .state import CoordinatorState

__all__ = ["TargetSetup", "validate_schema"]

log = logging.getLogger("eosink.sql")


def validate_schema(opts: SqlSinkOptions, schema: pa.Schema) -> None:
    """The DataFrame's columns against the options (no connection): types the sink can
    write, and the ``keys``, ``order_by`` and ``op_column`` it names."""
    check_types(schema)
    names = set(schema.names)
    for what, cols in (("keys", opts.keys), ("order_by", [opts.order_by] if opts.order_by else [])):
        missing = [c for c in cols if c not in names]
        if missing:
            raise SchemaMismatchError(
                f"sql sink: {what} names {missing}, not columns of the DataFrame "
                f"({', '.join(schema.names)})"
            )
    if opts.op_column is not None:
        if opts.op_column not in names:
            raise SchemaMismatchError(
                f"sql sink: op_column {opts.op_column!r} is not a column of the DataFrame"
            )
        t = schema.field(opts.op_column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaMismatchError(
                f"sql sink: op_column {opts.op_column!r} must be a string column, not {t}"
            )


class TargetSetup(CoordinatorState):
    """The coordinator's part that sets up and checks the target before the writers."""

    def _target_columns(self, conn: Any) -> dict[str, Any] | None:
        import sqlalchemy as sa

        schema, name = self.opts.schema_and_name
        insp = sa.inspect(conn)
        if not insp.has_table(name, schema=schema):
            return None
        return {c["name"]: c for c in insp.get_columns(name, schema=schema)}

    def _unique_keys(self, conn: Any) -> list[set[str]]:
        import sqlalchemy as sa

        schema, name = self.opts.schema_and_name
        insp = sa.inspect(conn)
        out = [set(insp.get_pk_constraint(name, schema=schema).get("constrained_columns") or [])]
        out += [set(u["column_names"]) for u in insp.get_unique_constraints(name, schema=schema)]
        out += [
            set(c for c in i["column_names"] if c)
            for i in insp.get_indexes(name, schema=schema)
            if i.get("unique")
        ]
        return [u for u in out if u]

    def _create_target(self, conn: Any, schema: pa.Schema) -> None:
        import sqlalchemy as sa

        tschema, name = self.opts.schema_and_name
        cols = []
        for f in schema:
            if f.name == self.opts.op_column:
                continue
            if pa.types.is_null(f.type):
                raise SchemaMismatchError(
                    f"sql sink: column {f.name!r} is all NULL, of no type: cast it "
                    f"(CAST(NULL AS ...)) so that table {self.opts.table} can be created"
                )
            typ = sql_type_of(f.type)
            if not self.db.pg and pa.types.is_decimal(f.type):
                typ = sa.Text()  # SQLite's NUMERIC affinity would round to 15 digits
            cols.append(
                sa.Column(
                    f.name,
                    typ,
                    primary_key=f.name in self.opts.keys,
                    nullable=f.name not in self.opts.keys,
                    autoincrement=False,
                )
            )
        sa.Table(name, sa.MetaData(), *cols, schema=tschema).create(conn)
        log.info("sql sink: created table %s", self.opts.table)

    def writer_setup(self, schema: pa.Schema) -> dict[str, Any]:
        """Create or check the target (see the module); the writers' staging statement."""
        validate_schema(self.opts, schema)
        db = self.db
        try:
            with db.engine.begin() as conn:
                target = self._target_columns(conn)
                if target is None:
                    if not self.opts.create_table:
                        raise ConfigError(
                            f"sql sink: table {self.opts.table} does not exist in "
                            f"{self.opts.target_label.rsplit('/', 1)[0]}: create it, or pass "
                            "create_table=True to create it from the DataFrame's schema"
                        )
                    self._create_target(conn, schema)
                    target = self._target_columns(conn)
                    assert target is not None
                data = [n for n in schema.names if n != self.opts.op_column]
                extra = [n for n in data if n not in target and n != self.opts.order_by]
                if extra:
                    raise SchemaMismatchError(
                        f"sql sink: table {self.opts.table} has no column {extra[0]!r} "
                        f"(its columns: {', '.join(target)}); add it to the table or drop it "
                        "from the DataFrame"
                    )
                required = [
                    n
                    for n, c in target.items()
                    if n not in data
                    and not c.get("nullable", True)
                    and c.get("default") is None
                    and c.get("autoincrement") is not True
                ]
                if required and self.opts.mode == "append":
                    raise SchemaMismatchError(
                        f"sql sink: table {self.opts.table} requires column {required[0]!r} "
                        "(NOT NULL, no default), which the DataFrame lacks"
                    )
                if self.opts.keys and set(self.opts.keys) not in self._unique_keys(conn):
                    raise SchemaMismatchError(
                        f"sql sink: upserts by keys {list(self.opts.keys)} need a primary key "
                        f"or unique constraint on exactly these columns of {self.opts.table}; "
                        "add one (ALTER TABLE ... ADD PRIMARY KEY (...)), or use "
                        "create_table=True on a new table"
                    )
        except (ConfigError, SinkError):
            raise
        except Exception as exc:
            raise db.error("cannot check the target table", exc) from None
        self._data_columns = [n for n in data if n in target]
        staged = list(data) + ([self.opts.op_column] if self.opts.op_column else [])
        # A staging table with the target's types (values that do not fit fail in the task,
        # before anything is persisted), plus the columns only the sink reads.
        select = ", ".join(
            db.quote(n) if n in target else f"CAST(NULL AS {self._ddl(n, schema)}) AS {db.quote(n)}"
            for n in data
        )
        if self.opts.op_column:
            select += f", CAST(NULL AS VARCHAR(64)) AS {db.quote(self.opts.op_column)}"
        if db.pg:
            create = (
                f"CREATE {'UNLOGGED ' if self.opts.unlogged_staging else ''}TABLE {{table}} "
                f"AS SELECT {select} FROM {db.target()} "
                "WITH NO DATA"
            )
        else:
            create = f"CREATE TABLE {{table}} AS SELECT {select} FROM {db.target()} WHERE 0"
        return {
            "create": create,
            "columns": staged,
            "op_column": self.opts.op_column,
            "binary": self._binary_kinds(f"SELECT {select} FROM {db.target()}", schema, staged),
        }

    def _binary_kinds(self, select: str, schema: pa.Schema, staged: list[str]) -> list[str] | None:
        """Per staged column, the Arrow type the writers cast it to for binary ``COPY``
        (ADBC), or None: every column must fit, else the writers send CSV (PostgreSQL
        converts text the way it always does). From the staging table's column types."""
        if not self.db.pg:
            return None
        try:
            import adbc_driver_postgresql  # noqa: F401
        except ImportError:
            log.info("sql sink: adbc-driver-postgresql is not installed: loading CSV")
            return None
        from .db import binary_kind

        with self.db.engine.connect() as conn:
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cur.execute(f"{select} LIMIT 0")
                desc: Any = cur.description
                oids = [int(d[1]) for d in desc]
            finally:
                cur.close()
            conn.rollback()
        kinds = [
            binary_kind(schema.field(n).type, oid) for n, oid in zip(staged, oids, strict=True)
        ]
        if any(k is None for k in kinds):
            return None
        return [str(k) for k in kinds]

    def _ddl(self, name: str, schema: pa.Schema) -> str:
        t = sql_type_of(schema.field(name).type)
        if t is None:
            raise SchemaMismatchError(f"sql sink: column {name!r} is all NULL, of no type: cast it")
        return str(t.compile(dialect=self.db.engine.dialect))

    def _staged_data_columns(self, conn: Any, table: str) -> list[str]:
        """The target's columns an epoch staged in ``table``, as :meth:`writer_setup` would
        have fixed them: ``format("eosink")`` runs phase 1 in another process than the
        writers' set-up (a data source's commit), with a new coordinator."""
        import sqlalchemy as sa

        schema = self.opts.staging_schema if self.db.pg else None
        name = table if self.db.pg else f"eosink_{table}"
        staged = [c["name"] for c in sa.inspect(conn).get_columns(name, schema=schema)]
        target = self._target_columns(conn) or {}
        return [n for n in staged if n in target and n != self.opts.op_column]
