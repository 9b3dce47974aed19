"""The ``iceberg`` sink: parallel Parquet data files, one idempotent snapshot per epoch.

* ``writer_setup`` (driver) loads or creates the table (with its partition spec, in one
  metadata commit), checks ``partition_by`` against an existing table's spec, evolves its
  schema with the DataFrame's new columns (keeping required columns required), and ships the
  table metadata to the writers.
* Writers (Spark tasks) write Parquet data files into the table location with pyiceberg's own
  writing code (field ids, partition values, column statistics) and return their
  descriptions. The write uuid in every file name encodes the sink and the epoch, so data
  files of an epoch that never committed can be found and deleted.
* ``commit`` appends the epoch's files in one snapshot whose summary carries
  ``eosink.sink-id`` and ``eosink.epoch``. In the same metadata commit it raises the table
  property ``eosink.epoch.<sink key>`` to the newest committed epoch (never lowers it) and
  adds the epoch to ``eosink.<sink key>.epochs`` (committed epochs as ranges). An epoch is
  already committed when it equals the newest, is in the ranges, or a snapshot in the
  ancestry of the current one carries the sink and exactly this epoch. Epochs may be
  committed out of order (a backfill of an older epoch). After the commit, data files of the
  epoch that no committable names (a dead executor, a failed task attempt) are deleted.
* ``abort`` deletes the epoch's data files; a file referenced by the table is never deleted.
* The sink's marker (:class:`eosink.TargetMarker`) is the table property
  ``eosink.<sink key>.marker``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import itertools
import json
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
    ConfigError,
    CoordinatedSinkWriter,
    JsonCodec,
    MissingExtraError,
    SchemaMismatchError,
    SinkCommitCoordinator,
    SinkError,
    SinkPlugin,
    StagedEpochs,
    TargetMarker,
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


def _partition_fields(fields: Sequence[str]) -> list[tuple[str, Any, str]]:
    """(source column, transform, partition field name) of every ``partition_by`` entry."""
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
        "year": YearTransform,
        "month": MonthTransform,
        "day": DayTransform,
        "hour": HourTransform,
    }
    out: list[tuple[str, Any, str]] = []
    for p in fields:
        m = _TRANSFORM.match(p)
        if m is None:
            out.append((p, IdentityTransform(), p))
            continue
        name, arg, col = m.group(1).lower(), m.group(2), m.group(3)
        if name == "identity":
            out.append((col, IdentityTransform(), col))
        elif name == "bucket":
            out.append((col, BucketTransform(int(arg)), f"{col}_bucket"))
        elif name == "truncate":
            out.append((col, TruncateTransform(int(arg)), f"{col}_trunc"))
        else:
            out.append((col, simple[name](), f"{col}_{name}"))
    return out


def _describe_partition(col: str, transform: Any) -> str:
    """One partition field as a ``partition_by`` entry: ``grp``, ``day(ts)``, ``bucket(16, id)``."""
    from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform

    if isinstance(transform, IdentityTransform):
        return col
    if isinstance(transform, BucketTransform):
        return f"bucket({transform.num_buckets}, {col})"
    if isinstance(transform, TruncateTransform):
        return f"truncate({transform.width}, {col})"
    return f"{transform}({col})"


def _table_partitioning(table: Any) -> list[str]:
    """The table's current partition spec as ``partition_by`` entries (void fields left out)."""
    from pyiceberg.transforms import VoidTransform

    schema = table.schema()
    return [
        _describe_partition(schema.find_column_name(f.source_id) or f"#{f.source_id}", f.transform)
        for f in table.spec().fields
        if not isinstance(f.transform, VoidTransform)
    ]


