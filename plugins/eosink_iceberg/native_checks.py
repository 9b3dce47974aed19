"""What the iceberg sink's native path cannot express exactly (then the Python writers run):
bucket transforms, identity partitions on types whose directory value is not exact, lists
and maps (Spark cannot write their elements' field ids), a location Spark cannot write.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from .transforms import table_terms

__all__ = ["SchemaReason", "location_problem", "unsupported"]

# Partition transforms and the source types whose partition value the hidden column carries
# exactly (Iceberg type names as ``str(type)`` spells them).
_EXACT = {
    "identity": {"boolean", "int", "long", "string", "date"},
    "year": {"date", "timestamp", "timestamptz"},
    "month": {"date", "timestamp", "timestamptz"},
    "day": {"date", "timestamp", "timestamptz"},
    "hour": {"timestamp", "timestamptz"},
    "truncate": {"int", "long", "string"},
}


class SchemaReason(str):
    """A reason of :func:`unsupported` that is about the DataFrame's schema (the coordinator
    raises :class:`~eosink.SchemaMismatchError` for it under ``writer="spark"``)."""


def unsupported(
    metadata: Any, schema: pa.Schema, io_properties: dict[str, str]
) -> str | SchemaReason | None:
    """Why Spark's writer cannot write a DataFrame of ``schema`` into the table of
    ``metadata`` (after ``writer_setup``'s evolution) exactly, or None."""
    table_schema = metadata.schema()
    table_struct = table_schema.as_struct()
    for f in schema:
        if "." in f.name:
            return SchemaReason(_dotted(f.name))
        field = table_struct.field_by_name(f.name)
        if field is None:
            return SchemaReason(f"column {f.name!r} is not a column of the table")
        why = _type_problem(f.type, field.field_type, f.name)
        if why is not None:
            return SchemaReason(why)
    for field in table_schema.fields:
        if field.required and field.name not in schema.names:
            return SchemaReason(f"the table's required column {field.name!r} is missing")
    for pf, term in table_terms(metadata, with_void=True):
        if term.transform == "void":
            continue
        if term.transform == "bucket":
            return (
                f"partition field {term}: Spark cannot compute Iceberg's bucket hash "
                "(murmur3) itself"
            )
        source_type = str(table_schema.find_field(pf.source_id).field_type)
        if term.source not in schema.names:
            return SchemaReason(
                f"partition field {term}: its source column {term.source!r} is not a "
                "top-level column of the DataFrame"
            )
        if source_type not in _EXACT.get(term.transform, set()):
            return SchemaReason(
                f"partition field {term} on a {source_type} column: the value Spark "
                "writes into the partition directory would not be exact"
            )
    return location_problem(metadata.location)


def _type_problem(at: pa.DataType, it: Any, path: str) -> str | None:
    """Why a DataFrame column of Arrow type ``at`` cannot be written exactly by Spark as the
    table's Iceberg type ``it``, or None."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(it, (ListType, MapType)):
        kind = "list" if isinstance(it, ListType) else "map"
        return (
            f"column {path!r} is a {kind}: Spark cannot write the field ids of list elements "
            "and map keys and values"
        )
    if isinstance(it, StructType):
        if not pa.types.is_struct(at):
            return f"column {path!r}: a {at} cannot be written as {it}"
        for i in range(at.num_fields):
            af = at.field(i)
            if "." in af.name:
                return _dotted(f"{path}.{af.name}")
            nested = it.field_by_name(af.name)
            if nested is None:
                return f"field {path}.{af.name} is not a field of the table's column"
            why = _type_problem(af.type, nested.field_type, f"{path}.{af.name}")
            if why is not None:
                return why
        return None
    if _arrow_fits(at, str(it)):
        return None
    return f"column {path!r}: a DataFrame {at} is written as the table's {it} only by pyarrow"


def _dotted(name: str) -> str:
    return f"column {name!r} has a '.' in its name (ambiguous as a Parquet column path)"


def _arrow_fits(at: pa.DataType, it: str) -> bool:
    """Whether Spark casts a column of Arrow type ``at`` to the Iceberg type ``it`` exactly
    (the same type, or a widening Iceberg allows)."""
    t = pa.types
    if it == "boolean":
        return bool(t.is_boolean(at))
    if it == "int":
        return bool(t.is_int8(at) or t.is_int16(at) or t.is_int32(at))
    if it == "long":
        return bool(t.is_int8(at) or t.is_int16(at) or t.is_int32(at) or t.is_int64(at))
    if it == "float":
        return bool(t.is_float32(at))
    if it == "double":
        return bool(t.is_float32(at) or t.is_float64(at))
    if it == "date":
        return bool(t.is_date32(at))
    if it == "timestamp":
        return bool(t.is_timestamp(at) and at.tz is None and at.unit == "us")
    if it == "timestamptz":
        return bool(t.is_timestamp(at) and at.tz is not None and at.unit == "us")
    if it == "string":
        return bool(t.is_string(at) or t.is_large_string(at))
    if it == "binary":
        return bool(t.is_binary(at) or t.is_large_binary(at))
    m = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", it)
    if m is not None and t.is_decimal(at):
        return bool(at.scale == int(m.group(2)) and at.precision <= int(m.group(1)))
    return False


_SCHEMES_SPARK_WRITES: dict[str, str | None] = {"file": None}


def location_problem(location: str) -> str | None:
    """Why Spark cannot write the table's location, or None. A scheme other than ``file``
    needs a Hadoop FileSystem for it in Spark (``hadoop-aws`` for ``s3a``...), configured to
    reach the store: Spark writes with its own credentials, not the catalog's."""
    scheme = urlsplit(location).scheme or "file"
    if scheme in _SCHEMES_SPARK_WRITES:
        return _SCHEMES_SPARK_WRITES[scheme]
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    why: str | None = None
    if spark is None or getattr(spark, "_jvm", None) is None:
        return f"the table's location is {scheme}:// and no classic Spark session is active"
    try:
        jvm: Any = spark._jvm
        jsc: Any = spark._jsc
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, jsc.hadoopConfiguration())
    except Exception:
        why = (
            f"the table's location is {scheme}:// and Spark has no Hadoop FileSystem for "
            f"the scheme {scheme!r} (pyiceberg's own filesystem writes it)"
        )
    _SCHEMES_SPARK_WRITES[scheme] = why
    return why
