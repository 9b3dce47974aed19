"""Change-data-capture into Iceberg tables: ``mode="upsert"`` (keys, order_by, op_column).

How an epoch of changes is written (copy-on-write at commit):

1. **Staging** (phase 1's writers): the epoch's change rows, as they are (every column, the
   ``op_column`` too), are written as plain Parquet files into the epoch's staging directory
   of the table location, ``data/eosink-<sink key>-e<epoch>-<attempt>/`` (by Spark's own
   Parquet writer on the native path, or one file per task by the Python writers). Readers
   of the table never see them: no snapshot names them.
2. **Phase 1** (``pre_commit``, on the driver) reads the key, ``order_by``, ``op_column`` and
   required columns of those files and refuses, before the epoch is PENDING, what no commit
   could publish: a null key, a key repeated without ``order_by``, two rows of one key tied
   on ``order_by``, a null in a required column of a row that upserts, and an epoch older
   than one already committed (its changes would overwrite newer ones).
3. **Phase 2** (``commit``; the copy-on-write in :mod:`~eosink_iceberg.rewrite`) keeps the
   last change of each key (the largest ``order_by``; a NULL never wins), then, in **one**
   table commit: every data file of the current snapshot that holds one of the epoch's keys
   is rewritten without those rows, and the epoch's upserted rows are added as new data
   files (one ``overwrite`` snapshot, or ``append`` when no file had to be rewritten). The
   snapshot carries eosink's marker like an append's, so a commit replayed after a crash
   does nothing. The new files go into the epoch's own directory
   ``data/eosink-<sink key>-e<epoch>-c<uuid>/``: files of an attempt that never committed
   are found and deleted.
   A concurrent commit to the table makes the commit fail; it is redone on the new snapshot
   (retried, never lost).

Why copy-on-write rather than merge-on-read: pyiceberg (0.12) cannot read equality delete
files (a scan raises), so a table with them would be unreadable by one of the two readers
eosink must serve; position deletes need each row's position, which is found by reading the
same files copy-on-write reads. A copy-on-write table needs no compaction to stay fast to
read.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from eosink import SchemaMismatchError, SinkError
from eosink.util import fsync_path, session_conf

from . import _compat
from .datafiles import SPARK_WRITE_CONF, native_dir_name
from .options import IcebergSinkOptions
from .rows import required_message, utc_timestamps

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "Changes",
    "check_changes",
    "read_changes",
    "stage_task_changes",
    "stage_with_spark",
    "table_columns",
    "winners",
]

log = logging.getLogger("eosink.iceberg")

_IDX = "__eosink_idx"


def table_columns(opts: IcebergSinkOptions, schema: pa.Schema) -> pa.Schema:
    """The DataFrame's schema as the table holds it: without the ``op_column``."""
    if opts.op_column is None or opts.op_column not in schema.names:
        return schema
    return pa.schema([f for f in schema if f.name != opts.op_column], metadata=schema.metadata)


