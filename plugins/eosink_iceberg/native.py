"""The native path: Spark's own Parquet writer stages an epoch's Iceberg data files.

The rows never leave the JVM. On the driver, :func:`write_epoch`:

1. selects the DataFrame's columns cast to the table's types (after ``writer_setup``'s schema
   evolution), each with its Iceberg field id as ``parquet.field.id`` metadata (nested struct
   fields too), and adds one hidden column per partition field computing its Iceberg partition
   value (identity, year, month, day, hour, truncate) as an integer, a boolean, or a string
   behind a ``v`` prefix (Spark turns an empty string into a null directory value);
2. writes them with ``DataFrameWriter.parquet`` into a fresh directory of the table location,
   ``data/eosink-<sink key>-e<epoch>-<attempt>/`` (``partitionBy`` the hidden columns, which
   Spark keeps out of the files; timestamps as INT64 microseconds, field ids on, no
   ``_SUCCESS``), so that ``abort(epoch, None)`` and ``staged_epochs`` find everything it
   wrote; Spark's commit protocol keeps failed task attempts out;
3. lists the directory and builds each file's DataFile from its Parquet footer with
   pyiceberg's statistics code (``_compat.data_file_from_parquet_footer``) and its partition
   record from its directory (Spark's ``%XX`` escaping undone; string values cross-checked
   against the footer's min/max of the source column).

The results have the Python writers' shape, so ``pre_commit``, ``commit`` and recovery do not
know which path ran. :func:`unsupported` says what this path cannot express exactly (then the
Python writers run): bucket transforms, identity partitions on types whose directory value is
not exact, lists and maps (Spark cannot write their elements' field ids), a location Spark
cannot write.

The parts: ``native_checks.py`` (what it cannot express), ``native_plan.py`` (the
projection), ``native_files.py`` (the DataFiles of what Spark wrote).
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from eosink import SchemaMismatchError
from eosink.util import session_conf

from . import _compat
from .datafiles import SPARK_WRITE_CONF, native_dir_name
from .native_checks import SchemaReason, unsupported
from .native_files import staged_data_files
from .native_plan import REQUIRED_MARK, cached_plan
from .options import IcebergSinkOptions
from .rows import required_message

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SchemaReason", "unsupported", "write_epoch"]

log = logging.getLogger("eosink.iceberg")

# Iceberg's write.parquet.compression-codec -> Spark's parquet compression.
_CODECS = {
    "zstd": "zstd",
    "snappy": "snappy",
    "gzip": "gzip",
    "uncompressed": "uncompressed",
    "none": "uncompressed",
    "lz4": "lz4_raw",
    "brotli": "brotli",
}


def write_epoch(
    df: DataFrame,
    epoch: int,
    attempt: str,
    setup: dict[str, Any],
    opts: IcebergSinkOptions,
    sink_id: str,
) -> dict[str, Any]:
    """Stage ``df`` as data files of the table with Spark's Parquet writer; return the write
    result (the Python writers' shape: ``{"files": [...], "evolve": ...}``).

    Raises:
        SchemaMismatchError: a null in a required column.
    """
    metadata = _compat.parse_table_metadata(setup["metadata"])
    spark = df.sparkSession
    columns, parts = cached_plan(df, metadata)
    out = df.select(*columns)
    location = metadata.location.rstrip("/")
    path = f"{location}/data/{native_dir_name(sink_id, epoch, attempt)}"
    writer = out.write.mode("overwrite").option(
        "mapreduce.fileoutputcommitter.marksuccessfuljobs", "false"
    )
    codec = _CODECS.get(metadata.properties.get("write.parquet.compression-codec", "zstd").lower())
    if codec:
        writer = writer.option("compression", codec)
    level = metadata.properties.get("write.parquet.compression-level")
    if level and codec == "zstd":
        writer = writer.option("parquet.compression.codec.zstd.level", level)
    hidden = [p.hidden for p in parts if p.hidden is not None]
    if hidden:
        writer = writer.partitionBy(*hidden)
    t0 = time.perf_counter()
    with session_conf(spark, SPARK_WRITE_CONF):
        try:
            writer.parquet(path)
        except Exception as exc:
            m = re.search(re.escape(REQUIRED_MARK) + r"([^\n'\"]+)", str(exc))
            if m is not None:
                column = m.group(1).strip()
                raise SchemaMismatchError(required_message(opts.table, column, None)) from None
            raise
    written = time.perf_counter() - t0
    files = staged_data_files(metadata, path, parts, setup["io"])
    log.info(
        "iceberg: epoch %d of %s staged by Spark's Parquet writer: %d data file(s) in %.2f s",
        epoch,
        sink_id,
        len(files),
        written,
    )
    return {"files": files, "evolve": setup.get("evolve")}
