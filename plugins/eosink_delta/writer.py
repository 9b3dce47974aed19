"""The Python writer: one per Spark task, writes its Arrow batches as the epoch's Parquet files.

Used where the native path (``native.py``) cannot write (an ``s3://`` table, a type Spark
cannot write exactly), with ``writer="python"``, and by ``format("eosink")``.

* ``append``: the task's rows, cast to the table's types, are written per partition value
  into the epoch's data directory (``layout.epoch_dir``), with their Delta statistics read
  from the footer each file was written with (``stats.py``).
* ``upsert``: the task's change rows, as they are (the ``op_column`` too), into the epoch's
  staged-changes directory (``layout.changes_dir``); the commit's ``MERGE`` reads them.

Each task attempt writes under its own directory (``ctx.attempt_id``): two attempts never
meet, and ``abort_write`` deletes its own files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from eosink import CoordinatedSinkWriter, SchemaMismatchError, WriterContext
from eosink.util import fsync_path

from .layout import changes_dir, epoch_dir, escape, partition_value
from .options import DeltaSinkOptions, filesystem
from .stats import file_stats
from .table import delta_types

__all__ = ["FLUSH_BYTES", "DeltaWriter", "Setup", "make_writer", "write_files"]

FLUSH_BYTES = 128 * 1024 * 1024
"""Arrow bytes a writer holds before writing them out: a task's memory stays bounded."""


@dataclass(frozen=True)
class Setup:
    """What ``writer_setup`` gives every task of an epoch (small and picklable).

    Attributes:
        schema: the table's schema after the epoch's evolution (Delta types).
        partition_by: the table's partition columns.
        indexed: the columns Delta keeps statistics of.
    """

    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    indexed: tuple[str, ...] = field(default_factory=tuple)


def required_message(path: str, column: str, nulls: int) -> str:
    return (
        f"Delta table {path}: column {column!r} is NOT NULL in the table, but {nulls} row(s) "
        "of this epoch have a null there. Fill or filter the nulls (e.g. coalesce), or drop "
        "the constraint (ALTER TABLE ... ALTER COLUMN ... DROP NOT NULL). Nothing was committed"
    )


def conform(data: pa.Table, setup: Setup, path: str) -> pa.Table:
    """``data``'s columns cast to the table's types, nulls in NOT NULL columns refused."""
    target = setup.schema
    cols, fields = [], []
    for name in data.column_names:
        if name not in target.names:
            continue  # writer_setup added every column the data has: only the op_column
        f = target.field(name)
        col = data.column(name)
        if col.null_count and not f.nullable:
            raise SchemaMismatchError(required_message(path, name, col.null_count))
        cols.append(col.cast(f.type) if col.type != f.type else col)
        fields.append(f)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def write_files(
    data: pa.Table,
    opts: DeltaSinkOptions,
    setup: Setup,
    directory: str,
    stem: str,
    fs: Any,
    root: str,
) -> list[dict[str, Any]]:
    """Write ``data`` (conformed) as Parquet files under ``directory`` (relative to the
    table's root), one per partition value; their ``add`` descriptions."""
    import pyarrow.parquet as pq

    out = []
    for values, rows in _by_partition(data, setup.partition_by):
        dirs = "".join(f"/{c}={escape(v)}" for c, v in zip(setup.partition_by, values, strict=True))
        rel = f"{directory}{dirs}/{stem}.{opts.compression}.parquet"
        body = rows.drop_columns(list(setup.partition_by))
        collected: list[Any] = []
        fs.create_dir(f"{root}/{directory}{dirs}", recursive=True)
        pq.write_table(
            body,
            f"{root}/{rel}",
            filesystem=fs,
            compression=None if opts.compression == "uncompressed" else opts.compression,
            metadata_collector=collected,
        )
        meta = collected[0]
        size = fs.get_file_info(f"{root}/{rel}").size
        if not opts.on_s3:  # the file and its new directory entries
            fsync_path(f"{root}/{rel}")
            d = rel.rsplit("/", 1)[0]
            while d:
                fsync_path(f"{root}/{d}")
                d = d.rsplit("/", 1)[0] if "/" in d else ""
        out.append(
            {
                "path": rel,
                "size": int(size),
                "partition_values": dict(zip(setup.partition_by, values, strict=True)),
                "rows": body.num_rows,
                "stats": file_stats(
                    meta, body.schema, [c for c in setup.indexed if c in body.column_names]
                ),
            }
        )
    return out


