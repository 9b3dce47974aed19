"""The iceberg sink's options, its catalog, and keeping catalog secrets out of messages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eosink import MissingExtraError, SinkError

from .transforms import PartitionTerm, parse_partition_by

__all__ = ["IcebergSinkOptions", "load_catalog", "redact", "require_pyiceberg"]


def require_pyiceberg() -> None:
    """Raise :class:`~eosink.MissingExtraError` naming the extra unless pyiceberg imports."""
    try:
        import pyiceberg  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
        raise MissingExtraError("pyiceberg", "iceberg", "the iceberg sink") from exc


class IcebergSinkOptions(BaseModel):
    """Options of the ``iceberg`` sink.

    Attributes:
        table: ``namespace.table``.
        catalog: pyiceberg catalog properties (``type``, ``uri``, ``warehouse``, ``s3.*``...).
            Default: an embedded SQL catalog on SQLite with a local warehouse under
            ``warehouse`` (no server needed). Values are never logged or stored.
        catalog_name: the catalog's name.
        warehouse: local warehouse directory of the default embedded catalog
            (default ``$EOSINK_HOME/iceberg``, ``~/.eosink/iceberg``).
        create_table: create the table from the DataFrame's schema when it does not exist.
        partition_by: partition fields of a created table: ``col``, ``year(ts)``,
            ``month(ts)``, ``day(ts)``, ``hour(ts)``, ``bucket(16, id)``, ``truncate(4, s)``;
            parsed into :class:`~eosink_iceberg.transforms.PartitionTerm` objects.
        expire_snapshots_keep: after each commit, expire snapshots beyond the newest N
            (None: never). Keeps commit latency flat on long-running streams.
        writer: who writes the data files: ``auto`` (Spark's own Parquet writer for an
            unpartitioned table when it can express it and the DataFrame exactly, else
            Python writers in Spark tasks: they write partitioned tables faster),
            ``spark`` (always Spark's; refused with an error when it cannot) or ``python``.
        mode: ``append`` (default): every row is added. ``upsert``: change-data-capture;
            each row replaces the table's row of the same ``keys`` (or is added), and with
            ``op_column`` a delete operation removes it. An epoch's changes commit as one
            snapshot (copy-on-write: the data files holding its keys are rewritten).
        keys: the key columns of ``upsert`` (the table's identifier fields, when it
            declares any).
        order_by: the column that orders several rows of one key within an epoch: the row
            with the largest value wins (a Kafka offset, a change timestamp); a NULL never
            wins. Without it, a key repeated within an epoch is an error before the epoch
            is persisted.
        op_column: a change-data-capture operation column (Debezium's ``op``): rows whose
            value is in ``delete_ops`` delete their key's row; any other value upserts. Not
            written to the table.
        delete_ops: the ``op_column`` values that delete (default ``["d"]``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: str = Field(pattern=r"^[\w-]+(\.[\w-]+)+$")
    catalog: dict[str, str] = Field(default_factory=dict, repr=False)
    catalog_name: str = "eosink"
    warehouse: str | None = None
    create_table: bool = True
    partition_by: tuple[PartitionTerm, ...] = ()
    expire_snapshots_keep: int | None = Field(default=None, ge=1)
    writer: Literal["auto", "spark", "python"] = "auto"
    mode: Literal["append", "upsert"] = "append"
    keys: tuple[str, ...] = ()
    order_by: str | None = None
    op_column: str | None = None
    delete_ops: tuple[str, ...] = ("d",)

    @field_validator("partition_by", mode="before")
    @classmethod
    def _parse(cls, v: Any) -> tuple[PartitionTerm, ...]:
        return parse_partition_by(v)

    @field_validator("keys", "delete_ops", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _modes(self) -> IcebergSinkOptions:
        if self.mode == "upsert" and not self.keys:
            raise ValueError("mode='upsert' needs keys=[...] (the table's key columns)")
        if self.mode == "append" and (self.keys or self.op_column or self.order_by):
            raise ValueError(
                "keys, order_by and op_column are options of mode='upsert'; append adds every row"
            )
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"keys repeat a column: {list(self.keys)}")
        if self.op_column is not None and self.op_column in self.keys:
            raise ValueError("op_column cannot be a key column")
        if self.op_column is not None and self.op_column == self.order_by:
            raise ValueError("op_column cannot be the order_by column")
        if not self.delete_ops:
            raise ValueError("delete_ops needs at least one value")
        return self

    def catalog_properties(self) -> dict[str, str]:
        """The pyiceberg catalog properties (the embedded catalog's when ``catalog`` is empty;
        its warehouse directory is created)."""
        if self.catalog:
            return dict(self.catalog)
        wh = self._embedded_warehouse()
        wh.mkdir(parents=True, exist_ok=True)
        return {"type": "sql", "uri": f"sqlite:///{wh / 'catalog.db'}", "warehouse": f"file://{wh}"}

    def _embedded_warehouse(self) -> Path:
        return (
            Path(
                self.warehouse
                or Path(os.environ.get("EOSINK_HOME", Path.home() / ".eosink")) / "iceberg"
            )
            .expanduser()
            .resolve()
        )

    def catalog_may_hold_tables(self) -> bool:
        """False when the embedded catalog does not exist yet (it holds no table: nothing
        needs to be opened, or created, to know it); True for any other catalog."""
        return bool(self.catalog) or (self._embedded_warehouse() / "catalog.db").exists()


def redact(text: str, opts: IcebergSinkOptions) -> str:
    """``text`` without any secret of the catalog properties (:func:`eosink.util.redact`)."""
    from eosink.util import redact as _redact

    return _redact(text, opts.catalog)


def load_catalog(opts: IcebergSinkOptions) -> Any:
    """The pyiceberg catalog of ``opts``.

    Raises:
        MissingExtraError: pyiceberg is not installed.
        SinkError: the catalog cannot be opened (secrets redacted from the message).
    """
    require_pyiceberg()
    from pyiceberg.catalog import load_catalog as _load

    props = opts.catalog_properties()
    try:
        return _load(opts.catalog_name, **props)
    except Exception as exc:
        raise catalog_error(opts, props, exc) from None


def catalog_error(opts: IcebergSinkOptions, props: dict[str, str], exc: BaseException) -> Any:
    """The eosink error of a catalog pyiceberg cannot open, naming its type and URI and what
    to check (secrets redacted): a :class:`ConfigError` when the catalog's server answered
    that it is not one (HTTP 404) or refused the credentials (401, 403), else a
    :class:`SinkError` (not reachable, a server error...)."""
    from eosink import ConfigError

    kind = props.get("type") or ("rest" if props.get("uri", "").startswith("http") else "")
    uri = props.get("uri", "")
    named = (
        f"Iceberg catalog {opts.catalog_name!r} (type {kind!r}, uri {uri!r})"
        if uri
        else (f"Iceberg catalog {opts.catalog_name!r} (type {kind!r})")
    )
    said = _first_line(exc)
    response = getattr(exc.__cause__ or exc.__context__, "response", None)
    status = getattr(response, "status_code", None)
    if status == 404:
        msg = (
            f"cannot open {named}: the server answered HTTP 404 Not Found to "
            f"{getattr(response, 'url', None) or 'its config request'}, so there is no "
            "Iceberg REST catalog at that URI. Check catalog['uri'] (the catalog's base URL; "
            "pyiceberg adds /v1/config) and catalog['prefix'] if your catalog has one. "
            "Nothing was written"
        )
        return ConfigError(redact(msg, opts))
    if status in (401, 403):
        msg = (
            f"cannot open {named}: the server refused the credentials (HTTP {status}: "
            f"{said}). Check catalog['credential'] or catalog['token'] and their scope. "
            "Nothing was written"
        )
        return ConfigError(redact(msg, opts))
    reach = type(exc).__name__ in ("ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout")
    what = "cannot reach" if reach else "cannot open"
    return SinkError(
        redact(
            f"{what} {named}: {said}. Check catalog['uri'] and that the catalog is up "
            "and reachable from the driver. Nothing was written",
            opts,
        )
    )


def _first_line(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``, at most 300 characters."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > 300:
        first = first[:300] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
