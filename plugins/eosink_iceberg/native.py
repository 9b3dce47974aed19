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
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa

from eosink import SchemaMismatchError, SinkError
from eosink.util import fsync_path, session_conf

from . import _compat
from .datafiles import SPARK_WRITE_CONF, data_file_to_json, native_dir_name
from .options import IcebergSinkOptions
from .transforms import PartitionTerm, table_terms
from .writer import required_message

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = ["SchemaReason", "unsupported", "write_epoch"]

log = logging.getLogger("eosink.iceberg")

FIELD_ID = "parquet.field.id"
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
_NULL_DIR = "__HIVE_DEFAULT_PARTITION__"
_REQUIRED_MARK = "EOSINK_ICEBERG_REQUIRED_NULL:"
_ESCAPED = re.compile(r"%([0-9A-Fa-f]{2})")

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


# -- what the native path cannot express -------------------------------------------------------
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
    return _location_problem(metadata.location)


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


def _location_problem(location: str) -> str | None:
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


# -- the write --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Part:
    """One partition field as the write sees it: its hidden column and how to read its
    directory value back."""

    term: PartitionTerm
    hidden: str | None  # None for a void field (always null)
    kind: str  # "int", "bool" or "str" (behind the "v" prefix)


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
    columns, parts = _cached_plan(df, metadata)
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
            m = re.search(re.escape(_REQUIRED_MARK) + r"([^\n'\"]+)", str(exc))
            if m is not None:
                column = m.group(1).strip()
                raise SchemaMismatchError(required_message(opts.table, column, None)) from None
            raise
    written = time.perf_counter() - t0
    files = _data_files(metadata, path, parts, setup["io"])
    log.info(
        "iceberg: epoch %d of %s staged by Spark's Parquet writer: %d data file(s) in %.2f s",
        epoch,
        sink_id,
        len(files),
        written,
    )
    return {"files": files, "evolve": setup.get("evolve")}


# The plans of recent epochs: (DataFrame schema, table, schema id, spec id) -> (SparkContext,
# columns, parts). Building a plan makes ~20 calls of PySpark's Column API, each of which
# captures its call site for Spark's error context (~5 ms each here: 90 ms an epoch, 8 % of a
# 500,000-row micro-batch); a stream's micro-batches all have the same plan. The columns are
# unresolved expressions (by name), valid for any DataFrame of that schema in that session.
_PLANS: OrderedDict[tuple[Any, ...], tuple[Any, list[Column], list[_Part]]] = OrderedDict()
_PLANS_LOCK = threading.Lock()
_PLANS_KEPT = 16


def _cached_plan(df: DataFrame, metadata: Any) -> tuple[list[Column], list[_Part]]:
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


def _plan(df_schema: Any, metadata: Any) -> tuple[list[Column], list[_Part]]:
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
                col.isNull(), F.raise_error(F.lit(f"{_REQUIRED_MARK}{f.name}\n"))
            ).otherwise(col)
        target = _spark_type(f.dataType, field.field_type)
        columns.append(col.cast(target).alias(f.name, metadata={FIELD_ID: field.field_id}))
    taken = {f.name.lower() for f in fields}
    parts = []
    source_types = {f.name: f.dataType for f in fields}
    for i, (_, term) in enumerate(table_terms(metadata, with_void=True)):
        if term.transform == "void":
            parts.append(_Part(term, None, "int"))
            continue
        name = f"eosink_p{i}"
        while name.lower() in taken:
            name += "_"
        taken.add(name.lower())
        expr, kind = _partition_expr(term, source_types[term.source])
        columns.append(F.expr(expr).alias(name))
        parts.append(_Part(term, name, kind))
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


