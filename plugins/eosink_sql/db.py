"""The target database as the sql sink sees it: connections, names, the type map, and
eosink's own tables beside the target.

eosink's tables (PostgreSQL: in ``staging_schema``, default ``eosink``; SQLite: in the
target's database, prefixed ``eosink_``):

* ``sql_epochs (sink_key, epoch, committed_at, rows)``: one row per committed epoch, inserted
  in the commit's own transaction: a replayed commit finds it and does nothing;
* ``sql_markers (sink_key, marker)``: the sink's marker (:class:`eosink.TargetMarker`);
* ``stg_<sink key>_<epoch>_<attempt>``: the rows one task attempt staged for an epoch
  (``UNLOGGED`` with ``unlogged_staging``), dropped in the commit's transaction or by abort.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import re
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from eosink import SchemaMismatchError, SinkError
from eosink.util import is_transient, redact

from .options import SqlSinkOptions, normalized_url

__all__ = ["Db", "adbc_uri", "arrow_type_of", "binary_kind", "sql_type_of", "staging_name"]

_STAGING = re.compile(r"stg_([0-9a-f]{16})_(\d+)_([a-z0-9_]+)")


def staging_name(key: str, epoch: int, attempt_id: str) -> str:
    """The staging table of one task attempt (unquoted; <= 63 characters)."""
    attempt = re.sub(r"[^a-z0-9_]", "_", attempt_id.lower())[:24]
    return f"stg_{key}_{epoch}_{attempt}"


def sql_type_of(t: pa.DataType) -> Any:
    """The SQLAlchemy type a column of Arrow type ``t`` is created with, or None."""
    import sqlalchemy as sa

    if pa.types.is_boolean(t):
        return sa.Boolean()
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return sa.SmallInteger()
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return sa.Integer()
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return sa.BigInteger()
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return sa.Float(24)
    if pa.types.is_float64(t):
        return sa.Double()
    if pa.types.is_decimal(t):
        return sa.Numeric(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return sa.Text()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return sa.LargeBinary()
    if pa.types.is_date(t):
        return sa.Date()
    if pa.types.is_timestamp(t):
        return sa.DateTime(timezone=t.tz is not None)
    return None


# PostgreSQL types (by OID) whose binary COPY input ADBC writes from these Arrow types.
_BINARY_OF_OID = {
    16: "bool",
    21: "int16",
    23: "int32",
    20: "int64",
    700: "float32",
    701: "float64",
    25: "string",
    1043: "string",
    1042: "string",
    17: "binary",
    1082: "date32",
    1114: "timestamp",
    1184: "timestamp_utc",
    1700: "decimal",
}


def binary_kind(source: pa.DataType, oid: int) -> str | None:
    """How a column of Arrow type ``source`` is loaded into a staging column of type
    ``oid`` by binary ``COPY`` (ADBC), or None when only CSV keeps the database's own
    conversion (a string into a ``JSONB``, a number into a ``TEXT``...)."""
    kind = _BINARY_OF_OID.get(oid)
    t = source
    if kind is None:
        return None
    if pa.types.is_null(t):
        return None if kind == "decimal" else kind
    fits = {
        "bool": pa.types.is_boolean(t),
        "int16": pa.types.is_integer(t),
        "int32": pa.types.is_integer(t),
        "int64": pa.types.is_integer(t),
        "float32": pa.types.is_floating(t) or pa.types.is_integer(t),
        "float64": pa.types.is_floating(t) or pa.types.is_integer(t),
        "string": pa.types.is_string(t) or pa.types.is_large_string(t),
        "binary": pa.types.is_binary(t) or pa.types.is_large_binary(t),
        "date32": pa.types.is_date(t),
        # a zoned time into TIMESTAMP: its UTC wall time (as PostgreSQL reads CSV); a naive
        # one into TIMESTAMPTZ is read in the session's time zone: CSV
        "timestamp": pa.types.is_timestamp(t),
        "timestamp_utc": pa.types.is_timestamp(t) and t.tz is not None,
        "decimal": pa.types.is_decimal128(t),
    }[kind]
    return kind if fits else None


def arrow_type_of(kind: str, source: pa.DataType) -> pa.DataType:
    """The Arrow type a column is cast to before binary ``COPY`` (see :func:`binary_kind`)."""
    if kind == "decimal":
        return source
    return {
        "bool": pa.bool_(),
        "int16": pa.int16(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float32": pa.float32(),
        "float64": pa.float64(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date32": pa.date32(),
        "timestamp": pa.timestamp("us"),
        "timestamp_utc": pa.timestamp("us", tz="UTC"),
    }[kind]


def adbc_uri(opts: SqlSinkOptions) -> str:
    """The libpq URI ADBC's PostgreSQL driver connects with."""
    u = normalized_url(opts.url.get_secret_value()).set(drivername="postgresql")
    u = u.update_query_dict({"connect_timeout": str(max(1, int(opts.connect_timeout_s)))})
    return str(u.render_as_string(hide_password=False))