def check_columns(opts: IcebergSinkOptions, schema: pa.Schema, table: Any | None) -> None:
    """``keys``, ``order_by`` and ``op_column`` are columns of the DataFrame (and the keys of
    an existing table: its identifier fields, when it declares any)."""
    wanted = [("keys", k) for k in opts.keys]
    wanted += [("order_by", opts.order_by)] if opts.order_by else []
    wanted += [("op_column", opts.op_column)] if opts.op_column else []
    for what, col in wanted:
        if col not in schema.names:
            raise SchemaMismatchError(
                f"iceberg sink mode='upsert': {what} column {col!r} is not in the DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )
    for k in opts.keys:
        t = schema.field(k).type
        if pa.types.is_nested(t) or pa.types.is_floating(t):
            raise SchemaMismatchError(
                f"iceberg sink mode='upsert': key column {k!r} is of type {t}; keys must be "
                "of a primitive, exactly comparable type (integers, strings, dates, "
                "timestamps, decimals, binary)"
            )
    if table is None:
        return
    ice = table.schema()
    for k in opts.keys:
        try:
            ice.find_field(k)
        except ValueError:
            raise SchemaMismatchError(
                f"Iceberg table {opts.table!r} has no column {k!r} (keys={list(opts.keys)})"
            ) from None
    ids = set(getattr(ice, "identifier_field_ids", []) or [])
    if ids:
        names = sorted(ice.find_column_name(i) or str(i) for i in ids)
        if names != sorted(opts.keys):
            raise SchemaMismatchError(
                f"Iceberg table {opts.table!r} declares the identifier fields {names}, but "
                f"keys={list(opts.keys)}: upsert by the table's identifier fields "
                f"(keys={names})"
            )


# -- staging ---------------------------------------------------------------------------------
def changes_dir(location: str, sink_id: str, epoch: int, attempt: str) -> str:
    """The staging directory of one write of an epoch's changes (under the table's data)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", attempt)[:60] or "w"
    return f"{location.rstrip('/')}/data/{native_dir_name(sink_id, epoch, clean)}"


def stage_with_spark(
    df: DataFrame, epoch: int, attempt: str, setup: dict[str, Any], sink_id: str
) -> dict[str, Any]:
    """Write the epoch's change rows with Spark's Parquet writer; return the write result
    ``{"changes": [{"path", "rows", "size"}...], "evolve": ...}``."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    metadata = _compat.parse_table_metadata(setup["metadata"])
    path = changes_dir(metadata.location, sink_id, epoch, attempt)
    from pyspark.sql import functions as F

    # A projection above the DataFrame (as the append path's): Spark 4.0 does not report
    # the rows observed on a DataFrame written as it is.
    out = df.select(*[F.col(f"`{c}`") for c in df.columns])
    writer = out.write.mode("overwrite").option(
        "mapreduce.fileoutputcommitter.marksuccessfuljobs", "false"
    )
    t0 = time.perf_counter()
    with session_conf(df.sparkSession, SPARK_WRITE_CONF):
        writer.parquet(path)
    filesystem, root, scheme = _compat.location_filesystem(setup["io"], path)
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    files: list[Any] = []
    litter: list[Any] = []
    for i in infos:
        if i.type != pafs.FileType.File:
            continue
        hidden = any(p[:1] in "._" for p in i.path[len(root) + 1 :].split("/"))
        (litter if hidden else files).append(i)
    for i in litter:  # .crc checksums of the local filesystem
        filesystem.delete_file(i.path)

    def rows(info: Any) -> int:
        if scheme == "file":  # Spark's writers do not fsync: durable before PENDING
            fsync_path(info.path)
        with filesystem.open_input_file(info.path) as fh:
            return int(pq.read_metadata(fh).num_rows)

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(files)))) as pool:
        counts = list(pool.map(rows, files))
    prefix = "" if scheme == "file" else f"{scheme}://"
    changes = [
        {"path": f"{prefix}{i.path}", "rows": n, "size": int(i.size or 0)}
        for i, n in zip(files, counts, strict=True)
    ]
    log.info(
        "iceberg: epoch %d of %s: %d change row(s) staged by Spark's Parquet writer in %.2f s",
        epoch,
        sink_id,
        sum(counts),
        time.perf_counter() - t0,
    )
    return {"changes": changes, "evolve": setup.get("evolve")}


def stage_task_changes(
    data: pa.Table, setup: dict[str, Any], sink_id: str, epoch: int, attempt: str, part: int
) -> dict[str, Any]:
    """A Python writer's task: write its change rows as one Parquet file; the result."""
    import pyarrow.parquet as pq

    metadata = _compat.parse_table_metadata(setup["metadata"])
    path = f"{changes_dir(metadata.location, sink_id, epoch, attempt)}/changes-{part:05d}.parquet"
    filesystem, root, scheme = _compat.location_filesystem(setup["io"], path)
    parent = root.rsplit("/", 1)[0]
    filesystem.create_dir(parent, recursive=True)
    with filesystem.open_output_stream(root) as out:
        pq.write_table(data, out, compression="zstd")
    if scheme == "file":
        fsync_path(root)
    size = int(filesystem.get_file_info(root).size or 0)
    return {"path": path, "rows": data.num_rows, "size": size}


def _read(paths: Sequence[str], io_props: dict[str, str], columns: list[str] | None) -> pa.Table:
    import pyarrow.parquet as pq

    def one(path: str) -> pa.Table:
        filesystem, root, _ = _compat.location_filesystem(io_props, path)
        return pq.read_table(root, filesystem=filesystem, columns=columns)

    if not paths:
        return pa.table({})
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        parts = list(pool.map(one, paths))
    return pa.concat_tables(parts, promote_options="permissive")


