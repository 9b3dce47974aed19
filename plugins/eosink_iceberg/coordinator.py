"""The iceberg sink's coordinator (on the driver): the table, its schema, commits, cleanup.

* ``validate_schema`` (before any meta store row or Spark job) checks what can be known from
  the catalog without changing it: a missing table with ``create_table=False``, a partition
  spec (asked for, or an existing table's) that does not apply to its columns' types,
  ``partition_by`` against an existing table's spec, the table's required columns.
* ``writer_setup`` loads or creates the table (with its partition spec, in one metadata
  commit), checks an existing table again (:func:`check_table`), evolves its schema with
  the DataFrame's new columns (keeping required columns required), and ships the table
  metadata to the writers.
* The data files are written by Spark's own Parquet writer (``write_with_spark``, the native
  path, ``native.py``) or by Python writers in Spark tasks (``writer.py``); both return the
  same results.
* ``commit`` appends the epoch's files in one snapshot whose summary carries
  ``eosink.sink-id`` and ``eosink.epoch``. In the same metadata commit it raises the table
  property ``eosink.epoch.<sink key>`` to the newest committed epoch (never lowers it) and
  adds the epoch to ``eosink.<sink key>.epochs`` (committed epochs as ranges). An epoch is
  already committed when it equals the newest, is in the ranges, or a snapshot in the
  ancestry of the current one carries the sink and exactly this epoch. Epochs may be
  committed out of order (a backfill of an older epoch). After the commit, data files of the
  epoch that no committable names (a dead executor, a failed task attempt) are deleted.
* ``mode="upsert"`` (``cdc.py``): the writers stage the epoch's change rows as Parquet
  files; ``pre_commit`` checks them; ``commit`` rewrites the data files holding the epoch's
  keys and adds the upserted rows in one snapshot with the same marker (copy-on-write).
* ``abort`` deletes the epoch's data files; a file referenced by the table is never deleted.
* The sink's marker (:class:`eosink.TargetMarker`) is the table property
  ``eosink.<sink key>.marker``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

import eosink
from eosink import (
    CommitFailedError,
    CommitOutcome,
    CommitStateUnknownError,
    ConfigError,
    SchemaMismatchError,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import abandon_hint

from . import _compat, cdc
from .datafiles import data_file_from_json, epoch_of_file, native_write_dir, norm, sink_key
from .options import IcebergSinkOptions, load_catalog, redact, require_pyiceberg
from .transforms import (
    PartitionTerm,
    check_transforms_writable,
    source_type_error,
    table_terms,
)
from .writer import utc_timestamps

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["IcebergCoordinator", "check_table", "make_coordinator", "validate_schema"]

log = logging.getLogger("eosink.iceberg")


def validate_schema(opts: IcebergSinkOptions, schema: pa.Schema) -> None:
    """Everything that can be known before anything is written (``prepare_sink`` calls this
    before any meta store row, Spark job or table exists), the catalog read but not changed:

    * every ``partition_by`` source column is a column of the DataFrame;
    * the table does not exist: ``create_table`` is on, and every ``partition_by`` transform
      applies to its source column's type (as the Iceberg spec defines them): a table is
      never created with a spec no row can be written with;
    * the table exists: its own spec is valid for its schema (an older eosink created tables
      without that check), ``partition_by`` names its spec, and the DataFrame has every
      required column of the table;
    * the transforms can be computed (``pyiceberg-core``).

    Raises:
        SchemaMismatchError: a column is missing (named).
        ConfigError: the table is missing with ``create_table=False``, or a partition spec
            (asked for or the table's) is invalid; the message says what to do.
        SinkError: the catalog or the table cannot be read.
    """
    for t in opts.partition_by:
        if t.source not in schema.names:
            raise SchemaMismatchError(
                f"partition_by column {t.source!r} is not in the DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )
    schema = utc_timestamps(schema)
    table = _existing_table(opts)
    if opts.mode == "upsert":
        cdc.check_columns(opts, schema, table)
        schema = cdc.table_columns(opts, schema)
    if table is None:
        if not opts.create_table:
            raise ConfigError(_missing_table_message(opts))
        _check_new_spec(opts, schema)
        check_transforms_writable(opts.partition_by, opts.table)
        return
    check_table(opts, table, schema)


def check_table(opts: IcebergSinkOptions, table: Any, schema: pa.Schema) -> None:
    """The checks of an existing table (see :func:`validate_schema`), in this order: the
    table's own spec, ``partition_by`` against it, the transforms, the required columns."""
    _check_table_spec(opts, table)
    _check_partitioning(opts, table)
    check_transforms_writable((t for _, t in table_terms(table)), opts.table)
    _check_required_columns(opts, table, schema)


def _existing_table(opts: IcebergSinkOptions) -> Any:
    """The table, or None when it does not exist (an embedded catalog that does not exist
    yet is not created to find that out)."""
    if not opts.catalog_may_hold_tables():
        return None
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    catalog = load_catalog(opts)
    try:
        return catalog.load_table(opts.table)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except Exception as exc:
        raise SinkError(redact(f"cannot load Iceberg table {opts.table!r}: {exc}", opts)) from None


def _missing_table_message(opts: IcebergSinkOptions) -> str:
    return (
        f"Iceberg table {opts.table!r} does not exist in catalog {opts.catalog_name!r}, and "
        "create_table=False. Create the table first, check the table name and the catalog "
        "options, or let eosink create it from the DataFrame's schema (create_table=True, "
        "the default). Nothing was written."
    )


def _check_new_spec(opts: IcebergSinkOptions, schema: pa.Schema) -> None:
    """Every ``partition_by`` transform applies to its source column's Iceberg type."""
    if not opts.partition_by:
        return
    try:
        ice = _compat.new_table_schema(schema)
    except Exception:  # a type Iceberg has no counterpart for: creating the table says so
        return
    for t in opts.partition_by:
        try:
            field = ice.find_field(t.source)
        except ValueError:
            raise SchemaMismatchError(
                f"partition_by {str(t)!r}: column {t.source!r} is not in the DataFrame "
                f"(columns: {', '.join(schema.names)})"
            ) from None
        why = source_type_error(t, field.field_type)
        if why is not None:
            raise ConfigError(
                f"partition_by {str(t)!r} is not a valid Iceberg partition field: {why}. "
                f"The table {opts.table!r} was not created; nothing was written."
            )


def _check_table_spec(opts: IcebergSinkOptions, table: Any) -> None:
    """The table's own partition spec applies to its schema. A table an older eosink created
    with, e.g., ``day`` of a string column can hold no row: say what to do."""
    schema = table.schema()
    for field, term in table_terms(table):
        try:
            source_type = schema.find_field(field.source_id).field_type
        except ValueError:
            continue
        why = source_type_error(term, source_type)
        if why is None:
            continue
        empty = table.current_snapshot() is None
        valid = opts.partition_by and all(_term_error(t, schema) is None for t in opts.partition_by)
        wanted = [str(t) for t in opts.partition_by]
        again = f"partition_by={wanted!r}" if valid else "a valid partition_by (or none)"
        raise ConfigError(
            f"Iceberg table {opts.table!r} has the partition field {field.name!r} = {term}, "
            f"which is not valid: {why}. No row can be written to this table, and its spec "
            "cannot be evolved in place (pyiceberg refuses every change to a table whose "
            "spec does not apply to its schema); eosink versions before this check created "
            "such tables from partition_by. "
            + (
                "The table holds no data (no snapshot). "
                if empty
                else "The table holds snapshots: keep them under another name first "
                f"(pyiceberg: catalog.rename_table({opts.table!r}, '<new name>')). "
            )
            + f"Drop the table (pyiceberg: catalog.drop_table({opts.table!r}); Spark SQL: "
            f"DROP TABLE {opts.table}) and run again with {again}: eosink creates it with "
            "that spec. Nothing was written."
        )


def _term_error(term: PartitionTerm, schema: Any) -> str | None:
    """:func:`source_type_error` of ``term`` on an Iceberg schema (a missing column: why)."""
    try:
        field = schema.find_field(term.source)
    except ValueError:
        return f"column {term.source!r} is not in the table"
    return source_type_error(term, field.field_type)


def _check_partitioning(opts: IcebergSinkOptions, table: Any) -> None:
    """``partition_by`` must name the existing table's partition spec (eosink never
    changes the spec of an existing table)."""
    if not opts.partition_by:
        return
    have = [str(t) for _, t in table_terms(table)]
    want = [str(t) for t in opts.partition_by]
    if sorted(have) == sorted(want):
        return
    raise ConfigError(
        f"Iceberg table {opts.table!r} exists and is "
        + (f"partitioned by {', '.join(have)}" if have else "unpartitioned")
        + f", but partition_by asks for {', '.join(want)}. eosink does not change the "
        "partition spec of an existing table. Remove partition_by to write with the "
        "table's own spec"
        + (f" (or pass partition_by={have!r})" if have else "")
        + ", or evolve the table's spec first (Spark SQL: ALTER TABLE ... ADD/DROP "
        "PARTITION FIELD; pyiceberg: table.update_spec()). Nothing was written."
    )


def _check_required_columns(opts: IcebergSinkOptions, table: Any, schema: pa.Schema) -> None:
    """Every required (non-null) column of the table is a column of the DataFrame."""
    missing = [f for f in table.schema().fields if f.required and f.name not in schema.names]
    if not missing:
        return
    f = missing[0]
    raise SchemaMismatchError(
        f"Iceberg table {opts.table!r} has the required (non-null) column {f.name!r} "
        f"({f.field_type}), which the DataFrame lacks (columns: {', '.join(schema.names)}): "
        "every row needs a value for it. Add the column to the DataFrame, or make it optional "
        f"in the table (pyiceberg: with table.update_schema() as u: "
        f"u.make_column_optional({f.name!r}); Spark SQL: ALTER TABLE ... ALTER COLUMN "
        f"{f.name} DROP NOT NULL)."
        + (
            f" Other required columns missing: {', '.join(repr(x.name) for x in missing[1:])}."
            if len(missing) > 1
            else ""
        )
        + " Nothing was written."
    )


def _new_table_schema_and_spec(
    schema: pa.Schema, terms: Sequence[PartitionTerm], format_version: int = 2
) -> tuple[Any, Any]:
    """The Iceberg schema (fresh field ids) of ``schema`` and the partition spec built on it."""
    from pyiceberg.partitioning import (
        PARTITION_FIELD_ID_START,
        UNPARTITIONED_PARTITION_SPEC,
        PartitionField,
        PartitionSpec,
    )

    ice = _compat.new_table_schema(schema, format_version)
    if not terms:
        return ice, UNPARTITIONED_PARTITION_SPEC
    parts = []
    for i, t in enumerate(terms):
        source = ice.find_field(t.source)
        parts.append(
            PartitionField(
                source_id=source.field_id,
                field_id=PARTITION_FIELD_ID_START + i,
                transform=t.iceberg(),
                name=t.field_name,
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


# A commit that conflicts with another writer's is redone on the new snapshot this often.
_CONFLICT_ATTEMPTS = 20

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


def _manifest_files(table: Any, snapshots: Iterable[Any], discard_deleted: bool) -> dict[str, str]:
    """The data files the manifests of ``snapshots`` list (each manifest read once), by
    path without scheme (a listing's spelling) -> path as the manifest spells it;
    ``discard_deleted``: without the entries a snapshot marks DELETED."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for snap in snapshots:
        for manifest in snap.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=discard_deleted):
                path = entry.data_file.file_path
                out.setdefault(norm(path), path)
    return out


class IcebergCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    SparkWriter[dict[str, Any]],
):
    """The coordinator of one sink_id (see the module's docstring)."""

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
        # The table metadata the last writer_setup gave the writers (after evolution): what
        # spark_write_unsupported judges.
        self._metadata: Any = None

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
                redact(f"cannot load Iceberg table {self.opts.table!r}: {exc}", self.opts)
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
                with _compat.transaction(table) as tx:
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
        schema = utc_timestamps(schema)  # a session time zone other than UTC: same instants
        if self.opts.mode == "upsert":
            schema = cdc.table_columns(self.opts, schema)  # the op_column is not written
        table = self._table()
        created = False
        if table is None:
            table, created = self._create(schema)
        if created:
            metadata, evolve = table.metadata, None
        else:
            check_table(self.opts, table, schema)
            if self._pending_marker is not None:
                self._store_marker(table, self._pending_marker)
                table = self._table()
            metadata, evolve = self._evolve(table, schema)
        self._metadata = metadata
        props = self.opts.catalog_properties()
        return {
            "metadata": metadata.model_dump_json(),
            "io": {**props, **table.io.properties},
            "evolve": evolve,
        }

    # -- the native path (SparkWriter) ---------------------------------------------------
    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        """Why Spark's writer cannot write this epoch (``writer="python"``, or what the
        native path cannot express exactly), or None.

        Raises:
            ConfigError: ``writer="spark"`` and the native path cannot write the epoch
                (:class:`~eosink.SchemaMismatchError` when the DataFrame's schema is why).
        """
        from .native import SchemaReason, unsupported

        if self.opts.writer == "python":
            return "the sink's option writer='python'"
        if self.opts.mode == "upsert":  # changes are staged as plain Parquet files
            from .native import _location_problem

            where = self._metadata.location if self._metadata is not None else None
            why = _location_problem(where) if where else None
            if why is not None and self.opts.writer == "spark":
                raise ConfigError(
                    f"Iceberg table {self.opts.table!r}: writer='spark', but Spark cannot "
                    f"stage this epoch's changes: {why}. Use writer='auto' or 'python'."
                )
            return why
        metadata = self._metadata
        if metadata is None:  # writer_setup always runs first; be safe anyway
            table = self._table()
            if table is None:
                return "the table does not exist yet"
            metadata = table.metadata
        why = unsupported(metadata, schema, self.opts.catalog_properties())
        if why is None and self.opts.writer == "auto" and table_terms(metadata):
            # Measured (docs/benchmarks.md): Spark's partitioned write sorts each task's
            # rows by partition; pyiceberg's writers split them in Arrow, 1.5x faster.
            return (
                "the table is partitioned (Python writers write partitioned tables faster "
                "than Spark's sort-based partitioned write; writer='spark' forces Spark's)"
            )
        if why is not None and self.opts.writer == "spark":
            err = SchemaMismatchError if isinstance(why, SchemaReason) else ConfigError
            raise err(
                f"Iceberg table {self.opts.table!r}: writer='spark', but Spark's Parquet "
                f"writer cannot write this epoch exactly: {why}. Use writer='auto' (Python "
                "writers for such epochs) or writer='python'."
            )
        return None if why is None else str(why)

    def write_with_spark(
        self, df: DataFrame, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Stage the epoch with Spark's Parquet writer (see ``native.py``)."""
        if self.opts.mode == "upsert":
            return [cdc.stage_with_spark(df, epoch, attempt, setup, self.sink_id)]
        from .native import write_epoch

        return [write_epoch(df, epoch, attempt, setup, self.opts, self.sink_id)]

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        """Upserts: the staged change files hold every row Spark wrote (their footers)."""
        if self.opts.mode != "upsert":
            return
        staged = sum(int(c["rows"]) for r in results for c in r.get("changes", []))
        if staged != rows:
            raise SinkError(
                f"iceberg sink epoch {epoch}: Spark wrote {rows} change row(s) but the staged "
                f"files hold {staged}: the table's location is not the same for every node "
                "of the cluster (a local path that is not a shared mount?). Nothing was "
                "committed."
            )

    def _create(self, schema: pa.Schema) -> tuple[Any, bool]:
        """Create the table with its partition spec in one metadata commit.

        Returns (table, True), or (table, False) when another process created it meanwhile.
        """
        from pyiceberg.exceptions import TableAlreadyExistsError

        if not self.opts.create_table:
            raise ConfigError(_missing_table_message(self.opts))
        _check_new_spec(self.opts, schema)
        check_transforms_writable(self.opts.partition_by, self.opts.table)
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
            ", ".join(str(t) for t in self.opts.partition_by) or "nothing",
        )
        return table, True

    def _evolve(self, table: Any, schema: pa.Schema) -> tuple[Any, dict[str, str] | None]:
        """Stage the DataFrame's new columns (and allowed promotions) without committing.

        Returns the table metadata the writers use (new columns have their field ids) and the
        evolution to apply in the epoch's commit (None when the schema is unchanged).
        Columns the table has keep their nullability (a nullable Arrow field never makes a
        required column optional); new columns are optional.
        Raises SchemaMismatchError, naming the column, before any file is written.
        """
        current = table.schema()
        names = {f.name for f in current.fields}
        new = [f.name for f in schema if f.name not in names]
        try:
            incoming = _compat.arrow_to_schema(schema, current.name_mapping)
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
        evolve = next((r["evolve"] for r in results if r.get("evolve")), None)
        if self.opts.mode == "upsert":
            return self._pre_commit_changes(epoch, results, evolve)
        files = [f for r in results for f in r["files"]]
        return eosink.Prepared(
            {"files": files, "table": self.opts.table, "evolve": evolve},
            files=len(files),
            bytes=sum(int(f["file_size_in_bytes"]) for f in files),
        )

    def _pre_commit_changes(
        self, epoch: int, results: Sequence[dict[str, Any]], evolve: Any
    ) -> eosink.Prepared[dict[str, Any]]:
        """Phase 1 of an upsert epoch: the checks of :func:`cdc.check_changes`, and no
        newer epoch of the sink committed (its changes would be overwritten by older ones)."""
        changes = [c for r in results for c in r.get("changes", [])]
        table = self._table()
        if table is not None:
            last = self._last_epoch(table)
            if epoch < last:
                raise ConfigError(
                    f"iceberg sink {self.sink_id}: epoch {epoch} holds upserts, but epoch "
                    f"{last} is already committed to {self.opts.table!r}: applying older "
                    "changes after newer ones would overwrite them. Upsert epochs commit in "
                    "order; run this backfill under a new epoch (above "
                    f"{last}) or leave epoch= unset. Nothing was committed."
                )
        # The schema writer_setup staged; without it (format("eosink") commits in another
        # process than its writer_setup) the table's: new columns are never required.
        metadata = (
            self._metadata if self._metadata is not None else getattr(table, "metadata", None)
        )
        required = (
            [] if metadata is None else [f.name for f in metadata.schema().fields if f.required]
        )
        io = self.opts.catalog_properties()
        if table is not None:
            io = {**io, **table.io.properties}
        cdc.check_changes(self.opts, epoch, changes, io, required)
        return eosink.Prepared(
            {
                "mode": "upsert",
                "changes": changes,
                "files": [],
                "keys": list(self.opts.keys),
                "order_by": self.opts.order_by,
                "op_column": self.opts.op_column,
                "delete_ops": list(self.opts.delete_ops),
                "table": self.opts.table,
                "evolve": evolve,
            },
            files=len(changes),
            bytes=sum(int(c.get("size", 0)) for c in changes),
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
        for snap in _compat.snapshot_ancestors(table):
            extra = snap.summary.additional_properties if snap.summary else {}
            if extra.get("eosink.sink-id") == self.sink_id and extra.get("eosink.epoch") == str(
                epoch
            ):
                return True
        return False

    def commit(self, epoch: int, committable: dict[str, Any]) -> CommitOutcome | None:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        table = self._table()
        if table is None:
            raise SinkError(f"Iceberg table {self.opts.table!r} disappeared")
        if self._committed(table, epoch):
            if committable.get("mode") == "upsert":
                self._sweep_changes(table, epoch, keep=None)
            else:
                self._sweep_epoch(table, epoch, committable)
            return CommitOutcome.already_committed("a snapshot of the table has it")
        evolve = committable.get("evolve")
        if committable.get("mode") == "upsert":
            self._commit_changes(table, epoch, committable)
            return None
        if not committable["files"] and not evolve:
            self._sweep_epoch(table, epoch, committable)
            return None
        data_files = [data_file_from_json(f) for f in committable["files"]]
        self._check_present(table, epoch, [df.file_path for df in data_files], "data")
        props = self._epoch_props(table, epoch)
        try:
            with _compat.transaction(table) as tx:
                if evolve:
                    self._apply_evolution(tx, evolve, epoch)
                summary = {"eosink.sink-id": self.sink_id, "eosink.epoch": str(epoch)}
                with tx.update_snapshot(snapshot_properties=summary).fast_append() as app:
                    for i, df in enumerate(data_files):
                        app.append_data_file(df)
                        if i == 0:
                            fault_point("mid_commit", site="append")
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
        return None

    def _check_present(self, table: Any, epoch: int, paths: list[str], kind: str) -> None:
        """Refuse to commit an epoch whose files are gone: deleted while it was PENDING (an
        orphan-file cleanup such as Iceberg's ``remove_orphan_files``, which takes files no
        snapshot references for garbage, or a storage lifecycle rule). Committing would
        make the table reference missing files (readers fail); its rows are lost either way.

        Raises:
            SinkError: (permanent) naming the missing files and ``eosink abandon``.
        """
        if not paths:
            return
        from concurrent.futures import ThreadPoolExecutor

        def gone(path: str) -> bool:
            try:
                return not table.io.new_input(path).exists()
            except FileNotFoundError:
                return True

        with ThreadPoolExecutor(min(8, len(paths))) as pool:
            missing = [p for p, g in zip(paths, pool.map(gone, paths), strict=True) if g]
        if not missing:
            return
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        shown = ", ".join(missing[:3]) + more
        raise SinkError(
            f"iceberg sink {self.sink_id}: epoch {epoch} cannot be committed: {len(missing)} of "
            f"its {len(paths)} {kind} files are gone ({shown}). They were deleted while the epoch "
            "was PENDING, by an orphan-file cleanup (remove_orphan_files takes files no "
            "snapshot references yet) or a storage lifecycle rule; committing them would "
            "leave the table referencing missing files. " + abandon_hint(self.sink_id, epoch)
        )

    def _commit_changes(self, table: Any, epoch: int, committable: dict[str, Any]) -> None:
        """Phase 2 of an upsert epoch (see ``cdc.py``): one table commit that rewrites the
        data files holding the epoch's keys without them and adds the upserted rows; redone
        on the new snapshot when another writer committed meanwhile."""
        from pyiceberg.exceptions import (
            CommitFailedException,
            CommitStateUnknownException,
            ValidationException,
        )

        # The committable says how the epoch is applied, whatever this run's options.
        spec = self.opts.model_copy(
            update={
                "mode": "upsert",
                "keys": tuple(committable["keys"]),
                "order_by": committable.get("order_by"),
                "op_column": committable.get("op_column"),
                "delete_ops": tuple(committable.get("delete_ops") or ("d",)),
            }
        )
        io_props = {**self.opts.catalog_properties(), **table.io.properties}
        t0 = time.perf_counter()
        staged = [c["path"] for c in committable["changes"] if c.get("rows")]
        self._check_present(table, epoch, staged, "change")
        changes = cdc.read_changes(spec, committable["changes"], io_props)
        evolve = committable.get("evolve")
        if changes.keys.num_rows == 0 and not evolve:
            self._sweep_changes(table, epoch, keep=set())
            return
        summary = {"eosink.sink-id": self.sink_id, "eosink.epoch": str(epoch)}
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            written: list[Any] = []
            removed = 0
            try:
                tx = _compat.transaction(table)
                if evolve:
                    self._apply_evolution(tx, evolve, epoch)
                metadata = tx.table_metadata
                gone, kept, removed = cdc.rewrite_plan(table, metadata, changes.keys, table.io)
                where = cdc.new_files_dir(table.location(), self.sink_id, epoch)
                if kept is not None:
                    written += cdc.write_data(metadata, kept, table.io, self.sink_id, epoch, where)
                written += cdc.write_data(
                    metadata, changes.upserts, table.io, self.sink_id, epoch, where
                )
                fault_point("mid_commit", site="upsert")
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as ow:
                    for f in gone:
                        ow.delete_data_file(f)
                    for f in written:
                        ow.append_data_file(f)
                tx.set_properties(self._epoch_props(table, epoch))
                tx.commit_transaction()
            except (CommitFailedException, ValidationException) as exc:
                # Another writer committed meanwhile, and pyiceberg's own retry could not
                # rebase this commit (a file it rewrites changed): redo it from the new state.
                self._delete_unreferenced(None, [f.file_path for f in written], refs=set())
                table = self._table()
                if table is None:
                    raise SinkError(f"Iceberg table {self.opts.table!r} disappeared") from None
                if self._committed(table, epoch):  # a zombie's commit of the same epoch
                    self._sweep_changes(table, epoch, keep=None)
                    return
                if attempt == _CONFLICT_ATTEMPTS:
                    raise CommitFailedError(
                        f"iceberg upsert commit of epoch {epoch} conflicted {attempt} times "
                        f"with other writers: {exc}"
                    ) from None
                log.info(
                    "iceberg: upsert commit of epoch %d of %s conflicted with another "
                    "writer (%s); redone on the new snapshot (attempt %d)",
                    epoch,
                    self.sink_id,
                    exc,
                    attempt + 1,
                )
                continue
            except CommitStateUnknownException as exc:
                raise CommitStateUnknownError(f"iceberg commit of epoch {epoch}: {exc}") from None
            break
        self._pending_marker = None
        self.commits += 1
        log.info(
            "iceberg: epoch %d of %s committed %d upsert(s) and %d delete(s): %d row(s) "
            "replaced in %d rewritten data file(s), in %.2f s",
            epoch,
            self.sink_id,
            changes.upserts.num_rows,
            changes.deletes,
            removed,
            len(gone),
            time.perf_counter() - t0,
        )
        self._sweep_changes(table, epoch, keep={norm(f.file_path) for f in written})
        if self.opts.expire_snapshots_keep:
            self._expire(self.opts.expire_snapshots_keep)

    def _epoch_props(self, table: Any, epoch: int) -> dict[str, str]:
        """The table properties an epoch's commit sets (newest epoch, committed ranges, a
        marker waiting for the table)."""
        props = {
            self.prop: str(max(self._last_epoch(table), epoch)),
            self.epochs_prop: _add_to_ranges(
                _parse_ranges(table.properties.get(self.epochs_prop)), epoch
            ),
        }
        if self._pending_marker is not None:
            props[self.marker_prop] = self._pending_marker
        return props

    def _epoch_dirs(self, table: Any, epoch: int) -> list[str]:
        """The epoch's own directories under the table's data location (native writes,
        staged changes, an upsert commit's files), spelt as locations."""
        from pyarrow import fs as pafs

        data = table.location().rstrip("/") + "/data"
        filesystem, root, _ = _compat.location_filesystem(self.opts.catalog_properties(), data)
        prefix = f"eosink-{sink_key(self.sink_id):08x}-e{epoch}-"
        top = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        return [
            f"{data}/{d.base_name}"
            for d in top
            if d.type == pafs.FileType.Directory and d.base_name.startswith(prefix)
        ]

    def _sweep_changes(self, table: Any, epoch: int, keep: set[str] | None) -> None:
        """After an upsert epoch is committed: delete its staged changes and every file of
        its directories that is not one of the data files just committed (``keep``; None:
        a replayed commit, where the table's references decide). Never raises."""
        try:
            files = [p for p, e in self._data_files(table, self._epoch_dirs(table, epoch))]
            if keep is None:
                self._delete_unreferenced(table, files)
            else:
                self._delete_unreferenced(
                    None, [p for p in files if norm(p) not in keep], refs=set()
                )
            self._remove_native_dirs(table, epoch)
        except Exception:
            log.warning(
                "iceberg: could not delete the staged changes of epoch %d; retried at the "
                "next start",
                epoch,
                exc_info=True,
            )

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
            return
        if self.opts.mode == "upsert":
            self._delete_expired_files(snaps, table)

    def _delete_expired_files(self, before: list[Any], table: Any) -> None:
        """After an expiry: delete this sink's data files that only expired snapshots
        referenced (an upsert epoch's commit replaces files; pyiceberg's expiry deletes no
        file). Other writers' files are left alone. Never raises."""
        try:
            table = self._table()
            live = {s.snapshot_id for s in table.snapshots()}
            expired = [s for s in before if s.snapshot_id not in live]
            if not expired:
                return
            gone = [
                path
                for path in _manifest_files(table, expired, discard_deleted=False).values()
                if epoch_of_file(path, self.sink_id) is not None
            ]
            if gone:
                # What the live snapshots read (a DELETED entry of a manifest is no reference).
                refs = set(_manifest_files(table, table.snapshots(), discard_deleted=True))
                n = self._delete_unreferenced(None, gone, refs=refs)
                self._remove_empty_dirs({d for d in map(native_write_dir, gone) if d})
                if n:
                    log.info(
                        "iceberg: deleted %d data file(s) of %s that only expired snapshots "
                        "referenced",
                        n,
                        self.sink_id,
                    )
        except Exception:
            log.warning("iceberg: could not delete the files of expired snapshots", exc_info=True)

    def _io(self) -> Any:
        from pyiceberg.io import load_file_io

        return load_file_io(self.opts.catalog_properties())

    # -- data files: orphans and abort ---------------------------------------------------
    def _referenced(self, table: Any) -> set[str]:
        """Every data file path (without scheme) that any snapshot of ``table`` references."""
        return set(_manifest_files(table, table.snapshots(), discard_deleted=False))

    def _delete_unreferenced(
        self,
        table: Any | None,
        paths: Iterable[str],
        refs: set[str] | None = None,
        fault: str | None = None,
    ) -> int:
        """Delete ``paths`` except those ``table`` references (``refs``: already computed);
        return how many were deleted. A path spelt twice (with and without its scheme: a
        committable's and a listing's) is deleted once; one already gone is no error."""
        by_norm: dict[str, str] = {}
        for p in sorted(set(paths), reverse=True):  # "file:///x" before "/x": the scheme wins
            by_norm.setdefault(norm(p), p)
        if not by_norm:
            return 0
        if refs is None and table is not None:
            refs = self._referenced(table)
        todo = [p for n, p in sorted(by_norm.items()) if not refs or n not in refs]
        io = self._io()
        for i, p in enumerate(todo):
            try:
                io.delete(p)
            except FileNotFoundError:
                pass
            if i == 0 and fault:
                fault_point(fault)
        return len(todo)

    def _sweep_epoch(self, table: Any, epoch: int, committable: dict[str, Any]) -> None:
        """After ``epoch`` is committed: delete its data files that the committable does not
        name (a dead executor's, a failed or speculative task attempt's). Never raises.

        ``table`` is current: loaded just before, or updated in place by the commit. An
        epoch that Spark's writer staged lists only its own write directories (Spark's
        committer already removed its failed attempts' files), so the cost does not grow
        with the table; another write directory of the epoch (a crashed driver's attempt)
        is left to the next start's :meth:`staged_epochs`. Python writers' files sit in the
        table's partition directories: those epochs list the table's data location.
        """
        try:
            files = [f["file_path"] for f in committable.get("files", [])]
            keep = {norm(p) for p in files}
            dirs = {native_write_dir(p) for p in files}
            roots = None if None in dirs or not dirs else sorted(d for d in dirs if d)
            extra = [
                p for p, e in self._data_files(table, roots) if e == epoch and norm(p) not in keep
            ]
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
            paths |= {c["path"] for c in (committable or {}).get("changes", [])}
            paths |= {p for p, e in self._data_files(table) if e == epoch}
            # Never a file the table references: the core also aborts the output of a replay
            # of an epoch that is committed (its own files are in the table).
            self._delete_unreferenced(table, paths, fault="mid_abort")
            if table is not None:
                self._remove_native_dirs(table, epoch)
        except Exception:
            log.exception("iceberg: abort of epoch %d could not delete every data file", epoch)

    def _remove_native_dirs(self, table: Any, epoch: int) -> None:
        """Delete the directories of the epoch's native writes that hold no file any more
        (Spark leaves empty partition directories behind)."""
        self._remove_empty_dirs(self._epoch_dirs(table, epoch))

    def _remove_empty_dirs(self, locations: Iterable[str]) -> None:
        """Delete each of this sink's epoch directories ``locations`` that holds no file
        (empty subdirectories, e.g. Spark's partition directories, go with it)."""
        from pyarrow import fs as pafs

        for location in sorted(locations):
            filesystem, path, _ = _compat.location_filesystem(
                self.opts.catalog_properties(), location
            )
            try:
                inside = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
            except FileNotFoundError:
                continue
            if not any(i.type == pafs.FileType.File for i in inside):
                filesystem.delete_dir(path)

    def _data_files(
        self, table: Any | None = None, roots: list[str] | None = None
    ) -> list[tuple[str, int]]:
        """(path, epoch) of every data file this sink wrote under the table's data location
        (``roots``: only below these locations)."""
        table = table if table is not None else self._table()
        if table is None:
            return []
        from pyarrow import fs as pafs

        out = []
        for loc in roots if roots is not None else [table.location().rstrip("/") + "/data"]:
            try:
                # pyiceberg's own filesystem for the location: endpoint and credentials applied.
                filesystem, root, scheme_name = _compat.location_filesystem(
                    self.opts.catalog_properties(), loc
                )
                infos = filesystem.get_file_info(
                    pafs.FileSelector(root, recursive=True, allow_not_found=True)
                )
            except Exception:
                log.warning("iceberg: cannot list %s", loc, exc_info=True)
                continue
            scheme = "" if scheme_name == "file" else f"{scheme_name}://"
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
            if norm(p) not in refs:
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


def make_coordinator(opts: IcebergSinkOptions, sink_id: str) -> IcebergCoordinator:
    """The coordinator factory (on the driver)."""
    require_pyiceberg()
    return IcebergCoordinator(opts, sink_id)