def check_types(schema: pa.Schema) -> None:
    """Refuse the columns the sink cannot write (nested and other types)."""
    for f in schema:
        if sql_type_of(f.type) is None and not pa.types.is_null(f.type):  # NULL fits any
            raise SchemaMismatchError(
                f"sql sink: column {f.name!r} of type {f.type} has no SQL type here; "
                "cast it (to a string, to_json(...) for a struct) or drop it"
            )


class Db:
    """One target database: an engine (no pool: short-lived uses) and its dialect's
    spelling of eosink's names."""

    def __init__(self, opts: SqlSinkOptions) -> None:
        import sqlalchemy as sa
        from sqlalchemy.pool import NullPool

        self.opts = opts
        u = normalized_url(opts.url.get_secret_value())
        self.backend = u.get_backend_name()
        timeout = opts.connect_timeout_s
        args: dict[str, Any] = (
            {"timeout": 300.0}  # SQLite: writers of one epoch wait for the file lock
            if self.backend == "sqlite"
            else {"connect_timeout": max(1, int(timeout))}
        )
        self.engine = sa.create_engine(u, poolclass=NullPool, connect_args=args)
        self.quote = self.engine.dialect.identifier_preparer.quote

    @property
    def pg(self) -> bool:
        return bool(self.backend == "postgresql")

    def close(self) -> None:
        self.engine.dispose()

    def error(self, what: str, exc: BaseException) -> SinkError:
        """A SinkError naming the target and what failed, the password never shown;
        ``transient`` when the database could not be reached (retrying may succeed)."""
        detail = redact(str(getattr(exc, "orig", None) or exc), {"url": self._url()})
        err = SinkError(
            f"sql sink {self.opts.target_label}: {what}: {detail.strip().splitlines()[0]}"
        )
        err.transient = is_transient(exc)  # eosink's one rule
        return err

    def _url(self) -> str:
        return str(self.opts.url.get_secret_value())

    # -- names -------------------------------------------------------------------------
    def own(self, name: str) -> str:
        """One of eosink's tables, quoted and qualified."""
        if self.pg:
            return f"{self.quote(self.opts.staging_schema)}.{self.quote(name)}"
        return self.quote(f"eosink_{name}")

    def target(self) -> str:
        return self.target_of(self.opts.table)

    def target_of(self, table: str) -> str:
        """``name`` or ``schema.name``, quoted."""
        return ".".join(self.quote(p) for p in table.split("."))

    def columns(self, names: Iterable[str]) -> str:
        return ", ".join(self.quote(n) for n in names)

    # -- eosink's tables ---------------------------------------------------------------
    def ensure_own_tables(self, conn: Any) -> None:
        from sqlalchemy import text

        if self.pg:
            conn.execute(
                text(f"CREATE SCHEMA IF NOT EXISTS {self.quote(self.opts.staging_schema)}")
            )
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {self.own('sql_epochs')} ("
                "sink_key VARCHAR(16) NOT NULL, epoch BIGINT NOT NULL, "
                "committed_at DOUBLE PRECISION NOT NULL, rows_written BIGINT NOT NULL, "
                "PRIMARY KEY (sink_key, epoch))"
            )
        )
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {self.own('sql_markers')} ("
                "sink_key VARCHAR(16) PRIMARY KEY, marker TEXT NOT NULL)"
            )
        )

    def staging_tables(
        self, conn: Any, key: str, epoch: int | None = None
    ) -> list[tuple[str, int]]:
        """The staging tables of sink ``key`` (of one ``epoch`` if given): (name, epoch),
        sorted."""
        from sqlalchemy import text

        if self.pg:
            rows = conn.execute(
                text(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = :s AND table_name LIKE :p"
                ),
                {"s": self.opts.staging_schema, "p": f"stg\\_{key}\\_%"},
            ).scalars()
        else:
            rows = conn.execute(
                text("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE :p"),
                {"p": f"eosink_stg_{key}_%"},
            ).scalars()
        out = []
        for name in rows:
            m = _STAGING.fullmatch(name.removeprefix("eosink_"))
            if m and m.group(1) == key and (epoch is None or int(m.group(2)) == epoch):
                out.append((name.removeprefix("eosink_"), int(m.group(2))))
        return sorted(out)

    def staging(self, name: str) -> str:
        """A staging table's name, quoted and qualified."""
        return self.own(name)


def python_rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """A batch's rows as DB-API parameters for SQLite (text for decimals and times)."""

    def plain(v: Any) -> Any:
        if isinstance(v, decimal.Decimal):
            return str(v)
        if isinstance(v, _dt.datetime):
            return v.isoformat(sep=" ")
        if isinstance(v, (_dt.date, _dt.time)):
            return v.isoformat()
        return v

    cols = [c.to_pylist() for c in batch.columns]
    return [tuple(plain(v) for v in row) for row in zip(*cols, strict=True)]
