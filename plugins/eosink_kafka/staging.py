"""Staging an epoch's records (Parquet files), cutting them into chunks, reading them back.

Layout under ``staging_path`` (a local or mounted directory, or ``s3://bucket/prefix`` with
the same keys)::

    <sink key>/<epoch>/<attempt>/part-*.parquet

An epoch's records are staged by Spark's Parquet writer on the driver's job (the native
path: the rows never leave the JVM; local staging only) or by Python writers in Spark tasks
(``format("eosink")``, staging on S3, ``writer="python"``). One file holds the rows of one
Spark partition, in order. The coordinator cuts each file into *chunks* of at most
``chunk_bytes`` (by the row sizes in the Parquet footer) and gives every chunk of one file
to the same transactional id, in order, so records of one partition (and so of one key, for
a DataFrame partitioned by key) keep their order.

:class:`Stage` is the staging location: :class:`LocalStage` (a directory; files fsync'd) or
:class:`S3Stage` (objects through boto3; a Python writer writes its file to a private local
directory, then uploads it in ``finish_write``).
"""

from __future__ import annotations

import logging
import shutil
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eosink import ConfigError, CoordinatedSinkWriter, SinkError, WriterContext
from eosink._s3 import local_tmp_dir, s3_client, split_s3
from eosink.util import abandon_hint, fsync_path

from .options import COLUMNS, KafkaSinkOptions, sink_key

__all__ = [
    "KafkaWriter",
    "LocalStage",
    "Record",
    "S3Stage",
    "Stage",
    "chunks_of",
    "fsync_path",
    "merge_targets",
    "read_chunk",
    "stage_of",
    "staged_file_info",
    "targets_of",
]

log = logging.getLogger("eosink.kafka")

Record = tuple[Any, Any, Any, Any, Any]
"""(topic, value, key, headers, partition) of one record, as produced."""


class Stage(ABC):
    """Where the staged files of every sink using one ``staging_path`` live.

    Paths are *rels*: ``<sink key>/<epoch>/<attempt>/part-*.parquet``, relative to
    :attr:`url`. Thread safety: the methods may be called from several threads.
    """

    url: str
    """The root: an absolute local directory or ``s3://bucket/prefix``."""

    @abstractmethod
    def ensure(self, key: str) -> None:
        """Make the sink's part of the location usable (or raise saying why not)."""

    @abstractmethod
    def read_table(self, rel: str) -> pa.Table | None:
        """The staged file ``rel``, or None if it is gone."""

    @abstractmethod
    def file_info(self, rel: str) -> tuple[int, int]:
        """(rows, uncompressed bytes) of the staged file ``rel``, from its footer."""

    @abstractmethod
    def epochs(self, key: str) -> list[int]:
        """The epochs with anything staged for sink ``key``."""

    @abstractmethod
    def delete_epoch(self, key: str, epoch: int, after_first: Callable[[], None] | None) -> None:
        """Delete everything staged for ``epoch`` of sink ``key``; ``after_first`` is called
        once the first file is deleted (a fault point)."""

    def check_visible(self, files: Sequence[dict[str, Any]]) -> None:
        """Raise unless this driver sees every file of ``files`` (write results), as written.

        Raises:
            SinkError: a staged file is missing or has another size (the location is not
                shared by the executors and the driver).
        """
        return None  # object stores are reached by every node