def _check_transforms_writable(transforms: Iterable[Any], table_name: str) -> None:
    """pyiceberg computes every partition value but identity ones (bucket, truncate, year,
    month, day, hour) with the optional ``pyiceberg-core`` package: say so on the driver,
    before a table is created or a Spark task fails."""
    import importlib.util

    from pyiceberg.transforms import IdentityTransform, VoidTransform

    needs = sorted(
        {str(t) for t in transforms if not isinstance(t, (IdentityTransform, VoidTransform))}
    )
    if needs and importlib.util.find_spec("pyiceberg_core") is None:
        raise ConfigError(
            f"Iceberg table {table_name!r}: writing partition transforms {', '.join(needs)} "
            "needs the Python package pyiceberg-core, which is not installed. Install it "
            "with: pip install 'pyiceberg[pyiceberg-core]' (or partition by plain columns)."
        )


def _new_table_schema_and_spec(
    schema: pa.Schema, fields: Sequence[str], format_version: int = 2
) -> tuple[Any, Any]:
    """The Iceberg schema (fresh field ids) of ``schema`` and the partition spec built on it."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import (
        PARTITION_FIELD_ID_START,
        UNPARTITIONED_PARTITION_SPEC,
        PartitionField,
        PartitionSpec,
    )
    from pyiceberg.schema import assign_fresh_schema_ids

    ice = assign_fresh_schema_ids(
        Catalog._convert_schema_if_needed(schema, format_version)  # type: ignore[arg-type]
    )
    if not fields:
        return ice, UNPARTITIONED_PARTITION_SPEC
    parts = []
    for i, (col, transform, name) in enumerate(_partition_fields(fields)):
        source = ice.find_field(col)
        parts.append(
            PartitionField(
                source_id=source.field_id,
                field_id=PARTITION_FIELD_ID_START + i,
                transform=transform,
                name=name,
            )
        )
    return ice, PartitionSpec(*parts)


def _keep_required(field: pa.Field, existing: Any) -> pa.Field:
    """``field`` with the nullability of the table's column ``existing`` (a NestedField).

    A column (or nested field) the table does not have yet is optional: rows already in the
    table have no value for it. A column the table has keeps its nullability, so that a
    nullable Arrow field never turns a ``required`` column ``optional`` (only types evolve).
    """
    from pyiceberg.types import ListType, MapType, StructType

    if existing is None:
        return _optional_tree(field)
    t, it = field.type, existing.field_type
    if pa.types.is_struct(t) and isinstance(it, StructType):
        t = pa.struct(
            [
                _keep_required(t.field(i), it.field_by_name(t.field(i).name))
                for i in range(t.num_fields)
            ]
        )
    elif pa.types.is_large_list(t) and isinstance(it, ListType):
        t = pa.large_list(_keep_required(t.value_field, it.element_field))
    elif pa.types.is_list(t) and isinstance(it, ListType):
        t = pa.list_(_keep_required(t.value_field, it.element_field))
    elif pa.types.is_map(t) and isinstance(it, MapType):
        t = pa.map_(t.key_field, _keep_required(t.item_field, it.value_field))
    return field.with_type(t).with_nullable(not existing.required)


def _optional_tree(field: pa.Field) -> pa.Field:
    """``field`` nullable, and every nested struct field too (a new column is optional)."""
    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([_optional_tree(t.field(i)) for i in range(t.num_fields)])
    return field.with_type(t).with_nullable(True)


def _norm(path: str) -> str:
    """A data file path without its scheme (listings and manifests spell it differently)."""
    return path.split("://", 1)[-1]


# -- committed epochs as ranges: "0-11,14,20-25" ----------------------------------------
_MAX_RANGES = 1000


def _parse_ranges(text: str | None) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def _in_ranges(ranges: list[tuple[int, int]], epoch: int) -> bool:
    return any(lo <= epoch <= hi for lo, hi in ranges)


def _add_to_ranges(ranges: list[tuple[int, int]], epoch: int) -> str:
    """The ranges with ``epoch`` added, merged; the oldest ranges beyond the cap are dropped
    (for those, the snapshot ancestry is the only record)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted([*ranges, (epoch, epoch)]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    merged = merged[-_MAX_RANGES:]
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged)


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
        _check_required(metadata.schema(), table, self.opts.table)
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


class IcebergCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]], StagedEpochs, TargetMarker
):
    def __init__(self, opts: IcebergSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        key = f"{sink_key(sink_id):08x}"
        self.prop = f"eosink.epoch.{key}"  # the newest committed epoch (last_epoch)
        self.epochs_prop = f"eosink.{key}.epochs"  # every committed epoch, as ranges
        self.marker_prop = f"eosink.{key}.marker"
        self.catalog: Any = None
        self.commits = 0
        # A marker written before the table exists: stored when the table is created (same
        # metadata commit) or, if another process creates it, at the next writer_setup/commit.
        self._pending_marker: str | None = None

    def init(self) -> None:
        self.catalog = load_catalog(self.opts)

    def target_id(self) -> str | None:
        # Stable before and after the table exists (it may be created by writer_setup,
        # after the core bound the sink to this id), hence no table uuid; the catalog's
        # location (credentials removed) tells two catalogs of the same name apart.
        props = self.opts.catalog_properties()
        where = re.sub(r"//[^/@]*@", "//", props.get("uri") or props.get("warehouse") or "")
        name = f"iceberg:{self.opts.catalog_name}.{self.opts.table}"
        return f"{name} in {where}" if where else name

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

    # -- the sink's marker in the table (TargetMarker) ----------------------------------
    def read_marker(self) -> dict[str, Any] | None:
        table = self._table()
        if table is None:
            return None
        raw = table.properties.get(self.marker_prop)
        last = table.properties.get(self.prop)
        if raw is None and last is None:
            return None
        marker: dict[str, Any] = {}
        if raw is not None:
            try:
                marker = dict(json.loads(raw))
            except (ValueError, TypeError):
                raise SinkError(
                    f"Iceberg table {self.opts.table!r}: table property {self.marker_prop!r} "
                    f"is not an eosink marker (not a JSON object): {raw[:200]!r}"
                ) from None
        marker["last_epoch"] = int(last) if last is not None else -1
        return marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        raw = json.dumps(
            {k: v for k, v in marker.items() if k != "last_epoch"},
            separators=(",", ":"),
            sort_keys=True,
        )
        table = self._table()
        if table is None:
            self._pending_marker = raw
            log.info(
                "iceberg: table %s does not exist yet; the marker of %s is stored when it is "
                "created",
                self.opts.table,
                self.sink_id,
            )
            return
        self._store_marker(table, raw)

    def _store_marker(self, table: Any, raw: str) -> None:
        """Set the marker property in one metadata commit (retried on a concurrent commit)."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(10):
            if table.properties.get(self.marker_prop) == raw:
                break
            try:
                with table.transaction() as tx:
                    tx.set_properties({self.marker_prop: raw})
                break
            except CommitFailedException:
                if attempt == 9:
                    raise SinkError(
                        f"Iceberg table {self.opts.table!r}: cannot store the eosink marker "
                        "(every attempt conflicted with another commit)"
                    ) from None
                table = self._table()
                if table is None:
                    raise SinkError(f"Iceberg table {self.opts.table!r} disappeared") from None
        self._pending_marker = None

    # -- driver, before the writers ------------------------------------------------------
    def writer_setup(self, schema: pa.Schema) -> Any:
        table = self._table()
        created = False
        if table is None:
            table, created = self._create(schema)
        if created:
            metadata, evolve = table.metadata, None
        else:
            self._check_partitioning(table)
            _check_transforms_writable((f.transform for f in table.spec().fields), self.opts.table)
            if self._pending_marker is not None:
                self._store_marker(table, self._pending_marker)
                table = self._table()
            metadata, evolve = self._evolve(table, schema)
        props = self.opts.catalog_properties()
        return {
            "metadata": metadata.model_dump_json(),
            "io": {**props, **table.io.properties},
            "evolve": evolve,
        }

    def _create(self, schema: pa.Schema) -> tuple[Any, bool]:
        """Create the table with its partition spec in one metadata commit.

        Returns (table, True), or (table, False) when another process created it meanwhile.
        """
        from pyiceberg.exceptions import TableAlreadyExistsError

        if not self.opts.create_table:
            raise SinkError(
                f"Iceberg table {self.opts.table!r} does not exist (create_table=False)"
            )
        validate_schema(self.opts, schema)
        _check_transforms_writable(
            (t for _, t, _ in _partition_fields(self.opts.partition_by)), self.opts.table
        )
        ns = self.opts.table.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(ns)
        ice_schema, spec = _new_table_schema_and_spec(schema, self.opts.partition_by)
        properties = {}
        if self._pending_marker is not None:
            properties[self.marker_prop] = self._pending_marker
        try:
            table = self.catalog.create_table(
                self.opts.table, schema=ice_schema, partition_spec=spec, properties=properties
            )
        except TableAlreadyExistsError:
            table = self._table()
            if table is None:
                raise SinkError(
                    f"Iceberg table {self.opts.table!r} was created and dropped meanwhile"
                ) from None
            log.info("iceberg: table %s was created by another process", self.opts.table)
            return table, False
        self._pending_marker = None
        log.info(
            "iceberg: created table %s at %s (partitioned by: %s)",
            self.opts.table,
            table.location(),
            ", ".join(self.opts.partition_by) or "nothing",
        )
        return table, True

    def _check_partitioning(self, table: Any) -> None:
        """``partition_by`` must name the existing table's partition spec (eosink never
        changes the spec of an existing table)."""
        if not self.opts.partition_by:
            return
        have = _table_partitioning(table)
        want = [_describe_partition(c, t) for c, t, _ in _partition_fields(self.opts.partition_by)]
        if sorted(have) == sorted(want):
            return
        raise ConfigError(
            f"Iceberg table {self.opts.table!r} exists and is "
            + (f"partitioned by {', '.join(have)}" if have else "unpartitioned")
            + f", but partition_by asks for {', '.join(want)}. eosink does not change the "
            "partition spec of an existing table. Remove partition_by to write with the "
            "table's own spec"
            + (f" (or pass partition_by={have!r})" if have else "")
            + ", or evolve the table's spec first (Spark SQL: ALTER TABLE ... ADD/DROP "
            "PARTITION FIELD; pyiceberg: table.update_spec()). Nothing was written."
        )

    def _evolve(self, table: Any, schema: pa.Schema) -> tuple[Any, dict[str, str] | None]:
        """Stage the DataFrame's new columns (and allowed promotions) without committing.

        Returns the table metadata the writers use (new columns have their field ids) and the
        evolution to apply in the epoch's commit (None when the schema is unchanged).
        Columns the table has keep their nullability (a nullable Arrow field never makes a
        required column optional); new columns are optional.
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
        evolved = self._keep_table_nullability(schema, current)
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
        if staged.schema().as_struct() == current.as_struct():
            return table.metadata, None  # e.g. int data into a long column: nothing changes
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

    @staticmethod
    def _keep_table_nullability(schema: pa.Schema, current: Any) -> pa.Schema:
        by_name = {f.name: f for f in current.fields}
        return pa.schema([_keep_required(f, by_name.get(f.name)) for f in schema])

    # -- phases --------------------------------------------------------------------------
    def pre_commit(
        self, epoch: int, results: Sequence[dict[str, Any]]
    ) -> eosink.Prepared[dict[str, Any]]:
        files = [f for r in results for f in r["files"]]
        evolve = next((r["evolve"] for r in results if r.get("evolve")), None)
        return eosink.Prepared(
            {"files": files, "table": self.opts.table, "evolve": evolve},
            files=len(files),
            bytes=sum(int(f["file_size_in_bytes"]) for f in files),
        )

    def _last_epoch(self, table: Any) -> int:
        return int(table.properties.get(self.prop, "-1"))

    def _committed(self, table: Any, epoch: int) -> bool:
        """Whether exactly ``epoch`` of this sink is committed in ``table``.

        Epochs may be committed out of order (a backfill of an older epoch), so the newest
        committed epoch alone only answers for itself and for newer epochs.
        """
        last = self._last_epoch(table)
        if epoch == last:
            return True
        if epoch > last:
            return False
        if _in_ranges(_parse_ranges(table.properties.get(self.epochs_prop)), epoch):
            return True
        from pyiceberg.table.snapshots import ancestors_of

        for snap in ancestors_of(table.current_snapshot(), table.metadata):
            extra = snap.summary.additional_properties if snap.summary else {}
            if extra.get("eosink.sink-id") == self.sink_id and extra.get("eosink.epoch") == str(
                epoch
            ):
                return True
        return False

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        table = self._table()
        if table is None:
            raise SinkError(f"Iceberg table {self.opts.table!r} disappeared")
        if self._committed(table, epoch):
            log.info("iceberg: epoch %d of %s already committed", epoch, self.sink_id)
            self._sweep_epoch(table, epoch, committable)
            return
        evolve = committable.get("evolve")
        if not committable["files"] and not evolve:
            self._sweep_epoch(table, epoch, committable)
            return
        data_files = [data_file_from_json(f) for f in committable["files"]]
        props = {
            self.prop: str(max(self._last_epoch(table), epoch)),
            self.epochs_prop: _add_to_ranges(
                _parse_ranges(table.properties.get(self.epochs_prop)), epoch
            ),
        }
        if self._pending_marker is not None:
            props[self.marker_prop] = self._pending_marker
        try:
            with table.transaction() as tx:
                if evolve:
                    self._apply_evolution(tx, evolve, epoch)
                summary = {"eosink.sink-id": self.sink_id, "eosink.epoch": str(epoch)}
                with tx.update_snapshot(snapshot_properties=summary).fast_append() as app:
                    for i, df in enumerate(data_files):
                        app.append_data_file(df)
                        if i == 0:
                            fault_point("mid_commit")
                tx.set_properties(props)
        except CommitFailedException as exc:
            raise CommitFailedError(f"iceberg commit of epoch {epoch} conflicted: {exc}") from None
        except CommitStateUnknownException as exc:
            raise CommitStateUnknownError(f"iceberg commit of epoch {epoch}: {exc}") from None
        self._pending_marker = None
        self.commits += 1
        self._sweep_epoch(table, epoch, committable)
        if self.opts.expire_snapshots_keep:
            self._expire(self.opts.expire_snapshots_keep)

    def _apply_evolution(self, tx: Any, evolve: dict[str, str], epoch: int) -> None:
        """Apply the epoch's schema change in its commit; the field ids must be the writers'."""
        from pyiceberg.schema import Schema

        arrow = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(evolve["arrow_schema"])))
        # Committables written before required columns were kept required carry nullable
        # fields: never let them turn a required column optional.
        arrow = self._keep_table_nullability(arrow, tx.table_metadata.schema())
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

    # -- data files: orphans and abort ---------------------------------------------------
    def _referenced(self, table: Any) -> set[str]:
        """Every data file path (without scheme) that any snapshot of ``table`` references."""
        out: set[str] = set()
        seen: set[str] = set()
        io = table.io
        for snap in table.snapshots():
            for manifest in snap.manifests(io):
                if manifest.manifest_path in seen:
                    continue
                seen.add(manifest.manifest_path)
                for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                    out.add(_norm(entry.data_file.file_path))
        return out

    def _delete_unreferenced(
        self,
        table: Any | None,
        paths: Iterable[str],
        refs: set[str] | None = None,
        fault: str | None = None,
    ) -> int:
        """Delete ``paths`` except those ``table`` references (``refs``: already computed);
        return how many were deleted."""
        todo = sorted(set(paths))
        if not todo:
            return 0
        if refs is None and table is not None:
            refs = self._referenced(table)
        if refs:
            todo = [p for p in todo if _norm(p) not in refs]
        io = self._io()
        for i, p in enumerate(todo):
            io.delete(p)
            if i == 0 and fault:
                fault_point(fault)
        return len(todo)

    def _sweep_epoch(self, table: Any, epoch: int, committable: dict[str, Any]) -> None:
        """After ``epoch`` is committed: delete its data files that the committable does not
        name (a dead executor's, a failed or speculative task attempt's). Never raises."""
        try:
            keep = {_norm(f["file_path"]) for f in committable.get("files", [])}
            table = table.refresh()
            extra = [p for p, e in self._data_files(table) if e == epoch and _norm(p) not in keep]
            if extra:
                n = self._delete_unreferenced(table, extra)
                if n:
                    log.info(
                        "iceberg: deleted %d orphaned data file(s) of committed epoch %d of %s",
                        n,
                        epoch,
                        self.sink_id,
                    )
        except Exception:
            log.warning(
                "iceberg: could not sweep orphaned data files of epoch %d; retried at the "
                "next start",
                epoch,
                exc_info=True,
            )

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        try:
            table = self._table()
            paths = {f["file_path"] for f in (committable or {}).get("files", [])}
            paths |= {p for p, e in self._data_files(table) if e == epoch}
            # Never a file the table references: the core also aborts the output of a replay
            # of an epoch that is committed (its own files are in the table).
            self._delete_unreferenced(table, paths, fault="mid_abort")
        except Exception:
            log.exception("iceberg: abort of epoch %d could not delete every data file", epoch)

    def _data_files(self, table: Any | None = None) -> list[tuple[str, int]]:
        """(path, epoch) of every data file this sink wrote under the table's data location."""
        table = table if table is not None else self._table()
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
        """Epochs with data files that the table does not reference and that are not
        committed (the core aborts them). Unreferenced files of epochs that ARE committed in
        the table (a dead executor's, a failed task attempt's; the core never offers a
        committed epoch to abort) are deleted here."""
        table = self._table()
        if table is None:
            return []
        files = self._data_files(table)
        if not files:
            return []
        refs = self._referenced(table)
        unreferenced: dict[int, list[str]] = {}
        for p, e in files:
            if _norm(p) not in refs:
                unreferenced.setdefault(e, []).append(p)
        staged = []
        for e, paths in sorted(unreferenced.items()):
            if not self._committed(table, e):
                staged.append(e)
                continue
            try:
                n = self._delete_unreferenced(table, paths, refs=refs)
            except Exception:
                log.warning(
                    "iceberg: could not delete orphaned data files of committed epoch %d",
                    e,
                    exc_info=True,
                )
                continue
            log.info(
                "iceberg: deleted %d orphaned data file(s) of committed epoch %d of %s",
                n,
                e,
                self.sink_id,
            )
        return staged