# -- what was written -------------------------------------------------------------------------
def _data_files(
    metadata: Any, path: str, parts: list[_Part], io_properties: dict[str, str]
) -> list[dict[str, Any]]:
    """The JSON DataFiles of every Parquet file Spark wrote under ``path``."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    filesystem, root, scheme = _compat.location_filesystem(io_properties, path)
    root = root.rstrip("/")
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    found: list[tuple[str, int]] = []
    litter: list[str] = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(root) + 1 :]
        if any(p[:1] in "._" for p in rel.split("/")):
            litter.append(info.path)  # .crc checksums of the local filesystem
            continue
        found.append((rel, int(info.size or 0)))

    local = scheme == "file"

    def footer(rel: str) -> Any:
        if local:  # Spark's writers do not fsync: the files are durable before PENDING
            fsync_path(f"{root}/{rel}")
        with filesystem.open_input_file(f"{root}/{rel}") as fh:
            return pq.read_metadata(fh)

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(found)))) as pool:
        footers = list(pool.map(footer, [rel for rel, _ in found]))
        if local:  # the directory entries too, deepest first
            dirs = {root}
            for rel, _ in found:
                parts_of = rel.split("/")[:-1]
                dirs |= {"/".join([root, *parts_of[: i + 1]]) for i in range(len(parts_of))}
            for d in sorted(dirs, key=lambda x: -x.count("/")):
                fsync_path(d)
            fsync_path(root.rsplit("/", 1)[0])
    spec_id = metadata.default_spec_id
    out = []
    for (rel, size), meta in zip(found, footers, strict=True):
        if meta.num_rows == 0:  # Spark writes an empty file for an empty DataFrame
            litter.append(f"{root}/{rel}")
            continue
        partition = _partition_record(rel, parts, meta)
        df = _compat.data_file_from_parquet_footer(metadata, f"{path}/{rel}", meta, size, partition)
        out.append(data_file_to_json(df, spec_id))
    for p in litter:
        try:
            filesystem.delete_file(p)
        except Exception:  # an orphan of the epoch: swept after its commit
            pass
    return out


def _partition_record(rel: str, parts: list[_Part], footer: Any) -> tuple[Any, ...]:
    """The partition values of the file at ``rel`` (below the write's directory) from its
    ``hidden=value/`` directories, in the order of the spec's fields."""
    dirs = rel.split("/")[:-1]
    hidden = [p for p in parts if p.hidden is not None]
    if len(dirs) != len(hidden):
        raise SinkError(f"unexpected data file {rel!r} written by Spark: not partitioned as asked")
    values: dict[str, Any] = {}
    for p, d in zip(hidden, dirs, strict=True):
        name, sep, raw = d.partition("=")
        if not sep or name != p.hidden:
            raise SinkError(f"unexpected partition directory {d!r} in {rel!r}")
        values[name] = _decode(raw, p.kind)
    record = []
    for p in parts:
        v = None if p.hidden is None else values[p.hidden]
        if p.kind == "str":
            _check_string_value(footer, p.term, v, rel)
        record.append(v)
    return tuple(record)


def _decode(raw: str, kind: str) -> Any:
    if raw == _NULL_DIR:
        return None
    text = _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), raw)
    if kind == "str":
        if not text.startswith("v"):
            raise SinkError(f"unexpected partition directory value {raw!r}")
        return text[1:]
    if kind == "bool":
        return text == "true"
    return int(text)


def _check_string_value(footer: Any, term: PartitionTerm, value: Any, rel: str) -> None:
    """The footer's bounds of the source column must hold ``value`` (a case-insensitive
    filesystem would merge the directories of ``a`` and ``A``)."""
    schema = footer.schema
    idx = next((i for i in range(len(schema)) if schema.column(i).path == term.source), None)
    if idx is None:
        return
    width = term.width if term.transform == "truncate" else None
    for r in range(footer.num_row_groups):
        col = footer.row_group(r).column(idx)
        stats = col.statistics
        if stats is None:
            continue
        if value is None:
            ok = not stats.has_min_max  # a null partition value: only nulls in the file
        elif not stats.has_min_max:
            continue  # no bounds (values too long for Parquet's statistics): nothing to check
        else:
            lo, hi = stats.min, stats.max
            if isinstance(lo, bytes):
                lo, hi = lo.decode(errors="replace"), hi.decode(errors="replace")
            # Bounds may be truncated (a writer setting): a range check, exact when not.
            ok = (lo[:width] if width else lo) <= value <= (hi[:width] if width else hi)
        if not ok:
            raise SinkError(
                f"data file {rel!r}: its values of {term.source!r} do not match its partition "
                f"{term} = {value!r} (a case-insensitive filesystem merges partition "
                "directories); write with writer='python'"
            )
