"""Arrow data against an Iceberg table's columns, for every writer path: time-zone-aware
timestamps in UTC, and a null in a required column refused naming it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from eosink import SchemaMismatchError

__all__ = ["check_required", "required_message", "utc_timestamps"]


def utc_timestamps(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every time-zone-aware timestamp in UTC (the same instants).

    Spark hands over timestamps in the session's time zone; Iceberg's ``timestamptz`` is UTC
    and pyiceberg refuses any other zone.
    """

    def fix(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
            return pa.timestamp(t.unit, tz="UTC")
        if pa.types.is_struct(t):
            return pa.struct(
                [t.field(i).with_type(fix(t.field(i).type)) for i in range(t.num_fields)]
            )
        if pa.types.is_list(t):
            return pa.list_(t.value_field.with_type(fix(t.value_type)))
        if pa.types.is_large_list(t):
            return pa.large_list(t.value_field.with_type(fix(t.value_type)))
        if pa.types.is_map(t):
            return pa.map_(t.key_field, t.item_field.with_type(fix(t.item_type)))
        return t

    return pa.schema([f.with_type(fix(f.type)) for f in schema], metadata=schema.metadata)


def check_required(schema: Any, data: pa.Table, table_name: str) -> None:
    """Raise SchemaMismatchError naming the column when a required column gets a null.

    The DataFrame's field may be nullable while the table's column is required: that is fine
    as long as the data has no null there (pyarrow would otherwise fail with a less clear
    error deep inside the Parquet writer).
    """
    for f in schema.fields:
        if f.required and f.name in data.column_names:
            nulls = data.column(f.name).null_count
            if nulls:
                raise SchemaMismatchError(required_message(table_name, f.name, nulls))


def required_message(table_name: str, column: str, nulls: int | None) -> str:
    """The error of a null in the required column ``column`` (``nulls``: how many, if known)."""
    rows = f"{nulls} row(s)" if nulls is not None else "a row"
    return (
        f"Iceberg table {table_name!r}: column {column!r} is required (NOT NULL) "
        f"in the table, but {rows} of this epoch have a null there. "
        "Fill or filter the nulls (e.g. coalesce), or make the column optional "
        "in the table (pyiceberg: update_schema().make_column_optional)."
    )
