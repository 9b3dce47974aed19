"""The Arrow schema of a Spark DataFrame, as Spark's Arrow exchange (``mapInArrow``) gives it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import _spark_version

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["arrow_schema", "spark_to_arrow"]


def arrow_schema(df: DataFrame) -> pa.Schema:
    """The Arrow schema Spark's ``mapInArrow`` hands to writers for ``df``."""
    tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    return spark_to_arrow(df.schema, tz)


def spark_to_arrow(schema: Any, timezone: str = "UTC") -> pa.Schema:
    """pyspark's ``to_arrow_schema`` of a ``StructType``, on every supported pyspark.

    pyspark 4.2 added the ``timezone`` argument; 3.5 to 4.1 write timestamps as UTC.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if _spark_version.ARROW_SCHEMA_TIMEZONE:
        return to_arrow_schema(schema, timezone=timezone)
    return to_arrow_schema(schema)  # 3.5 to 4.1: timestamps as UTC
