"""The Delta table itself: open it, create it, and refuse what the sink cannot write correctly.

Everything that could make an epoch's commit fail for good, or commit a file that breaks the
table, is checked here before the epoch is staged (``writer_setup``) and again at its commit
(a feature enabled on the table while an epoch was PENDING):

* **Table features** (the protocol's reader and writer features, and the legacy protocol
  versions' equivalents): the sink writes data files and commits them with delta-rs, which
  does not enforce CHECK constraints, invariants, generated or identity columns, and whose
  files use logical column names. A table with column mapping, identity columns, a
  generated column, a CHECK constraint or an invariant is refused, naming it, as is any
  writer feature not in :data:`WRITER_FEATURES`. Upserts are also refused on append-only
  tables and on tables with deletion vectors enabled.
* **App transactions that expire** (``delta.setTransactionRetentionDuration``): the sink's
  record of its committed epochs lives in them (``epochs.py``): expired, committed epochs
  would look new and be written again.
* **The schema**: a column's type never changes (widening an integer is fine); a column the
  table lacks is added (nullable) before the epoch is staged; a column the table requires
  must be in the data. Partition columns are the table's.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from eosink import ConfigError, SchemaMismatchError, SinkError

from .layout import partition_types_supported
from .options import DeltaSinkOptions, redact, require_deltalake

__all__ = [
    "WRITER_FEATURES",
    "arrow_schema",
    "check_table",
    "create_table",
    "delta_types",
    "evolve",
    "open_table",
]

log = logging.getLogger("eosink.delta")

WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "timestampNtz",
        "deletionVectors",
        # delta-rs sets it on the tables it creates with table features; the sink's files
        # hold no variant column (pyarrow has no such type).
        "variantType",
    }
)
"""Writer features the sink writes correctly (with the checks of :func:`check_table`)."""

_FIELD_REFUSALS = {
    "delta.invariants": "an invariant",
    "delta.generationExpression": "a generated column",
    "delta.identity.start": "an identity column",
    "delta.identity.allowExplicitInsert": "an identity column",
}


def open_table(opts: DeltaSinkOptions) -> Any:
    """The table at ``opts.path`` (a ``deltalake.DeltaTable``), or None when there is none."""
    require_deltalake()
    from deltalake import DeltaTable

    try:
        if not DeltaTable.is_deltatable(opts.path, storage_options=opts.delta_storage_options()):
            return None
        return DeltaTable(opts.path, storage_options=opts.delta_storage_options())
    except Exception as exc:
        raise SinkError(
            redact(f"cannot open the Delta table at {opts.path}: {_said(exc)}", opts)
        ) from None


def arrow_schema(table: Any) -> pa.Schema:
    """The table's schema as an Arrow schema."""
    return pa.schema(table.schema().to_arrow())