# -- phase 1 ---------------------------------------------------------------------------------
def check_changes(
    opts: IcebergSinkOptions,
    epoch: int,
    changes: Sequence[dict[str, Any]],
    io_props: dict[str, str],
    required: Sequence[str],
) -> None:
    """What would make the epoch's commit fail for good, checked before it is PENDING.

    Raises:
        SchemaMismatchError: a null key, or a null in a required column of a row that
            upserts.
        SinkError: a key repeated without ``order_by``, or two rows of a key tied on it.
    """
    paths = [c["path"] for c in changes if c.get("rows")]
    if not paths:
        return
    cols = list(
        dict.fromkeys(
            [
                *opts.keys,
                *([opts.order_by] if opts.order_by else []),
                *([opts.op_column] if opts.op_column else []),
                *required,
            ]
        )
    )
    data = _read(paths, io_props, cols)
    for k in opts.keys:
        n = data.column(k).null_count
        if n:
            raise SchemaMismatchError(
                f"iceberg sink epoch {epoch}: key column {k!r} is null in {n} row(s); every "
                "change needs its key (filter or fill them). Nothing was committed."
            )
    upserts = data.filter(pc.invert(_is_delete(opts, data))) if opts.op_column else data
    for col in required:
        if col in opts.keys or col not in upserts.column_names:
            continue
        n = upserts.column(col).null_count
        if n:
            raise SchemaMismatchError(required_message(opts.table, col, n))
    # order_by may be a key column (a stream keyed and ordered by its id): select it once
    group = list(dict.fromkeys([*opts.keys, *([opts.order_by] if opts.order_by else [])]))
    probe = data.select(group)
    if opts.order_by:  # a NULL order_by never wins: ties among NULLs do not matter
        probe = probe.filter(pc.is_valid(probe.column(opts.order_by)))
    counts = probe.group_by(group).aggregate([([], "count_all")])
    dup = counts.filter(pc.greater(counts.column("count_all"), 1))
    if dup.num_rows == 0:
        return
    row = {c: dup.column(c)[0].as_py() for c in group}
    if opts.order_by:
        raise SinkError(
            f"iceberg sink epoch {epoch}: rows of key {row} tie on order_by "
            f"{opts.order_by!r}: which one wins is undefined; make order_by unique per key "
            "(a Kafka offset, a change sequence). Nothing was committed."
        )
    raise SinkError(
        f"iceberg sink epoch {epoch}: key {row} appears in more than one row of the epoch; "
        "pass order_by=<column> (the row with the largest value wins), or deduplicate. "
        "Nothing was committed."
    )


def _is_delete(opts: IcebergSinkOptions, data: pa.Table) -> Any:
    if not opts.op_column:
        return pa.array([False] * data.num_rows)
    ops = data.column(opts.op_column).cast(pa.string())
    return pc.fill_null(pc.is_in(ops, value_set=pa.array(list(opts.delete_ops))), False)


# -- phase 2 ---------------------------------------------------------------------------------
class Changes:
    """An epoch's changes after "last change of a key wins": the rows to upsert (without the
    ``op_column``) and every key the epoch touches (upserted or deleted)."""

    def __init__(self, upserts: pa.Table, keys: pa.Table, deletes: int) -> None:
        self.upserts = upserts
        self.keys = keys
        self.deletes = deletes


def read_changes(
    opts: IcebergSinkOptions, changes: Sequence[dict[str, Any]], io_props: dict[str, str]
) -> Changes:
    """Read the epoch's staged changes and keep each key's winner (:func:`winners`)."""
    data = _read([c["path"] for c in changes if c.get("rows")], io_props, None)
    if data.num_columns:
        utc = utc_timestamps(data.schema)
        if utc != data.schema:
            data = data.cast(utc)
    return winners(opts, data)


def winners(opts: IcebergSinkOptions, data: pa.Table) -> Changes:
    """The last change of each key: the row with the largest ``order_by`` (a NULL never
    wins; without ``order_by`` keys are unique, checked in phase 1)."""
    if data.num_rows == 0:
        empty = data.drop_columns([opts.op_column]) if opts.op_column in data.column_names else data
        return Changes(empty, data.select(list(opts.keys)) if data.num_columns else data, 0)
    if opts.order_by:
        order = data.column(opts.order_by)
        # NULLs first: they lose to any value. The index of the winner is the largest.
        idx = pc.array_sort_indices(
            order.combine_chunks(), order="ascending", null_placement="at_start"
        )
        data = data.take(idx)
    ranked = data.select(list(opts.keys)).append_column(_IDX, pa.array(range(data.num_rows)))
    last = ranked.group_by(list(opts.keys), use_threads=False).aggregate([(_IDX, "max")])
    data = data.take(last.column(f"{_IDX}_max"))
    deleted = _is_delete(opts, data)
    upserts = data.filter(pc.invert(deleted))
    if opts.op_column:
        upserts = upserts.drop_columns([opts.op_column])
    return Changes(upserts, data.select(list(opts.keys)), int(pc.sum(deleted).as_py() or 0))
