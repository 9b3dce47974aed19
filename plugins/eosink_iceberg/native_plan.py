"""The native path's projection: the DataFrame's columns cast to the table's types, each with
its Iceberg field id as ``parquet.field.id`` metadata (nested struct fields too), a check
that fails a task on a null in a required column, and one hidden column per partition field
computing its Iceberg partition value. Plans are kept per schema: a stream's micro-batches
reuse theirs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .transforms import PartitionTerm, table_terms

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType


__all__ = ["FIELD_ID", "REQUIRED_MARK", "Part", "cached_plan"]

FIELD_ID = "parquet.field.id"

REQUIRED_MARK = "EOSINK_ICEBERG_REQUIRED_NULL:"


@dataclass(frozen=True)
class Part:
    """One partition field as the write sees it: its hidden column and how to read its
    directory value back."""

    term: PartitionTerm
    hidden: str | None  # None for a void field (always null)
    kind: str  # "int", "bool" or "str" (behind the "v" prefix)


# The plans of recent epochs: (DataFrame schema, table, schema id, spec id) -> (SparkContext,
# columns, parts). Building a plan makes ~20 calls of PySpark's Column API, each of which
# captures its call site for Spark's error context (~5 ms each here: 90 ms an epoch, 8 % of a
# 500,000-row micro-batch); a stream's micro-batches all have the same plan. The columns are
# unresolved expressions (by name), valid for any DataFrame of that schema in that session.
_PLANS: OrderedDict[tuple[Any, ...], tuple[Any, list[Column], list[Part]]] = OrderedDict()

_PLANS_LOCK = threading.Lock()

_PLANS_KEPT = 16


def cached_plan(df: DataFrame, metadata: Any) -> tuple[list[Column], list[Part]]:
    """:func:`_plan` of ``df``'s schema, reused while the schema, the table's schema and its
    spec stay the same (and the SparkContext: columns belong to its JVM)."""
    fields = df.schema  # one round trip to the JVM
    # The columns live in the JVM of the SparkContext (a micro-batch's DataFrame comes with a
    # new session object each time); Spark Connect has none: its sessions are compared.
    spark = getattr(df.sparkSession, "_sc", None) or df.sparkSession
    key = (
        fields.json(),
        str(metadata.table_uuid),
        metadata.current_schema_id,
        metadata.default_spec_id,
    )
    with _PLANS_LOCK:
        hit = _PLANS.get(key)
        if hit is not None and hit[0] is spark:
            _PLANS.move_to_end(key)
            return hit[1], hit[2]
    columns, parts = _plan(fields, metadata)
    with _PLANS_LOCK:
        _PLANS[key] = (spark, columns, parts)
        while len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return columns, parts


def _plan(df_schema: Any, metadata: Any) -> tuple[list[Column], list[Part]]:
    """The columns to write a DataFrame of Spark schema ``df_schema`` (cast to the table's
    types, with field ids) and the partition fields with their hidden columns."""
    from pyspark.sql import functions as F

    schema = metadata.schema()
    struct = schema.as_struct()
    fields = df_schema.fields
    columns = []
    for f in fields:
        field = struct.field_by_name(f.name)
        col = F.col(_quoted(f.name))
        if field.required and f.nullable:
            col = F.when(
                col.isNull(), F.raise_error(F.lit(f"{REQUIRED_MARK}{f.name}\n"))
            ).otherwise(col)
        target = _spark_type(f.dataType, field.field_type)
        columns.append(col.cast(target).alias(f.name, metadata={FIELD_ID: field.field_id}))
    taken = {f.name.lower() for f in fields}
    parts = []
    source_types = {f.name: f.dataType for f in fields}
    for i, (_, term) in enumerate(table_terms(metadata, with_void=True)):
        if term.transform == "void":
            parts.append(Part(term, None, "int"))
            continue
        name = f"eosink_p{i}"
        while name.lower() in taken:
            name += "_"
        taken.add(name.lower())
        expr, kind = _partition_expr(term, source_types[term.source])
        columns.append(F.expr(expr).alias(name))
        parts.append(Part(term, name, kind))
    return columns, parts


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_type(dt: DataType, it: Any) -> DataType:
    """The Spark type a column of Spark type ``dt`` is written as for the Iceberg type ``it``
    (nested struct fields carry their field ids)."""
    from pyiceberg.types import DecimalType as IceDecimal
    from pyiceberg.types import StructType as IceStruct
    from pyspark.sql import types as T

    if isinstance(it, IceStruct):
        assert isinstance(dt, T.StructType)
        fields = []
        for f in dt.fields:
            nested = it.field_by_name(f.name)
            assert nested is not None  # unsupported() checked every field
            fields.append(
                T.StructField(
                    f.name,
                    _spark_type(f.dataType, nested.field_type),
                    f.nullable,
                    {FIELD_ID: nested.field_id},
                )
            )
        return T.StructType(fields)
    if isinstance(it, IceDecimal):
        return T.DecimalType(it.precision, it.scale)
    simple: dict[str, DataType] = {
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "date": T.DateType(),
        "timestamp": T.TimestampNTZType(),
        "timestamptz": T.TimestampType(),
        "string": T.StringType(),
        "binary": T.BinaryType(),
    }
    return simple[str(it)]


def _partition_expr(term: PartitionTerm, source: DataType) -> tuple[str, str]:
    """(Spark SQL expression of the Iceberg partition value of ``term``, its kind).

    Integers are exact in a directory name; a string gets a ``v`` prefix (Spark writes an
    empty string as a null directory value). Time transforms follow Iceberg: years, months,
    days and hours since 1970-01-01 00:00 UTC (``timestamptz``) or local (``timestamp``).
    """
    from pyspark.sql import types as T

    c = _quoted(term.source)
    t = term.transform
    if t == "identity":
        if isinstance(source, T.StringType):
            return f"concat('v', {c})", "str"
        if isinstance(source, T.BooleanType):
            return c, "bool"
        if isinstance(source, T.DateType):
            return f"unix_date({c})", "int"
        return f"cast({c} as bigint)", "int"
    if t == "truncate":
        w = int(term.width or 1)
        if isinstance(source, T.StringType):
            return f"concat('v', substring({c}, 1, {w}))", "str"
        return f"({c} - pmod({c}, {w}))", "int"
    # year, month, day, hour
    if isinstance(source, T.TimestampType):  # an instant: UTC fields from its microseconds
        us = f"unix_micros({c})"
        day = f"(({us} - pmod({us}, 86400000000)) div 86400000000)"
        hour = f"(({us} - pmod({us}, 3600000000)) div 3600000000)"
        date = f"date_from_unix_date(cast({day} as int))"
    elif isinstance(source, T.TimestampNTZType):  # local date-time fields, no time zone
        date = f"cast({c} as date)"
        day = f"unix_date({date})"
        hour = f"(cast(unix_date({date}) as bigint) * 24 + hour({c}))"
    else:  # a date
        date = c
        day = f"unix_date({c})"
        hour = "null"
    if t == "year":
        return f"(year({date}) - 1970)", "int"
    if t == "month":
        return f"((year({date}) - 1970) * 12 + month({date}) - 1)", "int"
    if t == "day":
        return day, "int"
    return hour, "int"