def _by_partition(
    data: pa.Table, cols: tuple[str, ...]
) -> list[tuple[tuple[str | None, ...], pa.Table]]:
    if not cols:
        return [((), data)] if data.num_rows else []
    indexed = data.select(list(cols)).append_column(
        "__eosink_i", pa.array(range(data.num_rows), pa.int64())
    )
    groups = indexed.group_by(list(cols), use_threads=False).aggregate([("__eosink_i", "list")])
    # Raw values that Delta serializes alike ("" and NULL) share one file.
    merged: dict[tuple[str | None, ...], list[pa.Table]] = {}
    for g in range(groups.num_rows):
        values = tuple(
            partition_value(groups.column(c)[g].as_py(), data.schema.field(c).type) for c in cols
        )
        merged.setdefault(values, []).append(data.take(groups.column("__eosink_i_list")[g].values))
    return [(values, pa.concat_tables(parts)) for values, parts in merged.items()]


class DeltaWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Buffers one task's Arrow batches and writes them as the epoch's files."""

    def __init__(self, opts: DeltaSinkOptions, ctx: WriterContext) -> None:
        self.opts = opts
        self.ctx = ctx
        self.setup: Setup = ctx.setup
        self._buffer: list[pa.RecordBatch] = []
        self._bytes = 0
        self._files: list[dict[str, Any]] = []
        self._rows = 0
        self._fs: Any = None
        self._root = ""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # rebuilt in the task: a filesystem holds connections
        return state

    def begin_epoch(self, epoch: int) -> None:
        self._fs, self._root = filesystem(self.opts)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._buffer.append(batch)
        self._bytes += batch.nbytes
        if self._bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        if self._fs is None:
            self._fs, self._root = filesystem(self.opts)
        data = pa.Table.from_batches(self._buffer)
        self._buffer, self._bytes = [], 0
        seq = len(self._files)
        stem = f"part-{self.ctx.partition_id:05d}-{seq:03d}"
        if self.opts.mode == "upsert":
            directory = changes_dir(self.ctx.sink_id, self.ctx.epoch, self.ctx.attempt_id)
            data = pa.Table.from_arrays(data.columns, schema=delta_types(data.schema))
            plain = Setup(schema=data.schema)
            written = write_files(data, self.opts, plain, directory, stem, self._fs, self._root)
            for f in written:
                f.pop("stats", None)
                f.pop("partition_values", None)
        else:
            directory = epoch_dir(self.ctx.sink_id, self.ctx.epoch, self.ctx.attempt_id)
            written = write_files(
                conform(data, self.setup, self.opts.path),
                self.opts,
                self.setup,
                directory,
                stem,
                self._fs,
                self._root,
            )
        self._files += written
        self._rows += sum(f["rows"] for f in written)

    def finish_write(self, epoch: int) -> dict[str, Any]:
        self._flush()
        key = "changes" if self.opts.mode == "upsert" else "files"
        return {key: self._files, "rows": self._rows}

    def abort_write(self) -> None:
        self._buffer = []
        if self._fs is None:
            return
        for f in self._files:
            try:
                self._fs.delete_file(f"{self._root}/{f['path']}")
            except Exception:  # never raise from abort_write; the epoch's abort sweeps it
                pass
        self._files = []


def make_writer(opts: DeltaSinkOptions, ctx: WriterContext) -> DeltaWriter:
    """The delta sink's writer factory (runs in the Spark task)."""
    return DeltaWriter(opts, ctx)
