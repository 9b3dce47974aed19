"""Options of the ``sql`` sink."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["SqlSinkOptions", "normalized_url"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def normalized_url(raw: str) -> Any:
    """The SQLAlchemy URL the sink connects with: ``postgresql://`` uses psycopg 3 (the
    driver of the ``sql`` extra), a relative SQLite path is made absolute (executors do not
    share the driver's working directory)."""
    from sqlalchemy.engine import make_url

    u = make_url(raw)
    if u.get_backend_name() == "postgresql" and u.get_driver_name() in ("", "psycopg2"):
        u = u.set(drivername="postgresql+psycopg")
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        if db in ("", ":memory:") or db.startswith("file:"):
            raise ValueError(
                "an in-memory SQLite database cannot be a target (each task would see its "
                "own): give a file, sqlite:////path/to/db.sqlite"
            )
        u = u.set(database=str(Path(db).expanduser().resolve()))
    return u


class SqlSinkOptions(BaseModel):
    """Options of the ``sql`` sink.

    Attributes:
        url: the database, a SQLAlchemy URL (``postgresql://user:password@host/db`` or
            ``sqlite:////path/db.sqlite``). A secret: never logged nor stored.
        table: the target table, ``name`` or ``schema.name``.
        mode: ``append`` (default): every row is inserted. ``upsert``: rows replace the
            target's row of the same ``keys`` (``INSERT ... ON CONFLICT (keys) DO UPDATE``),
            and with ``op_column`` a delete operation removes it.
        keys: the key columns of ``upsert``: the target's primary key or a unique
            constraint on exactly these columns (checked before anything is written).
        order_by: the column that orders several rows of one key within an epoch: the row
            with the largest value wins (a Kafka offset, a change timestamp). Without it, a
            key repeated within an epoch is an error before the epoch is persisted.
        op_column: a change-data-capture operation column (Debezium's ``op``): rows whose
            value is in ``delete_ops`` delete their key's row; any other value upserts.
            Not written to the target.
        delete_ops: the ``op_column`` values that delete (default ``["d"]``).
        create_table: create a missing target table from the DataFrame's schema (with a
            primary key on ``keys``); default False: a missing table is an error.
        staging_schema: the PostgreSQL schema of eosink's tables in the target database
            (the epochs committed, the sink's marker, and the epochs' staging tables).
            Created when missing. SQLite keeps them beside the target, named ``eosink_*``.
        unlogged_staging: PostgreSQL: make the staging tables ``UNLOGGED`` (no write-ahead
            log: writers load faster). Default False: a server crash (not a clean stop)
            empties ``UNLOGGED`` tables, and an epoch PENDING at that moment whose commit
            had not finished would lose its rows (the commit then refuses it, naming the
            loss, rather than committing nothing). Turn it on when speed matters more.
        connect_timeout_s: how long a connection attempt may take.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: SecretStr
    table: str
    mode: Literal["append", "upsert"] = "append"
    keys: tuple[str, ...] = ()
    order_by: str | None = None
    op_column: str | None = None
    delete_ops: tuple[str, ...] = ("d",)
    create_table: bool = False
    staging_schema: str = "eosink"
    unlogged_staging: bool = False
    connect_timeout_s: float = Field(default=10.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _url(cls, v: SecretStr) -> SecretStr:
        try:
            u = normalized_url(v.get_secret_value())
        except ValueError:
            raise
        except Exception as exc:  # sqlalchemy's ArgumentError: no password in the message
            raise ValueError(f"not a database URL ({type(exc).__name__})") from None
        if u.get_backend_name() not in ("postgresql", "sqlite"):
            raise ValueError(
                f"the sql sink is tested on postgresql and sqlite, not {u.get_backend_name()}"
            )
        return SecretStr(u.render_as_string(hide_password=False))

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        parts = v.split(".")
        if len(parts) > 2 or not all(_NAME.fullmatch(p) for p in parts):
            raise ValueError("give the table as name or schema.name (letters, digits, _)")
        return v

    @field_validator("staging_schema")
    @classmethod
    def _schema(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("a schema name: letters, digits, _")
        return v

    @field_validator("keys", "delete_ops", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _modes(self) -> SqlSinkOptions:
        if self.mode == "upsert" and not self.keys:
            raise ValueError("mode='upsert' needs keys=[...] (the target's primary key)")
        if self.mode == "append" and (self.keys or self.op_column or self.order_by):
            raise ValueError(
                "keys, order_by and op_column are options of mode='upsert'; append inserts "
                "every row"
            )
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"keys repeat a column: {list(self.keys)}")
        if self.op_column is not None and self.op_column in self.keys:
            raise ValueError("op_column cannot be a key column")
        if not self.delete_ops:
            raise ValueError("delete_ops needs at least one value")
        return self

    # -- derived -----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return str(normalized_url(self.url.get_secret_value()).get_backend_name())

    @property
    def schema_and_name(self) -> tuple[str | None, str]:
        parts = self.table.split(".")
        return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])

    @property
    def target_label(self) -> str:
        """The target without credentials: ``postgresql://host:port/db/schema.table``,
        ``sqlite:///path/db.sqlite/table``."""
        u = normalized_url(self.url.get_secret_value())
        if u.get_backend_name() == "sqlite":
            return f"sqlite://{u.database}/{self.table}"
        host = u.host or u.query.get("host") or "localhost"  # a unix socket's directory
        return f"postgresql://{host}:{u.port or 5432}/{u.database}/{self.table}"