class LocalStage(Stage):
    """A local (or mounted) directory."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def ensure(self, key: str) -> None:
        try:
            (self.root / key).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"the kafka sink cannot stage in {self.root} ({exc.strerror}): set "
                "staging_path to a directory this user can write (on a cluster, one every "
                "node mounts) or to s3://bucket/prefix"
            ) from None

    def read_table(self, rel: str) -> pa.Table | None:
        path = self.root / rel
        if not path.exists():
            return None
        return pq.read_table(path)

    def file_info(self, rel: str) -> tuple[int, int]:
        return staged_file_info(self.root / rel)

    def epochs(self, key: str) -> list[int]:
        d = self.root / key
        if not d.is_dir():
            return []
        return [int(p.name) for p in d.iterdir() if p.name.isdigit()]

    def delete_epoch(self, key: str, epoch: int, after_first: Callable[[], None] | None) -> None:
        target = self.root / key / str(epoch)
        if after_first is not None:
            victims = sorted(p for p in target.rglob("*") if p.is_file())
            for i, p in enumerate(victims):
                p.unlink(missing_ok=True)
                if i == 0:
                    after_first()
        shutil.rmtree(target, ignore_errors=True)

    def check_visible(self, files: Sequence[dict[str, Any]]) -> None:
        for f in files:
            path = self.root / str(f["staged"])
            try:
                size: int | None = path.stat().st_size
            except FileNotFoundError:
                size = None
            if size != int(f["bytes"]):
                host = f.get("host")
                by = f" by a task on {host}" if host else ""
                seen = "is not there" if size is None else f"has {size} bytes, not {f['bytes']}"
                raise SinkError(
                    f"the kafka sink's staged file {path}, written{by}, {seen} on this driver "
                    f"({socket.gethostname()}): staging_path {self.root} is not shared by the "
                    "executors and the driver. Nothing was published; set staging_path to a "
                    "location every node reaches (a shared mount, or s3://bucket/prefix)"
                )


class S3Stage(Stage):
    """An S3 prefix, through boto3 (extra ``eosink[s3]``)."""

    def __init__(self, url: str, opts: KafkaSinkOptions) -> None:
        self.url = url
        self.bucket, self.prefix = split_s3(url)
        self._args = opts.s3_args()

    @property
    def client(self) -> Any:
        return s3_client(*self._args, what="the kafka sink's staging on s3://")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def ensure(self, key: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            raise ConfigError(
                f"the kafka sink cannot stage in bucket {self.bucket!r} ({code or exc}): "
                "create it, or check staging_path, s3_endpoint_url and the credentials"
            ) from None

    def upload(self, local: Path, rel: str) -> None:
        self.client.upload_file(str(local), self.bucket, self.key(rel))

    def _get(self, rel: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return bytes(body.read())

    def read_table(self, rel: str) -> pa.Table | None:
        data = self._get(rel)
        return None if data is None else pq.read_table(pa.BufferReader(data))

    def file_info(self, rel: str) -> tuple[int, int]:
        data = self._get(rel)
        if data is None:
            raise SinkError(f"staged file {self.url}/{rel} is missing")
        return _info(pq.read_metadata(pa.BufferReader(data)))

    def _keys(self, rel_prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(rel_prefix)
        )
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def epochs(self, key: str) -> list[int]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(f"{key}/"), Delimiter="/"
        )
        names = [
            p["Prefix"].rstrip("/").rsplit("/", 1)[-1]
            for page in pages
            for p in page.get("CommonPrefixes", []) or []
        ]
        return [int(n) for n in names if n.isdigit()]

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            out = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )
            errors = out.get("Errors") or []
            if errors:
                raise SinkError(f"S3 refused to delete {len(errors)} object(s), e.g. {errors[0]}")

    def delete_epoch(self, key: str, epoch: int, after_first: Callable[[], None] | None) -> None:
        keys = sorted(self._keys(f"{key}/{epoch}/"))
        if keys and after_first is not None:
            self.delete(keys[:1])
            after_first()
            keys = keys[1:]
        self.delete(keys)


def stage_of(opts: KafkaSinkOptions, root: str | None = None) -> Stage:
    """The staging location ``root`` (default: the options' ``staging_path``).

    Raises:
        ConfigError: no staging location (the front end fills an unset one in).
    """
    where = root if root is not None else opts.staging_path
    if where is None:
        raise ConfigError(
            "the kafka sink has no staging_path (eosink.run and format('eosink') fill in a "
            "default; a coordinator or writer built directly needs one)"
        )
    if where.startswith("s3://"):
        return S3Stage(where, opts)
    return LocalStage(where)


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


def _info(md: pq.FileMetaData) -> tuple[int, int]:
    size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return int(md.num_rows), int(size)


def staged_file_info(path: Path) -> tuple[int, int]:
    """(rows, uncompressed bytes) of a staged Parquet file, from its footer."""
    return _info(pq.read_metadata(path))


def targets_of(data: pa.Table | pa.RecordBatch, topic: str | None) -> dict[str | None, int]:
    """The topics the rows of ``data`` go to, each with the highest ``partition`` a row names
    (-1: none names one); a ``None`` topic: rows with a null topic and no ``topic`` option.
    Checked against the cluster before the epoch is persisted (``pre_commit``)."""
    n = data.num_rows
    names = data.schema.names
    if n == 0 or (topic is None and "topic" not in names):
        return {}
    part = data.column("partition") if "partition" in names else None
    if topic is not None:
        high = pc.max(part).as_py() if part is not None else None
        return {topic: -1 if high is None else int(high)}
    table = pa.table(
        {
            "topic": data.column("topic"),
            "p": part.cast(pa.int64()) if part is not None else pa.nulls(n, pa.int64()),
        }
    )
    out: dict[str | None, int] = {}
    for row in table.group_by("topic").aggregate([("p", "max")]).to_pylist():
        high = row["p_max"]
        out[row["topic"]] = -1 if high is None else int(high)
    return out


def largest_record(data: pa.Table | pa.RecordBatch) -> int:
    """The size in bytes of the largest record of ``data``: its ``key``, ``value`` and
    ``headers`` (keys and values), as librdkafka counts it against ``message.max.bytes``.
    Checked against the producers' and the topics' limits before the epoch is persisted."""
    n = data.num_rows
    if n == 0:
        return 0
    names = data.schema.names
    size: Any = pc.fill_null(pa.nulls(n, pa.int64()), 0)
    for name in ("value", "key"):
        if name in names:
            lengths = pc.binary_length(data.column(name)).cast(pa.int64())
            size = pc.add(size, pc.fill_null(lengths, 0))
    if "headers" in names:
        headers = data.column("headers")
        if isinstance(headers, pa.ChunkedArray):
            headers = headers.combine_chunks()
        items = pc.list_flatten(headers)
        if len(items):
            each = pc.add(
                pc.fill_null(pc.binary_length(items.field("key")).cast(pa.int64()), 0),
                pc.fill_null(pc.binary_length(items.field("value")).cast(pa.int64()), 0),
            )
            # Per row: the running total at the row's last header minus at its first.
            total = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(each)])
            offsets = pc.subtract(headers.offsets, headers.offsets[0]).cast(pa.int64())
            ends = pc.take(total, offsets[1:])
            starts = pc.take(total, offsets[:-1])
            size = pc.add(size, pc.subtract(ends, starts))
    high = pc.max(size).as_py()
    return int(high or 0)


def merge_targets(into: dict[str | None, int], more: dict[str | None, int]) -> None:
    """Add ``more`` (from :func:`targets_of`) to ``into``: the highest partition wins."""
    for t, p in more.items():
        into[t] = max(p, into.get(t, -1))


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
    stage: Stage, chunk: list[Any], topic: str | None, cache: dict[str, pa.Table]
) -> Iterator[Record]:
    """The records of ``chunk`` (``[rel, start, end]``) in order.

    ``cache`` keeps the last file read (chunks of a file come one after another).

    Raises:
        SinkError: the staged file is gone (the epoch's data is lost) or a row has no topic.
    """
    rel, start, end = str(chunk[0]), int(chunk[1]), int(chunk[2])
    table = cache.get(rel)
    if table is None:
        cache.clear()
        found = stage.read_table(rel)
        if found is None:
            raise SinkError(
                f"staged file {stage.url}/{rel} is missing and the records of its chunk rows "
                f"{start}-{end} were never published (was the staging location deleted, e.g. "
                "with the checkpoint holding it, or by a lifecycle rule?). " + abandon_hint()
            )
        table = cache[rel] = found
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