def delta_types(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types Delta stores: time-zone-aware timestamps in UTC (Spark hands
    them over in the session's zone; delta-rs takes UTC only), nanoseconds as microseconds,
    large and view strings as strings."""

    def fix(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.timestamp("us", tz=None if t.tz is None else "UTC")
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return pa.binary()
        if pa.types.is_struct(t):
            return pa.struct(
                [t.field(i).with_type(fix(t.field(i).type)) for i in range(t.num_fields)]
            )
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(t.value_field.with_type(fix(t.value_type)))
        if pa.types.is_map(t):
            return pa.map_(
                t.key_field.with_type(fix(t.key_type)), t.item_field.with_type(fix(t.item_type))
            )
        return t

    return pa.schema([f.with_type(fix(f.type)) for f in schema])


def check_table(opts: DeltaSinkOptions, table: Any) -> None:
    """Refuse a table the sink cannot write correctly (the module docstring's list).

    Raises:
        ConfigError: naming the feature, the property or the column, and what to do.
    """
    where = f"Delta table {opts.path}"
    proto = table.protocol()
    config = dict(table.metadata().configuration or {})
    features = set(proto.writer_features or [])
    if proto.min_writer_version >= 7:
        unknown = sorted(features - WRITER_FEATURES)
        if unknown:
            raise ConfigError(
                f"{where} uses the table feature(s) {', '.join(unknown)}, which the delta sink "
                "cannot write correctly (it commits data files through delta-rs). Write it "
                "with Delta's own Spark writer, or use a table without them. Nothing was written"
            )
    mapping = config.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        raise ConfigError(
            f"{where} has column mapping (delta.columnMapping.mode={mapping}): its data files "
            "name columns by physical names, which the delta sink does not write. "
            "Nothing was written"
        )
    constraints = sorted(k for k in config if k.startswith("delta.constraints."))
    if constraints:
        names = ", ".join(k[len("delta.constraints.") :] for k in constraints)
        raise ConfigError(
            f"{where} has CHECK constraint(s) {names}: the delta sink's commit does not "
            "evaluate them, so it refuses the table rather than commit rows that may break "
            "them. Drop the constraint, or filter the rows and write with Delta's Spark "
            "writer. Nothing was written"
        )
    for field in table.schema().fields:
        meta = dict(field.metadata or {})
        for key, what in _FIELD_REFUSALS.items():
            if key in meta:
                raise ConfigError(
                    f"{where}: column {field.name!r} is {what} ({key}), which the delta "
                    "sink's commit does not compute or enforce; it refuses the table. "
                    "Nothing was written"
                )
    if "delta.setTransactionRetentionDuration" in config:
        raise ConfigError(
            f"{where} sets delta.setTransactionRetentionDuration="
            f"{config['delta.setTransactionRetentionDuration']}: the sink records its "
            "committed epochs in the table's app transactions, and expired ones would make "
            "committed epochs look new (written twice). Unset the property "
            "(ALTER TABLE ... UNSET TBLPROPERTIES). Nothing was written"
        )
    if opts.mode == "upsert":
        if config.get("delta.appendOnly", "false").lower() == "true":
            raise ConfigError(
                f"{where} is append-only (delta.appendOnly=true): mode='upsert' updates and "
                "deletes rows. Use mode='append', or unset the property. Nothing was written"
            )
        if config.get("delta.enableDeletionVectors", "false").lower() == "true":
            raise ConfigError(
                f"{where} has deletion vectors enabled: the delta sink's upserts are not "
                "tested with them, so it refuses them (appends are fine). Nothing was written"
            )


def check_partitioning(opts: DeltaSinkOptions, table: Any) -> None:
    """``partition_by``, when given, is the table's partitioning."""
    have = list(table.metadata().partition_columns)
    if opts.partition_by and list(opts.partition_by) != have:
        raise ConfigError(
            f"Delta table {opts.path} is partitioned by {have or 'nothing'}, not by "
            f"{list(opts.partition_by)}: an existing table keeps its partitioning. Drop "
            "partition_by or give the table's. Nothing was written"
        )


def _compatible(data: pa.DataType, table: pa.DataType) -> bool:
    if data == table:
        return True
    if pa.types.is_integer(data) and pa.types.is_integer(table):
        same_sign = bool(pa.types.is_signed_integer(data)) == bool(
            pa.types.is_signed_integer(table)
        )
        return same_sign and int(data.bit_width) <= int(table.bit_width)
    return False


def plan_schema(
    opts: DeltaSinkOptions, table_schema: pa.Schema, data: pa.Schema, partition_by: list[str]
) -> list[pa.Field]:
    """The columns to add to the table for ``data`` (its Delta types), after checking it.

    Raises:
        SchemaMismatchError: a column's type differs, a required column is missing, or a new
            column would be a partition column.
    """
    data = delta_types(pa.schema([f for f in data if f.name != opts.op_column]))
    new = []
    for f in data:
        if f.name not in table_schema.names:
            new.append(pa.field(f.name, f.type, nullable=True))
            continue
        have = table_schema.field(f.name).type
        if not _compatible(f.type, have):
            raise SchemaMismatchError(
                f"column {f.name!r} is {f.type} in the data but {have} in the Delta table "
                f"{opts.path}: the delta sink never changes a column's type (cast the "
                "column). Nothing was written"
            )
    for f in table_schema:
        if not f.nullable and f.name not in data.names:
            raise SchemaMismatchError(
                f"the Delta table {opts.path} requires column {f.name!r} (NOT NULL), which the "
                "data lacks. Nothing was written"
            )
    for name in partition_by:
        if name not in data.names:
            raise SchemaMismatchError(
                f"the Delta table {opts.path} is partitioned by {name!r}, which the data "
                "lacks. Nothing was written"
            )
    return new


def check_new_table(opts: DeltaSinkOptions, data: pa.Schema) -> pa.Schema:
    """The schema a created table gets from ``data``, after checking its partition columns."""
    schema = delta_types(pa.schema([f for f in data if f.name != opts.op_column]))
    for name in opts.partition_by:
        if name not in schema.names:
            raise ConfigError(f"partition_by names {name!r}, which is not a column of the data")
        t = schema.field(name).type
        if not partition_types_supported(t):
            raise ConfigError(
                f"partition_by column {name!r} is {t}: the delta sink partitions by string, "
                "integer, boolean and date columns (derive one, e.g. to_date(ts))"
            )
    if len(opts.partition_by) == len(schema.names):
        raise ConfigError("partition_by names every column: a Delta table needs a data column")
    return schema


def create_table(opts: DeltaSinkOptions, data: pa.Schema, properties: dict[str, str]) -> Any:
    """Create the table for ``data`` (or open the one another writer just created)."""
    from deltalake import DeltaTable

    schema = check_new_table(opts, data)
    wanted = {**opts.table_properties, **properties}
    # delta-rs creates a table with Delta's own properties only; the others (the marker
    # among them) follow in one metadata commit.
    own = {k: v for k, v in wanted.items() if k.startswith("delta.")}
    other = {k: v for k, v in wanted.items() if not k.startswith("delta.")}
    try:
        DeltaTable.create(
            opts.path,
            schema,
            partition_by=list(opts.partition_by) or None,
            mode="ignore",
            configuration=own or None,
            storage_options=opts.delta_storage_options(),
        )
        created = open_table(opts)
        have = dict(created.metadata().configuration or {})
        if any(have.get(k) != v for k, v in other.items()):
            created.alter.set_table_properties(other, raise_if_not_exists=False)
    except Exception as exc:
        raise SinkError(
            redact(f"cannot create the Delta table at {opts.path}: {_said(exc)}", opts)
        ) from None
    log.info(
        "delta: created table %s (partitioned by %s)",
        opts.path,
        list(opts.partition_by) or "nothing",
    )
    return open_table(opts)


def evolve(opts: DeltaSinkOptions, table: Any, new: list[pa.Field]) -> None:
    """Add the nullable columns ``new`` to the table (one metadata commit)."""
    from deltalake import Schema

    fields = list(Schema.from_arrow(pa.schema(new)).fields)
    try:
        table.alter.add_columns(fields)
    except Exception as exc:
        raise SinkError(
            redact(
                f"cannot add columns {[f.name for f in new]} to the Delta table at "
                f"{opts.path}: {_said(exc)}",
                opts,
            )
        ) from None
    log.info("delta: added column(s) %s to %s", [f.name for f in new], opts.path)


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__
