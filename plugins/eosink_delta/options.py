"""The delta sink's options, where its table lives, and keeping credentials out of messages."""

from __future__ import annotations

import os
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eosink import MissingExtraError

__all__ = ["DeltaSinkOptions", "filesystem", "redact", "require_deltalake"]


def require_deltalake() -> None:
    """Raise :class:`~eosink.MissingExtraError` naming the extra unless deltalake imports."""
    try:
        import deltalake  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
        raise MissingExtraError("deltalake", "delta", "the delta sink") from exc


class DeltaSinkOptions(BaseModel):
    """Options of the ``delta`` sink.

    Attributes:
        path: the table's location: a local directory (made absolute) or ``s3://bucket/prefix``
            (``s3a://`` is read as ``s3://``).
        storage_options: delta-rs storage options of an object store (``AWS_ENDPOINT_URL``,
            ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
            ``AWS_ALLOW_HTTP``...; keys as delta-rs spells them, any case). Unset keys are
            read from the environment, as delta-rs does. Never logged or persisted.
        create_table: create the table from the DataFrame's schema when it does not exist.
        partition_by: partition columns of a created table (an existing table keeps its
            own; naming others is an error).
        table_properties: properties of a created table (``delta.checkpointInterval``...).
        writer: who writes the data files: ``auto`` (Spark's own Parquet writer where it can
            write the table's location and the DataFrame exactly, else Python writers in
            Spark tasks), ``spark`` (always Spark's; refused with an error when it cannot) or
            ``python``.
        compression: the data files' Parquet compression.
        mode: ``append`` (default): every row is added. ``upsert``: change-data-capture; each
            row replaces the table's row of the same ``keys`` (or is added), and with
            ``op_column`` a delete operation removes it: one ``MERGE`` per epoch.
        keys: the key columns of ``upsert``.
        order_by: the column that orders several rows of one key within an epoch: the row
            with the largest value wins; a NULL never wins. Without it, a key repeated
            within an epoch is an error before the epoch is persisted.
        op_column: a change-data-capture operation column (Debezium's ``op``): rows whose
            value is in ``delete_ops`` delete their key's row; any other value upserts. Not
            written to the table.
        delete_ops: the ``op_column`` values that delete (default ``["d"]``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    storage_options: dict[str, str] = Field(default_factory=dict, repr=False)
    create_table: bool = True
    partition_by: tuple[str, ...] = ()
    table_properties: dict[str, str] = Field(default_factory=dict)
    writer: Literal["auto", "spark", "python"] = "auto"
    compression: Literal["snappy", "zstd", "gzip", "lz4", "uncompressed"] = "snappy"
    mode: Literal["append", "upsert"] = "append"
    keys: tuple[str, ...] = ()
    order_by: str | None = None
    op_column: str | None = None
    delete_ops: tuple[str, ...] = ("d",)

    @field_validator("partition_by", "keys", "delete_ops", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @field_validator("path")
    @classmethod
    def _location(cls, v: str) -> str:
        if v.startswith("s3a://"):
            v = "s3://" + v[len("s3a://") :]
        if v.startswith("file://"):
            v = urlsplit(v).path
        scheme = urlsplit(v).scheme
        if scheme and len(scheme) > 1:  # a URI (a Windows drive letter is no scheme)
            if scheme != "s3":
                raise ValueError(
                    f"path {v!r}: the delta sink writes local paths and s3:// locations "
                    "(other object stores are not supported yet)"
                )
            bucket = urlsplit(v).netloc
            if not bucket:
                raise ValueError(f"path {v!r} names no bucket (s3://bucket/prefix)")
            return v.rstrip("/")
        return os.path.abspath(os.path.expanduser(v))

    @model_validator(mode="after")
    def _modes(self) -> DeltaSinkOptions:
        if self.mode == "upsert" and not self.keys:
            raise ValueError("mode='upsert' needs keys=[...] (the table's key columns)")
        if self.mode == "append" and (self.keys or self.op_column or self.order_by):
            raise ValueError(
                "keys, order_by and op_column are options of mode='upsert'; append adds every row"
            )
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"keys repeat a column: {list(self.keys)}")
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError(f"partition_by repeats a column: {list(self.partition_by)}")
        if self.op_column is not None and self.op_column in self.keys:
            raise ValueError("op_column cannot be a key column")
        if self.op_column is not None and self.op_column == self.order_by:
            raise ValueError("op_column cannot be the order_by column")
        if self.op_column is not None and self.op_column in self.partition_by:
            raise ValueError("op_column is not written to the table: it cannot partition it")
        if not self.delete_ops:
            raise ValueError("delete_ops needs at least one value")
        return self

    @property
    def on_s3(self) -> bool:
        return self.path.startswith("s3://")

    def delta_storage_options(self) -> dict[str, str] | None:
        """What delta-rs is given: the user's storage options (None for a local table)."""
        return dict(self.storage_options) if self.on_s3 else None

    def s3_setting(self, *names: str) -> str | None:
        """The storage option among ``names`` (delta-rs' spellings, any case), else the
        first of them set in the environment (as delta-rs reads it)."""
        lowered = {k.lower(): v for k, v in self.storage_options.items()}
        for n in names:
            if n.lower() in lowered:
                return lowered[n.lower()]
        for n in names:
            if n.upper() in os.environ:
                return os.environ[n.upper()]
        return None


_ENDPOINT = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "ENDPOINT_URL", "ENDPOINT")
_REGION = ("AWS_REGION", "REGION", "AWS_DEFAULT_REGION")
_KEY = ("AWS_ACCESS_KEY_ID", "ACCESS_KEY_ID")
_SECRET = ("AWS_SECRET_ACCESS_KEY", "SECRET_ACCESS_KEY")
_TOKEN = ("AWS_SESSION_TOKEN", "SESSION_TOKEN", "TOKEN")


def filesystem(opts: DeltaSinkOptions) -> tuple[Any, str]:
    """A pyarrow filesystem of the table's location and the table's root in it (no scheme).

    The same store delta-rs commits to: on S3 built from the same storage options, so that
    the files the writers stage are the files the commit names.
    """
    from pyarrow import fs as pafs

    if not opts.on_s3:
        return pafs.LocalFileSystem(), opts.path
    endpoint = opts.s3_setting(*_ENDPOINT)
    kwargs: dict[str, Any] = {
        "access_key": opts.s3_setting(*_KEY),
        "secret_key": opts.s3_setting(*_SECRET),
        "session_token": opts.s3_setting(*_TOKEN),
        "region": opts.s3_setting(*_REGION) or "us-east-1",
    }
    if endpoint:
        split = urlsplit(endpoint)
        kwargs["endpoint_override"] = split.netloc or endpoint
        kwargs["scheme"] = split.scheme or "https"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None}), opts.path[
        len("s3://") :
    ]


def redact(text: str, opts: DeltaSinkOptions) -> str:
    """``text`` without any secret of the storage options (:func:`eosink.util.redact`)."""
    from eosink.util import redact as _redact

    return _redact(text, opts.storage_options)
