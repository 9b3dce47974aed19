"""The kafka sink's Python writer (Spark tasks): one task's rows staged in one Parquet file.

An epoch's records are staged by Spark's Parquet writer on the driver's job (the native
path, :mod:`~eosink_kafka.native`: the rows never leave the JVM; local staging only) or by
these Python writers in Spark tasks (``format("eosink")``, staging on S3,
``writer="python"``). One file holds the rows of one Spark partition, in order. On S3 a
writer writes its file to a private local directory, then uploads it in ``finish_write``.
"""

from __future__ import annotations

import logging
import shutil
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eosink import CoordinatedSinkWriter, WriterContext
from eosink._s3 import local_tmp_dir
from eosink.util import fsync_path

from .options import COLUMNS, KafkaSinkOptions, sink_key
from .records import largest_record, merge_targets, targets_of
from .stage import LocalStage, S3Stage, stage_of, staged_file_info

__all__ = ["KafkaWriter"]

log = logging.getLogger("eosink.kafka")


class KafkaWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Stages one task's rows into one Parquet file (Python writers).

    Locally the file is written in place and fsync'd; for staging on S3 it is written to a
    private local directory and uploaded by ``finish_write``.
    """

    def __init__(self, opts: KafkaSinkOptions, ctx: WriterContext) -> None:
        self.opts = opts
        self.ctx = ctx
        self.stage = stage_of(opts)
        self.rel_dir = f"{sink_key(ctx.sink_id)}/{ctx.epoch}/{ctx.attempt_id}"
        self.rel = f"{self.rel_dir}/part-00000.parquet"
        self.dir: Path | None = None
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        self.uploaded = False
        self.targets: dict[str | None, int] = {}
        self.largest = 0

    @property
    def path(self) -> Path:
        assert self.dir is not None
        return self.dir / "part-00000.parquet"

    def begin_epoch(self, epoch: int) -> None:
        if isinstance(self.stage, LocalStage):
            self.dir = self.stage.root / self.rel_dir
        else:
            self.dir = local_tmp_dir()
        self.dir.mkdir(parents=True, exist_ok=True)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = batch.select([n for n in COLUMNS if n in batch.schema.names])
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, batch.schema, compression="snappy")
        self.writer.write_batch(batch)
        self.rows += batch.num_rows
        merge_targets(self.targets, targets_of(batch, self.opts.topic))
        self.largest = max(self.largest, largest_record(batch))

    def finish_write(self, epoch: int) -> dict[str, Any]:
        assert self.dir is not None
        if self.writer is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return {"files": []}
        self.writer.close()
        self.writer = None
        _, raw = staged_file_info(self.path)
        size = self.path.stat().st_size
        if isinstance(self.stage, S3Stage):
            self.uploaded = True  # from here on abort_write deletes the object too
            self.stage.upload(self.path, self.rel)
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self.opts.fsync:
            fsync_path(self.path)
            fsync_path(self.dir)
        f = {
            "staged": self.rel,
            "rows": self.rows,
            "bytes": size,
            "raw": raw,
            "targets": [[t, p] for t, p in self.targets.items()],
            "largest": self.largest,
        }
        return {"files": [{**f, "host": socket.gethostname()}]}

    def abort_write(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
        except Exception:
            pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.uploaded and isinstance(self.stage, S3Stage):
            try:
                self.stage.delete([self.stage.key(self.rel)])
            except Exception:  # swept at the next start (staged_epochs)
                log.warning("kafka sink: could not delete %s/%s", self.stage.url, self.rel)