def validate_schema(opts: IcebergSinkOptions, schema: pa.Schema) -> None:
    for p in opts.partition_by:
        m = _TRANSFORM.match(p)
        col = m.group(3) if m else p
        if col not in schema.names:
            raise SchemaMismatchError(
                f"partition_by column {col!r} is not in the DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )


def _check_required(schema: Any, data: pa.Table, table_name: str) -> None:
    """Raise SchemaMismatchError naming the column when a required column gets a null.

    The DataFrame's field may be nullable while the table's column is required: that is fine
    as long as the data has no null there (pyarrow would otherwise fail with a less clear
    error deep inside the Parquet writer).
    """
    for f in schema.fields:
        if f.required and f.name in data.column_names:
            nulls = data.column(f.name).null_count
            if nulls:
                raise SchemaMismatchError(
                    f"Iceberg table {table_name!r}: column {f.name!r} is required (NOT NULL) "
                    f"in the table, but {nulls} row(s) of this epoch have a null there. "
                    "Fill or filter the nulls (e.g. coalesce), or make the column optional "
                    "in the table (pyiceberg: update_schema().make_column_optional)."
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
    # pyiceberg is imported inside the factories only: without it the sink is still listed.
    requires={"pyiceberg": "eosink[iceberg]"},
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    return [SINK]
