"""The iceberg sink's checks of a table and a schema, before anything is written.

* :func:`validate_schema` (before any meta store row or Spark job) checks what can be known
  from the catalog without changing it: a missing table with ``create_table=False``, a
  partition spec (asked for, or an existing table's) that does not apply to its columns'
  types, ``partition_by`` against an existing table's spec, the table's required columns.
* :func:`check_table` checks an existing table again when the writers are set up.
* :func:`new_table_schema_and_spec` and :func:`keep_required`: a new table's schema and spec,
  and a column's nullability as the table has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from eosink import ConfigError, SchemaMismatchError, SinkError

from . import _compat, cdc
from .options import IcebergSinkOptions, load_catalog, redact
from .rows import utc_timestamps
from .transforms import PartitionTerm, check_transforms_writable, source_type_error, table_terms

__all__ = [
    "check_new_spec",
    "check_table",
    "keep_required",
    "missing_table_message",
    "new_table_schema_and_spec",
    "validate_schema",
]


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
            raise ConfigError(missing_table_message(opts))
        check_new_spec(opts, schema)
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


def missing_table_message(opts: IcebergSinkOptions) -> str:
    return (
        f"Iceberg table {opts.table!r} does not exist in catalog {opts.catalog_name!r}, and "
        "create_table=False. Create the table first, check the table name and the catalog "
        "options, or let eosink create it from the DataFrame's schema (create_table=True, "
        "the default). Nothing was written."
    )


def check_new_spec(opts: IcebergSinkOptions, schema: pa.Schema) -> None:
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


def new_table_schema_and_spec(
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


def keep_required(field: pa.Field, existing: Any) -> pa.Field:
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
                keep_required(t.field(i), it.field_by_name(t.field(i).name))
                for i in range(t.num_fields)
            ]
        )
    elif pa.types.is_large_list(t) and isinstance(it, ListType):
        t = pa.large_list(keep_required(t.value_field, it.element_field))
    elif pa.types.is_list(t) and isinstance(it, ListType):
        t = pa.list_(keep_required(t.value_field, it.element_field))
    elif pa.types.is_map(t) and isinstance(it, MapType):
        t = pa.map_(t.key_field, keep_required(t.item_field, it.value_field))
    return field.with_type(t).with_nullable(not existing.required)


def _optional_tree(field: pa.Field) -> pa.Field:
    """``field`` nullable, and every nested struct field too (a new column is optional)."""
    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([_optional_tree(t.field(i)) for i in range(t.num_fields)])
    return field.with_type(t).with_nullable(True)
