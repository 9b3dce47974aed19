"""The ``iceberg`` sink: parallel Parquet data files, one idempotent snapshot per epoch.

* ``writer_setup`` (driver) loads or creates the table, evolves its schema with the
  DataFrame's new columns, and ships the table metadata to the writers.
* Writers (Spark tasks) write Parquet data files into the table location with pyiceberg's own
  writing code (field ids, partition values, column statistics) and return their
  descriptions. The write uuid in every file name encodes the sink and the epoch, so data
  files of an epoch that never committed can be found and deleted.
* ``commit`` appends the epoch's files in one snapshot whose summary carries
  ``eosink.sink-id`` and ``eosink.epoch``, and moves the table property
  ``eosink.epoch.<sink key>`` to the epoch in the same metadata commit. A commit is already
  done when that property is at or past the epoch, or when a snapshot in the ancestry of the
  current one carries the sink and epoch (a lost answer, a replay, a restarted job).
* ``abort`` deletes the epoch's data files.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import itertools
import logging
import os
import re
import uuid
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

import eosink
from eosink import (
    CommitFailedError,
    CommitStateUnknownError,
    CoordinatedSinkWriter,
    JsonCodec,
    MissingExtraError,
    SchemaMismatchError,
    SinkCommitCoordinator,
    SinkError,
    SinkPlugin,
    StagedEpochs,
    WriterContext,
    fault_point,
)

log = logging.getLogger("eosink.iceberg")

_TRANSFORM = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([\w.]+)\s*\)\s*$")
_SECRET_KEYS = re.compile(r"secret|password|token|credential|key", re.I)


def _require() -> None:
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
            ``month(ts)``, ``day(ts)``, ``hour(ts)``, ``bucket(16, id)``, ``truncate(4, s)``.
        expire_snapshots_keep: after each commit, expire snapshots beyond the newest N
            (None: never). Keeps commit latency flat on long-running streams.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: str = Field(pattern=r"^[\w-]+(\.[\w-]+)+$")
    catalog: dict[str, str] = Field(default_factory=dict, repr=False)
    catalog_name: str = "eosink"
    warehouse: str | None = None
    create_table: bool = True
    partition_by: tuple[str, ...] = ()
    expire_snapshots_keep: int | None = Field(default=None, ge=1)

    @field_validator("partition_by", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(p.strip() for p in re.split(r",(?![^(]*\))", v) if p.strip())
        return v

    @field_validator("partition_by")
    @classmethod
    def _transforms(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            m = _TRANSFORM.match(p)
            if m is None:
                if not re.fullmatch(r"[\w.]+", p):
                    raise ValueError(f"invalid partition field {p!r}")
                continue
            name, arg = m.group(1).lower(), m.group(2)
            if name not in ("identity", "year", "month", "day", "hour", "bucket", "truncate"):
                raise ValueError(f"unknown partition transform {name!r} in {p!r}")
            if (name in ("bucket", "truncate")) != (arg is not None):
                raise ValueError(f"{p!r}: bucket and truncate take a width, e.g. bucket(16, id)")
        return v

    def catalog_properties(self) -> dict[str, str]:
        if self.catalog:
            return dict(self.catalog)
        wh = (
            Path(
                self.warehouse
                or Path(os.environ.get("EOSINK_HOME", Path.home() / ".eosink")) / "iceberg"
            )
            .expanduser()
            .resolve()
        )
        wh.mkdir(parents=True, exist_ok=True)
        return {"type": "sql", "uri": f"sqlite:///{wh / 'catalog.db'}", "warehouse": f"file://{wh}"}


def sink_key(sink_id: str) -> int:
    return zlib.crc32(sink_id.encode()) & 0xFFFFFFFF


def write_uuid(sink_id: str, epoch: int) -> uuid.UUID:
    """A write uuid that encodes the epoch (high 64 bits) and the sink (next 32 bits)."""
    return uuid.UUID(int=(epoch << 64) | (sink_key(sink_id) << 32) | uuid.uuid4().int >> 96)


def epoch_of_file(path: str, sink_id: str) -> int | None:
    """The epoch encoded in a data file name written by this sink, else None."""
    m = re.search(
        r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.parquet$", path
    )
    if m is None:
        return None
    n = uuid.UUID(m.group(1)).int
    if (n >> 32) & 0xFFFFFFFF != sink_key(sink_id):
        return None
    return n >> 64


# -- DataFile <-> JSON --------------------------------------------------------------------
def _enc(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"$b": base64.b64encode(v).decode()}
    if isinstance(v, decimal.Decimal):
        return {"$d": str(v)}
    if isinstance(v, uuid.UUID):
        return {"$u": str(v)}
    if isinstance(v, (_dt.date, _dt.datetime, _dt.time)):
        raise TypeError(f"unexpected {type(v).__name__} in a data file description")
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1:
        ((k, x),) = v.items()
        if k == "$b":
            return base64.b64decode(x)
        if k == "$d":
            return decimal.Decimal(x)
        if k == "$u":
            return uuid.UUID(x)
    return v


def _map(m: dict[int, Any] | None, f: Any = lambda x: x) -> Any:
    return None if m is None else [[int(k), f(v)] for k, v in m.items()]


def data_file_to_json(df: Any, spec_id: int) -> dict[str, Any]:
    return {
        "content": int(df.content),
        "file_path": df.file_path,
        "file_format": str(df.file_format.value),
        "partition": [_enc(v) for v in df.partition],
        "record_count": df.record_count,
        "file_size_in_bytes": df.file_size_in_bytes,
        "column_sizes": _map(df.column_sizes),
        "value_counts": _map(df.value_counts),
        "null_value_counts": _map(df.null_value_counts),
        "nan_value_counts": _map(df.nan_value_counts),
        "lower_bounds": _map(df.lower_bounds, _enc),
        "upper_bounds": _map(df.upper_bounds, _enc),
        "split_offsets": df.split_offsets,
        "spec_id": spec_id,
    }


def data_file_from_json(d: dict[str, Any]) -> Any:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    def m(key: str, f: Any = lambda x: x) -> Any:
        v = d.get(key)
        return None if v is None else {int(k): f(x) for k, x in v}

    df = DataFile.from_args(
        content=DataFileContent(d["content"]),
        file_path=d["file_path"],
        file_format=FileFormat(d["file_format"]),
        partition=Record(*[_dec(v) for v in d["partition"]]),
        record_count=d["record_count"],
        file_size_in_bytes=d["file_size_in_bytes"],
        column_sizes=m("column_sizes"),
        value_counts=m("value_counts"),
        null_value_counts=m("null_value_counts"),
        nan_value_counts=m("nan_value_counts"),
        lower_bounds=m("lower_bounds", _dec),
        upper_bounds=m("upper_bounds", _dec),
        split_offsets=d.get("split_offsets"),
        sort_order_id=None,
        spec_id=d["spec_id"],
        equality_ids=None,
        key_metadata=None,
    )
    df.spec_id = d["spec_id"]
    return df


# -- catalog helpers ----------------------------------------------------------------------
def _redact(text: str, opts: IcebergSinkOptions) -> str:
    """``text`` without any secret of the catalog properties (keys and URL passwords)."""
    from urllib.parse import unquote, urlsplit

    for k, v in opts.catalog.items():
        if not v:
            continue
        if len(v) >= 4 and _SECRET_KEYS.search(k):
            text = text.replace(v, "***")
        if "://" in v and "@" in v:
            try:
                pw = urlsplit(v).password
            except ValueError:
                pw = None
            if pw:
                text = text.replace(pw, "***").replace(unquote(pw), "***")
    return text


def load_catalog(opts: IcebergSinkOptions) -> Any:
    _require()
    from pyiceberg.catalog import load_catalog as _load

    try:
        return _load(opts.catalog_name, **opts.catalog_properties())
    except Exception as exc:
        raise SinkError(
            _redact(f"cannot open Iceberg catalog {opts.catalog_name!r}: {exc}", opts)
        ) from None


def _partition_spec_updates(table: Any, fields: Sequence[str]) -> None:
    from pyiceberg.transforms import (
        BucketTransform,
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    simple = {
        "identity": IdentityTransform,
        "year": YearTransform,
        "month": MonthTransform,
        "day": DayTransform,
        "hour": HourTransform,
    }
    with table.update_spec() as spec:
        for p in fields:
            m = _TRANSFORM.match(p)
            if m is None:
                spec.add_identity(p)
                continue
            name, arg, col = m.group(1).lower(), m.group(2), m.group(3)
            if name == "bucket":
                spec.add_field(col, BucketTransform(int(arg)), f"{col}_bucket")
            elif name == "truncate":
                spec.add_field(col, TruncateTransform(int(arg)), f"{col}_trunc")
            else:
                spec.add_field(col, simple[name](), f"{col}_{name}" if name != "identity" else col)


class IcebergWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Buffers one task's Arrow batches and writes them as Iceberg data files."""

    def __init__(self, opts: IcebergSinkOptions, ctx: WriterContext) -> None:
        if ctx.setup is None:
            raise SinkError("the iceberg writer needs the table metadata from writer_setup")
        self.opts = opts
        self.ctx = ctx
        self.batches: list[pa.RecordBatch] = []
        self.written: list[str] = []

    def begin_epoch(self, epoch: int) -> None:
        self.batches = []

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.batches.append(batch)

    def finish_write(self, epoch: int) -> dict[str, Any]:
        evolve = self.ctx.setup.get("evolve")
        if not self.batches:
            return {"files": [], "evolve": evolve}
        _require()
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import _dataframe_to_data_files
        from pyiceberg.table.metadata import TableMetadataUtil

        metadata = TableMetadataUtil.parse_raw(self.ctx.setup["metadata"])
        io = load_file_io(self.ctx.setup["io"], metadata.location)
        table = pa.Table.from_batches(self.batches)
        self.batches = []
        files = []
        for df in _dataframe_to_data_files(
            metadata, table, io, write_uuid(self.ctx.sink_id, epoch), itertools.count(0)
        ):
            self.written.append(df.file_path)
            files.append(data_file_to_json(df, metadata.default_spec_id))
        return {"files": files, "evolve": evolve}

    def abort_write(self) -> None:
        if not self.written:
            return
        from pyiceberg.io import load_file_io

        io = load_file_io(self.ctx.setup["io"])
        for p in self.written:
            try:
                io.delete(p)
            except Exception:
                pass


