"""The native path: Spark's own Parquet writer stages an epoch's Delta data files.

Delta's data files are plain Parquet, so Spark writes them itself and the rows never leave
the JVM. On the driver, :func:`write_epoch`:

1. selects the DataFrame's columns cast to the table's types (after ``writer_setup``'s
   evolution; timestamps as INT64 microseconds, as Delta reads them);
2. writes them with ``DataFrameWriter.parquet`` into a fresh directory of the table,
   ``eosink-<sink key>/e<epoch>/<attempt>/`` (``partitionBy`` the table's partition columns,
   which Spark keeps out of the files, as Delta wants them; no ``_SUCCESS``), so that
   ``abort(epoch, None)`` and ``staged_epochs`` find everything it wrote; Spark's commit
   protocol keeps failed task attempts out. An upsert epoch's changes go, unpartitioned,
   into its staged-changes directory;
3. lists what it wrote and describes each file from its Parquet footer (size, rows, Delta
   statistics, partition values from its directory with Spark's escaping undone; a NULL in a
   NOT NULL column is refused here, before anything is persisted).

The results have the Python writers' shape, so ``pre_commit``, ``commit`` and recovery do not
know which path ran. :func:`unsupported` says where this path cannot write (then the Python
writers run): an ``s3://`` table (Spark would need Hadoop's S3A and its credentials).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eosink import SchemaMismatchError
from eosink.util import fsync_path, session_conf

from .layout import changes_dir, epoch_dir, unescape, walk_files
from .options import DeltaSinkOptions, filesystem
from .stats import file_stats
from .writer import Setup, required_message

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["unsupported", "write_epoch"]

log = logging.getLogger("eosink.delta")

_WRITER_OPTIONS = {
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # Page checksums are optional in Parquet; delta-rs and pyarrow do not write them, and
    # parquet-mr spends ~10 % of its encoding time on them.
    "parquet.page.write-checksum.enabled": "false",
}

_WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.writeLegacyFormat": "false",
}


def unsupported(opts: DeltaSinkOptions, schema: pa.Schema) -> str | None:
    """Why Spark's writer cannot stage this sink's epochs, or None."""
    if opts.on_s3:
        return "the table is on s3:// (Spark would need Hadoop's S3A): Python writers stage it"
    return None


def _columns(df: DataFrame, setup: Setup, opts: DeltaSinkOptions) -> list[Any] | None:
    """The columns to write, cast to the table's types where they differ; None when every
    column has its table type already (the common case: no projection, no round trips)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    out, cast = [], False
    for f in df.schema.fields:
        col = F.col(f"`{f.name.replace('`', '``')}`")
        if opts.mode == "append" and f.name in setup.schema.names:
            want = from_arrow_type(setup.schema.field(f.name).type)
            if want != f.dataType:
                col, cast = col.cast(want), True
        out.append(col.alias(f.name))
    return out if cast else None


def write_epoch(
    opts: DeltaSinkOptions, sink_id: str, df: DataFrame, epoch: int, attempt: str, setup: Setup
) -> list[dict[str, Any]]:
    """Stage ``df`` with Spark's Parquet writer; return one write result (the Python writers'
    shape: ``{"files": [...], "rows": n}``, or ``{"changes": [...]}`` for upserts).

    Raises:
        SchemaMismatchError: a null in a NOT NULL column of the table.
    """
    upsert = opts.mode == "upsert"
    rel = changes_dir(sink_id, epoch, attempt) if upsert else epoch_dir(sink_id, epoch, attempt)
    parts = [] if upsert else list(setup.partition_by)
    columns = _columns(df, setup, opts)
    writer = (df if columns is None else df.select(*columns)).write.mode("overwrite")
    for k, v in _WRITER_OPTIONS.items():
        writer = writer.option(k, v)
    writer = writer.option(
        "compression", "none" if opts.compression == "uncompressed" else opts.compression
    )
    if parts:
        writer = writer.partitionBy(*parts)
    t0 = time.perf_counter()
    with session_conf(df.sparkSession, _WRITE_CONF):
        writer.parquet(f"{opts.path}/{rel}")
    files = describe(opts, setup, rel, parts, indexed=not upsert)
    log.info(
        "delta: epoch %d of %s staged by Spark's Parquet writer: %d file(s) in %.2f s",
        epoch,
        sink_id,
        len(files),
        time.perf_counter() - t0,
    )
    rows = sum(f["rows"] for f in files)
    if upsert:
        for f in files:
            f.pop("stats", None)
            f.pop("partition_values", None)
        return [{"changes": files, "rows": rows}]
    return [{"files": files, "rows": rows}]


def describe(
    opts: DeltaSinkOptions, setup: Setup, rel: str, parts: list[str], *, indexed: bool
) -> list[dict[str, Any]]:
    """The ``add`` descriptions of the Parquet files under ``rel`` (see the module docstring)."""
    import pyarrow.parquet as pq

    fs, root = filesystem(opts)
    required = [f.name for f in setup.schema if not f.nullable]
    out = []
    local = not opts.on_s3
    dirs: set[str] = set()
    for path, info in sorted(walk_files(fs, root, rel)):
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(".parquet") or name.startswith(("_", ".")):
            fs.delete_file(f"{root}/{path}")  # .crc checksums of Hadoop's local filesystem
            continue
        if local:  # Spark's writers do not fsync: the files are durable before PENDING
            fsync_path(f"{root}/{path}")
            dirs.update(_parents(path, rel))
        values: dict[str, str | None] = {}
        for segment in path[len(rel) + 1 :].split("/")[:-1]:
            col, _, text = segment.partition("=")
            if col in parts:
                values[col] = unescape(text)
        with fs.open_input_file(f"{root}/{path}") as fh:
            meta = pq.read_metadata(fh)
        schema = meta.schema.to_arrow_schema()
        for col in required:
            if col in schema.names:
                n = _nulls(meta, col)
                if n:
                    raise SchemaMismatchError(required_message(opts.path, col, n))
            elif col in values and values[col] is None:
                raise SchemaMismatchError(required_message(opts.path, col, 1))
        cols = [c for c in setup.indexed if c in schema.names] if indexed else []
        out.append(
            {
                "path": path,
                "size": int(info.size),
                "partition_values": {c: values.get(c) for c in parts},
                "rows": int(meta.num_rows),
                "stats": file_stats(meta, schema, cols),
            }
        )
    for d in sorted(dirs, key=len, reverse=True):  # the directory entries, deepest first
        fsync_path(f"{root}/{d}")
    return out


def _parents(path: str, rel: str) -> list[str]:
    """The directories from ``path``'s up to the table's root, excluded (``rel`` and its
    parents are new too)."""
    out, d = [], path.rsplit("/", 1)[0]
    while d:
        out.append(d)
        d = d.rsplit("/", 1)[0] if "/" in d else ""
    return out


def _nulls(meta: Any, column: str) -> int:
    total = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for i in range(rg.num_columns):
            c = rg.column(i)
            if c.path_in_schema == column:
                s = c.statistics
                if s is None or not s.has_null_count:
                    return 0  # unknown: Spark's writer keeps the counts, so this is rare
                total += s.null_count
    return total
