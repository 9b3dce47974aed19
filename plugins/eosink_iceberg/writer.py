"""The Python writer: one per Spark task, writes its Arrow batches with pyiceberg's writer.

Used when the native path (``native.py``) cannot express the table or the DataFrame, with
``writer="python"``, and by ``format("eosink")``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from eosink import ConfigError, CoordinatedSinkWriter, SinkError, WriterContext

from .datafiles import data_file_to_json, write_uuid
from .options import IcebergSinkOptions, require_pyiceberg
from .rows import check_required, utc_timestamps

__all__ = ["FLUSH_BYTES", "IcebergWriter", "make_writer"]


#: Arrow bytes a Python writer holds before it writes them out as data files (append mode):
#: a task's memory stays bounded whatever its partition's size, at the cost of more (smaller)
#: files for a task that holds more than this.
FLUSH_BYTES = 128 * 1024 * 1024


class IcebergWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Buffers one task's Arrow batches and writes them as Iceberg data files.

    Appends are written out whenever the buffer reaches :data:`FLUSH_BYTES` and at
    ``finish_write``; an upsert epoch's changes are staged as one file at ``finish_write``.
    """

    def __init__(self, opts: IcebergSinkOptions, ctx: WriterContext) -> None:
        if ctx.setup is None:
            raise SinkError("the iceberg writer needs the table metadata from writer_setup")
        self.opts = opts
        self.ctx = ctx
        self.epoch = 0
        self.batches: list[pa.RecordBatch] = []
        self.buffered = 0
        self.files: list[dict[str, Any]] = []
        self.written: list[str] = []
        self._table: tuple[Any, Any] | None = None  # (metadata, FileIO), parsed once

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches = []
        self.buffered = 0
        self.files = []

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self.batches.append(batch)
        self.buffered += batch.nbytes
        if self.buffered >= FLUSH_BYTES and self.opts.mode != "upsert":
            self._flush()

    def _flush(self) -> None:
        """Write the buffered rows as data files of the table (recorded in ``self.files``)."""
        if not self.batches:
            return
        require_pyiceberg()
        from ._compat import arrow_to_data_files

        table = pa.Table.from_batches(self.batches)
        self.batches, self.buffered = [], 0
        metadata, io = self._metadata_and_io()
        utc = utc_timestamps(table.schema)
        if utc != table.schema:
            table = table.cast(utc)
        check_required(metadata.schema(), table, self.opts.table)
        uid = write_uuid(self.ctx.sink_id, self.epoch)
        for df in arrow_to_data_files(metadata, table, io, uid):
            self.written.append(df.file_path)
            self.files.append(data_file_to_json(df, metadata.default_spec_id))

    def _metadata_and_io(self) -> tuple[Any, Any]:
        """The table's metadata and FileIO from ``writer_setup``, parsed at the first write-out
        (each write-out of a task writes into the same table version)."""
        if self._table is None:
            from pyiceberg.io import load_file_io

            from ._compat import parse_table_metadata

            metadata = parse_table_metadata(self.ctx.setup["metadata"])
            self._table = (metadata, load_file_io(self.ctx.setup["io"], metadata.location))
        return self._table

    def finish_write(self, epoch: int) -> dict[str, Any]:
        evolve = self.ctx.setup.get("evolve")
        self.epoch = epoch
        if self.opts.mode == "upsert":  # the task's changes, as they are (cdc.py)
            if not self.batches:
                return {"files": [], "evolve": evolve}
            from .cdc import stage_task_changes

            table = pa.Table.from_batches(self.batches)
            self.batches, self.buffered = [], 0
            staged = stage_task_changes(
                table,
                self.ctx.setup,
                self.ctx.sink_id,
                epoch,
                self.ctx.attempt_id,
                self.ctx.partition_id,
            )
            self.written.append(staged["path"])
            return {"files": [], "changes": [staged], "evolve": evolve}
        self._flush()
        files, self.files = self.files, []
        return {"files": files, "evolve": evolve}

    def abort_write(self) -> None:
        if not self.written:
            return
        from pyiceberg.io import load_file_io

        io = load_file_io(self.ctx.setup["io"])
        for p in self.written:
            try:
                io.delete(p)
            except Exception:
                pass


def make_writer(opts: IcebergSinkOptions, ctx: WriterContext) -> IcebergWriter:
    """The writer factory (on executors).

    Raises:
        ConfigError: ``writer="spark"``: Python writers were asked for anyway (only
            ``eosink.run`` has the native path; ``format("eosink")`` runs Python writers).
    """
    if opts.writer == "spark":
        raise ConfigError(
            "iceberg sink: writer='spark' asks for Spark's own Parquet writer, but this run "
            'writes with Python writers in Spark tasks (format("eosink") always does; '
            "eosink.run() has the native path). Use writer='auto' or 'python' here."
        )
    return IcebergWriter(opts, ctx)
