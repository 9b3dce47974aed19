"""Staging an epoch's records (Parquet files), cutting them into chunks, reading them back.

Layout under ``staging_path``::

    <sink key>/<epoch>/<attempt>/part-*.parquet

An epoch's records are staged by Spark's Parquet writer on the driver's job (the native
path: the rows never leave the JVM) or by Python writers in Spark tasks
(``format("eosink")``). One file holds the rows of one Spark partition, in order. The
coordinator cuts each file into *chunks* of at most ``chunk_bytes`` (by the row sizes in the
Parquet footer) and gives every chunk of one file to the same transactional id, in order,
so records of one partition (and so of one key, for a DataFrame partitioned by key) keep
their order.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eosink import CoordinatedSinkWriter, SinkError, WriterContext

from .options import COLUMNS, KafkaSinkOptions, sink_key

__all__ = ["KafkaWriter", "Record", "chunks_of", "fsync_path", "read_chunk", "staged_file_info"]

Record = tuple[Any, Any, Any, Any, Any]
"""(topic, value, key, headers, partition) of one record, as produced."""


def fsync_path(path: Path) -> None:
    """fsync a file or a directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_root(opts: KafkaSinkOptions, sink_id: str) -> Path:
    return Path(opts.staging_path) / sink_key(sink_id)


class KafkaWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Stages one task's rows into one Parquet file (Python writers, ``format("eosink")``)."""

    def __init__(self, opts: KafkaSinkOptions, ctx: WriterContext) -> None:
        self.opts = opts
        self.ctx = ctx
        self.dir = staging_root(opts, ctx.sink_id) / str(ctx.epoch) / ctx.attempt_id
        self.path = self.dir / "part-00000.parquet"
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def begin_epoch(self, epoch: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = batch.select([n for n in COLUMNS if n in batch.schema.names])
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, batch.schema, compression="snappy")
        self.writer.write_batch(batch)
        self.rows += batch.num_rows

    def finish_write(self, epoch: int) -> dict[str, Any]:
        if self.writer is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return {"files": []}
        self.writer.close()
        self.writer = None
        if self.opts.fsync:
            fsync_path(self.path)
            fsync_path(self.dir)
        rel = self.path.relative_to(Path(self.opts.staging_path)).as_posix()
        return {"files": [{"staged": rel, "rows": self.rows, "bytes": self.path.stat().st_size}]}

    def abort_write(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def staged_file_info(path: Path) -> tuple[int, int]:
    """(rows, uncompressed bytes) of a staged Parquet file, from its footer."""
    md = pq.read_metadata(path)
    size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return int(md.num_rows), int(size)


def chunks_of(rel: str, rows: int, size: int, chunk_bytes: int) -> list[list[Any]]:
    """``[rel, start row, end row]`` chunks of a staged file of ``rows`` rows and ``size`` bytes."""
    if rows <= 0:
        return []
    per = max(1, int(chunk_bytes * rows // max(size, 1)))
    return [[rel, start, min(start + per, rows)] for start in range(0, rows, per)]


def _as_bytes_list(col: pa.ChunkedArray | None, n: int) -> list[Any]:
    if col is None:
        return [None] * n
    out: list[Any] = col.to_pylist()
    return out


def read_chunk(
    root: Path, chunk: list[Any], topic: str | None, cache: dict[str, pa.Table]
) -> Iterator[Record]:
    """The records of ``chunk`` (``[rel, start, end]``) in order.

    ``cache`` keeps the last file read (chunks of a file come one after another).

    Raises:
        SinkError: the staged file is gone (the epoch's data is lost) or a row has no topic.
    """
    rel, start, end = str(chunk[0]), int(chunk[1]), int(chunk[2])
    table = cache.get(rel)
    if table is None:
        path = root / rel
        if not path.exists():
            raise SinkError(
                f"staged file {path} is missing and the records of its chunk rows "
                f"{start}-{end} were never published: the epoch's data is lost (was the "
                "staging directory deleted?)"
            )
        cache.clear()
        table = cache[rel] = pq.read_table(path)
    part = table.slice(start, end - start)
    n = part.num_rows
    names = part.schema.names
    values = part.column("value").to_pylist()
    keys = _as_bytes_list(part.column("key") if "key" in names else None, n)
    if topic is not None:
        topics: list[Any] = [topic] * n
    elif "topic" in names:
        topics = part.column("topic").to_pylist()
        if None in topics:
            row = start + topics.index(None)
            raise SinkError(
                f"row {row} of staged file {rel} has a null topic and the sink has no topic "
                "option: every record needs a topic"
            )
    else:  # validate_schema refuses this; kept for a hand-made committable
        raise SinkError("no topic option and no topic column")
    parts = (
        [-1 if p is None else int(p) for p in part.column("partition").to_pylist()]
        if "partition" in names
        else [-1] * n
    )
    if "headers" in names:
        headers: list[Any] = [
            None if h is None else [(x["key"], x["value"]) for x in h]
            for h in part.column("headers").to_pylist()
        ]
    else:
        headers = [None] * n
    return zip(topics, values, keys, headers, parts, strict=True)