class IcebergCoordinator(SinkCommitCoordinator[dict[str, Any], dict[str, Any]], StagedEpochs):
    def __init__(self, opts: IcebergSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        self.prop = f"eosink.epoch.{sink_key(sink_id):08x}"
        self.catalog: Any = None
        self.commits = 0

    def init(self) -> None:
        self.catalog = load_catalog(self.opts)

    def _table(self) -> Any:
        if self.catalog is None:
            self.init()
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.opts.table)
        except NoSuchTableError:
            return None
        except Exception as exc:
            raise SinkError(
                _redact(f"cannot load Iceberg table {self.opts.table!r}: {exc}", self.opts)
            ) from None

    # -- driver, before the writers ------------------------------------------------------
    def writer_setup(self, schema: pa.Schema) -> Any:
        table = self._table()
        if table is None:
            if not self.opts.create_table:
                raise SinkError(
                    f"Iceberg table {self.opts.table!r} does not exist (create_table=False)"
                )
            ns = self.opts.table.rsplit(".", 1)[0]
            validate_schema(self.opts, schema)
            self.catalog.create_namespace_if_not_exists(ns)
            table = self.catalog.create_table_if_not_exists(self.opts.table, schema=schema)
            if self.opts.partition_by and table.spec().is_unpartitioned():
                _partition_spec_updates(table, self.opts.partition_by)
                table = self.catalog.load_table(self.opts.table)
            log.info("iceberg: created table %s at %s", self.opts.table, table.location())
        else:
            metadata, evolve = self._evolve(table, schema)
            props = self.opts.catalog_properties()
            return {
                "metadata": metadata.model_dump_json(),
                "io": {**props, **table.io.properties},
                "evolve": evolve,
            }
        props = self.opts.catalog_properties()
        return {
            "metadata": table.metadata.model_dump_json(),
            "io": {**props, **table.io.properties},
        }

    def _evolve(self, table: Any, schema: pa.Schema) -> tuple[Any, dict[str, str] | None]:
        """Stage the DataFrame's new columns (and allowed promotions) without committing.

        Returns the table metadata the writers use (new columns have their field ids) and the
        evolution to apply in the epoch's commit (None when the schema is unchanged).
        Raises SchemaMismatchError, naming the column, before any file is written.
        """
        from pyiceberg.io.pyarrow import pyarrow_to_schema

        current = table.schema()
        names = {f.name for f in current.fields}
        new = [f.name for f in schema if f.name not in names]
        try:
            incoming = pyarrow_to_schema(schema, name_mapping=current.name_mapping)
        except Exception:
            incoming = None
        touched = list(new)
        if incoming is not None:
            touched += [
                f.name
                for f in incoming.fields
                if f.name in names and current.find_field(f.name).field_type != f.field_type
            ]
        if not touched:
            return table.metadata, None
        # Rows already in the table have no value for a new column: it must be optional.
        evolved = pa.schema([f.with_nullable(True) if f.name in new else f for f in schema])
        try:
            tx = table.transaction()  # staged only: applied again in the epoch's commit
            with tx.update_schema() as upd:
                upd.union_by_name(evolved)
            staged = tx.table_metadata
        except Exception as exc:
            said = [n for n in touched if re.search(rf"\b{re.escape(n)}\b", str(exc))]
            col = (said or touched)[0]
            raise SchemaMismatchError(
                f"Iceberg table {self.opts.table!r}: the DataFrame's schema is not compatible"
                + (f" at column {col!r}" if col else "")
                + f": {exc}"
            ) from None
        log.info(
            "iceberg: table %s schema evolves with this epoch (new columns: %s)",
            self.opts.table,
            ", ".join(new) or "none; promotions",
        )
        evolve = {
            "arrow_schema": base64.b64encode(evolved.serialize().to_pybytes()).decode(),
            "schema": staged.schema().model_dump_json(),
        }
        return staged, evolve

    # -- phases --------------------------------------------------------------------------
    def pre_commit(
        self, epoch: int, results: Sequence[dict[str, Any]], add_columns: Sequence[pa.Field]
    ) -> dict[str, Any]:
        files = [f for r in results for f in r["files"]]
        evolve = next((r["evolve"] for r in results if r.get("evolve")), None)
        return {"files": files, "table": self.opts.table, "evolve": evolve}

    def _committed(self, table: Any, epoch: int) -> bool:
        if int(table.properties.get(self.prop, "-1")) >= epoch:
            return True
        from pyiceberg.table.snapshots import ancestors_of

        for snap in ancestors_of(table.current_snapshot(), table.metadata):
            extra = snap.summary.additional_properties if snap.summary else {}
            if extra.get("eosink.sink-id") == self.sink_id:
                return int(extra.get("eosink.epoch", "-1")) >= epoch
        return False

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        table = self._table()
        if table is None:
            raise SinkError(f"Iceberg table {self.opts.table!r} disappeared")
        if self._committed(table, epoch):
            log.info("iceberg: epoch %d of %s already committed", epoch, self.sink_id)
            return
        evolve = committable.get("evolve")
        if not committable["files"] and not evolve:
            return
        data_files = [data_file_from_json(f) for f in committable["files"]]
        try:
            with table.transaction() as tx:
                if evolve:
                    self._apply_evolution(tx, evolve, epoch)
                props = {"eosink.sink-id": self.sink_id, "eosink.epoch": str(epoch)}
                with tx.update_snapshot(snapshot_properties=props).fast_append() as app:
                    for i, df in enumerate(data_files):
                        app.append_data_file(df)
                        if i == 0:
                            fault_point("mid_commit")
                tx.set_properties({self.prop: str(epoch)})
        except CommitFailedException as exc:
            raise CommitFailedError(f"iceberg commit of epoch {epoch} conflicted: {exc}") from None
        except CommitStateUnknownException as exc:
            raise CommitStateUnknownError(f"iceberg commit of epoch {epoch}: {exc}") from None
        self.commits += 1
        if self.opts.expire_snapshots_keep:
            self._expire(self.opts.expire_snapshots_keep)

    def _apply_evolution(self, tx: Any, evolve: dict[str, str], epoch: int) -> None:
        """Apply the epoch's schema change in its commit; the field ids must be the writers'."""
        from pyiceberg.schema import Schema

        arrow = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(evolve["arrow_schema"])))
        with tx.update_schema() as upd:
            upd.union_by_name(arrow)
        expected = Schema.model_validate_json(evolve["schema"])
        got = tx.table_metadata.schema()
        want = {f.field_id: (f.name, str(f.field_type)) for f in expected.fields}
        have = {f.field_id: (f.name, str(f.field_type)) for f in got.fields}
        if any(have.get(i) != v for i, v in want.items()):
            raise SinkError(
                f"epoch {epoch}: the schema of {self.opts.table!r} changed since the epoch was "
                "written (another writer evolved it); the epoch's files use other field ids"
            )

    def _expire(self, keep: int) -> None:
        table = self._table()
        snaps = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
        if len(snaps) <= keep:
            return
        cutoff = snaps[-keep].timestamp_ms
        try:
            table.maintenance.expire_snapshots().older_than(
                _dt.datetime.fromtimestamp(cutoff / 1000, tz=_dt.timezone.utc)
            ).commit()
        except Exception:
            log.warning(
                "iceberg: snapshot expiry failed; retried after the next commit", exc_info=True
            )

    def _io(self) -> Any:
        from pyiceberg.io import load_file_io

        return load_file_io(self.opts.catalog_properties())

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        try:
            paths = {f["file_path"] for f in (committable or {}).get("files", [])}
            paths |= {p for p, e in self._data_files() if e == epoch}
            io = self._io()
            for i, p in enumerate(sorted(paths)):
                io.delete(p)
                if i == 0:
                    fault_point("mid_abort")
        except Exception:
            log.exception("iceberg: abort of epoch %d could not delete every data file", epoch)

    def _data_files(self) -> list[tuple[str, int]]:
        """(path, epoch) of every data file this sink wrote under the table's data location."""
        table = self._table()
        if table is None:
            return []
        from pyarrow import fs as pafs
        from pyiceberg.io.pyarrow import PyArrowFileIO

        loc = table.location().rstrip("/") + "/data"
        try:
            # pyiceberg's own filesystem for the location: endpoint and credentials applied.
            scheme_name, netloc, root = PyArrowFileIO.parse_location(loc)
            filesystem = PyArrowFileIO(self.opts.catalog_properties()).fs_by_scheme(
                scheme_name, netloc
            )
            infos = filesystem.get_file_info(
                pafs.FileSelector(root, recursive=True, allow_not_found=True)
            )
        except Exception:
            log.warning("iceberg: cannot list %s", loc, exc_info=True)
            return []
        scheme = "" if scheme_name == "file" else f"{scheme_name}://"
        out = []
        for info in infos:
            if info.type == pafs.FileType.File:
                e = epoch_of_file(info.path, self.sink_id)
                if e is not None:
                    out.append((f"{scheme}{info.path}" if scheme else info.path, e))
        return out

    def staged_epochs(self) -> Iterable[int]:
        table = self._table()
        if table is None:
            return []
        referenced = (
            {f["file_path"] for f in table.inspect.files().to_pylist()}
            if (table.current_snapshot() is not None)
            else set()
        )
        refs = {p.split("://", 1)[-1] for p in referenced}
        return sorted({e for p, e in self._data_files() if p.split("://", 1)[-1] not in refs})


def validate_schema(opts: IcebergSinkOptions, schema: pa.Schema) -> None:
    for p in opts.partition_by:
        m = _TRANSFORM.match(p)
        col = m.group(3) if m else p
        if col not in schema.names:
            raise SchemaMismatchError(
                f"partition_by column {col!r} is not in the DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )


def make_writer(opts: IcebergSinkOptions, ctx: WriterContext) -> IcebergWriter:
    return IcebergWriter(opts, ctx)


def make_coordinator(opts: IcebergSinkOptions, sink_id: str) -> IcebergCoordinator:
    _require()
    return IcebergCoordinator(opts, sink_id)


SINK: SinkPlugin[IcebergSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="iceberg",
    options_model=IcebergSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    committable_codec=JsonCodec[dict[str, Any]](version=1),
    default_sink_id=lambda o: f"iceberg:{o.catalog_name}.{o.table}",
    validate_schema=validate_schema,
    description="Apache Iceberg tables through pyiceberg (any catalog; local or S3 warehouse)",
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    return [SINK]
