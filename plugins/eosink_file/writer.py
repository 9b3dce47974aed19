"""The Python writers of the ``file`` sink (``format("eosink")`` or ``writer="python"``):
one staged file per partition directory per task."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eosink import (
    ConfigError,
    CoordinatedSinkWriter,
    WriterContext,
)
from eosink.util import sink_key

from ._rolling import fsync_path
from ._s3 import S3Store, local_tmp_dir
from .layout import (
    NULL_PARTITION,
    STAGING_DIR,
    escape_partition_value,
    json_default,
    partition_segment,
    partition_value_error,
    partition_value_problem,
    schema_id,
)
from .options import EXT, PYARROW_STREAM_CODEC, TEXT_SUFFIX, FileSinkOptions

log = logging.getLogger("eosink.file")


def _suffix(opts: FileSinkOptions) -> str:
    """The file name suffix of the Python writers' files."""
    return EXT[opts.format] + TEXT_SUFFIX.get(opts.codec, "")


class _OpenFile:
    """One staged file being written by a Python writer."""

    def __init__(self, path: Path, fmt: str, schema: pa.Schema, opts: FileSinkOptions) -> None:
        self.path = path
        self.fmt = fmt
        self.rows = 0
        self.schema_id = schema_id("arrow", [(f.name, str(f.type)) for f in schema])
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "wb")
        self.out: Any = self.fh
        stream_codec = PYARROW_STREAM_CODEC.get(opts.codec)
        if stream_codec and fmt in ("json", "csv", "text"):
            self.out = pa.CompressedOutputStream(self.fh, stream_codec)
        self.writer: Any = None
        if fmt == "parquet":
            import pyarrow.parquet as pq

            self.writer = pq.ParquetWriter(self.out, schema, compression=opts.codec)
        elif fmt == "orc":
            import pyarrow.orc as orc

            codec = "uncompressed" if opts.codec == "none" else opts.codec
            self.writer = orc.ORCWriter(self.out, compression=codec)
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            self.writer = pcsv.CSVWriter(self.out, schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self.fmt == "json":
            lines = [json.dumps(r, default=json_default) for r in batch.to_pylist()]
            self.out.write(("\n".join(lines) + "\n").encode())
        elif self.fmt == "text":
            col = batch.column(0)
            self.out.write(
                "".join(f"{v}\n" if v is not None else "\n" for v in col.to_pylist()).encode()
            )
        elif self.fmt == "orc":
            self.writer.write(pa.Table.from_batches([batch]))
        else:
            self.writer.write_batch(batch)

    def close(self, fsync: bool) -> int:
        if self.writer is not None:
            self.writer.close()
        if self.out is not self.fh:
            self.out.close()  # a CompressedOutputStream: flushes its tail, closes the file
        if not self.fh.closed:
            self.fh.flush()
            if fsync:
                os.fsync(self.fh.fileno())
            self.fh.close()
        elif fsync:
            fsync_path(self.path)
        return self.path.stat().st_size


class FileWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Stages the rows of one task into one file per partition directory."""

    def __init__(self, opts: FileSinkOptions, ctx: WriterContext) -> None:
        if opts.format_options:
            raise ConfigError(
                "format_options are options of Spark's writers, and this epoch is written by "
                'the file sink\'s Python writers (format("eosink") always uses them): drop '
                "format_options, or write with eosink.run()"
            )
        local = opts.local_path
        if local is None and not opts.is_s3:
            raise ConfigError(
                f"the file sink's Python writers write local paths and s3://, not "
                f"{opts.path!r}: {opts.hadoop_scheme}:// paths are written by Spark's own "
                'writers, under eosink.run() (format("eosink") always uses the Python writers)'
            )
        self.opts = opts
        self.ctx = ctx
        self.s3: S3Store | None = S3Store(opts) if opts.is_s3 else None
        # On S3 the files are written to a private local directory, then uploaded.
        self.root = local_tmp_dir() if local is None else local
        self.files: dict[str, _OpenFile] = {}
        self.epoch = ctx.epoch

    def _stage_rel(self) -> str:
        return f"{STAGING_DIR}/{sink_key(self.ctx.sink_id)}/{self.epoch}/{self.ctx.attempt_id}"

    def _stage_dir(self) -> Path:
        return self.root / self._stage_rel()

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _file(self, partition: str, schema: pa.Schema) -> _OpenFile:
        f = self.files.get(partition)
        if f is None:
            name = f"f{len(self.files):05d}.{_suffix(self.opts)}"
            path = self._stage_dir() / partition / name if partition else self._stage_dir() / name
            f = self.files[partition] = _OpenFile(path, self.opts.format, schema, self.opts)
        return f

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        cols = self.opts.partition_by
        if not cols:
            self._file("", batch.schema).write(batch)
            return
        segments = []
        for c in cols:
            enc = pc.dictionary_encode(batch.column(c))
            values = enc.dictionary.to_pylist()
            for v in values:  # the rule of Spark's writer too (guard_partition_values)
                problem = partition_value_problem(c, v)
                if problem is not None:
                    raise partition_value_error(c, v, *problem)
            seg_dict = pa.array(
                [f"{escape_partition_value(c)}={partition_segment(v)}" for v in values],
                pa.string(),
            )
            seg = pc.take(seg_dict, enc.indices)
            segments.append(pc.fill_null(seg, f"{escape_partition_value(c)}={NULL_PARTITION}"))
        dirs = pc.binary_join_element_wise(*segments, "/") if len(segments) > 1 else segments[0]
        enc_dirs = pc.dictionary_encode(dirs)
        data = batch.drop_columns(list(cols))
        for i, d in enumerate(enc_dirs.dictionary.to_pylist()):
            part = data.filter(pc.equal(enc_dirs.indices, i))
            self._file(d, data.schema).write(part)

    def finish_write(self, epoch: int) -> dict[str, Any]:
        out = []
        for partition, f in self.files.items():
            size = f.close(self.opts.fsync and self.s3 is None)
            out.append(
                {
                    "staged": f.path.relative_to(self.root).as_posix(),
                    "partition": partition,
                    "rows": f.rows,
                    "bytes": size,
                    "schema": f.schema_id,
                }
            )
        self.files.clear()
        if self.s3 is not None:
            try:
                out = [self._upload(n, f) for n, f in enumerate(out)]
            finally:
                shutil.rmtree(self.root, ignore_errors=True)
        return {"files": out}

    def _upload(self, n: int, f: dict[str, Any]) -> dict[str, Any]:
        """S3: a staged piece (rolling), or an open multipart upload at its final name."""
        assert self.s3 is not None
        local = self.root / f["staged"]
        if self.opts.rolling:
            self.s3.upload_file(local, f["staged"])
            return f
        token = hashlib.sha1(self.ctx.attempt_id.encode()).hexdigest()[:10]
        key8 = sink_key(self.ctx.sink_id)[:8]
        name = f"part-{self.epoch:010d}-s{key8}-{token}-{n:03d}.{_suffix(self.opts)}"
        final = f"{f['partition']}/{name}" if f["partition"] else name
        upload_id, parts = self.s3.upload_file_parts(local, final)
        return {
            **f,
            "staged": None,
            "final": final,
            "upload": {"id": upload_id, "parts": [p.as_dict() for p in parts]},
        }

    def abort_write(self) -> None:
        for f in self.files.values():
            try:
                if f.writer is not None:
                    f.writer.close()
                f.fh.close()
            except Exception:
                pass
        self.files.clear()
        shutil.rmtree(self.root if self.s3 is not None else self._stage_dir(), ignore_errors=True)


def make_writer(opts: FileSinkOptions, ctx: WriterContext) -> FileWriter:
    return FileWriter(opts, ctx)
