"""The ``file`` sink: Parquet, ORC, JSON lines, CSV or text files, local or on S3.

Layout under ``path`` (a local directory, or an ``s3://bucket/prefix`` with the same keys)::

    _eosink_staging/<sink key>/<epoch>/<attempt>/<partition dirs>/<file>           (staged)
    _eosink_staging/<sink key>/slots/<slot>-<start epoch>.<ext>   (an open file, local rows)
    <col=value>/.../part-<epoch>-<n>-<token>.<ext>                (published, every epoch)
    <col=value>/.../part-<start epoch>-s<sink key 8>.<ext>        (published, rolled)
    _eosink/<sink key>.json                                    (the sink's marker)
    _eosink/<sink key>.slots.json                              (open files, rolling)
    _eosink/commits/<sink key>/<epoch>[.roll-<n>].json         (the manifests)

Two writer kinds stage an epoch: Spark's own ``DataFrameWriter`` on the driver (the native
path, :class:`~eosink.sink.SparkWriter`; the rows never leave the JVM) or Python writers in
Spark tasks (``format("eosink")``, or ``writer="python"``). Readers (Spark, pyarrow, pandas)
ignore directories starting with ``_``, so staged files are invisible. ``commit`` publishes
each staged file with an atomic rename (fsync'd), then writes the epoch's manifest, and is
idempotent: a published file that is present with the committed size counts as done.
``abort`` deletes the epoch's staging directory; nothing else is ever written. With
rolling options files span epochs (:mod:`eosink_file._rolling`); on S3 files are multipart
uploads completed at commit (:mod:`eosink_file._s3`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

import eosink
from eosink import (
    ConfigError,
    CoordinatedSinkWriter,
    JsonCodec,
    Prepared,
    Rolling,
    SchemaMismatchError,
    SinkCommitCoordinator,
    SinkError,
    SinkPlugin,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    WriterContext,
    fault_point,
)

from ._rolling import Roller, fsync_path, manifest, piece_ext
from ._s3 import S3Store, local_tmp_dir

log = logging.getLogger("eosink.file")

STAGING_DIR = "_eosink_staging"
MARKER_DIR = "_eosink"
COMMITS_DIR = "commits"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
FORMATS = ("parquet", "orc", "json", "csv", "text")
_EXT = {"parquet": "parquet", "orc": "orc", "json": "jsonl", "csv": "csv", "text": "txt"}
# Characters escaped in partition directory names (Hive/Spark's set, plus NUL), as %XX.
_ESCAPE = {chr(c) for c in range(0x00, 0x20)} | set("\"#%'*/:=?\\\x7f{[]^")


# Parquet codecs pyarrow writes (LZO is read-only in Arrow C++); Spark's "uncompressed" = none.
_PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd")
_CODEC_ALIASES = {"uncompressed": "none", "bz2": "bzip2"}
# Codecs both writer kinds write, per format (Spark's name; pyarrow's where it differs).
_ORC_CODECS = ("none", "snappy", "zlib", "zstd", "lz4")
_TEXT_CODECS = ("none", "gzip", "bzip2")
_DEFAULT_CODEC = {"parquet": "snappy", "orc": "snappy"}
_PYARROW_STREAM_CODEC = {"gzip": "gzip", "bzip2": "bz2"}
_TEXT_SUFFIX = {"gzip": ".gz", "bzip2": ".bz2"}


def parquet_codecs() -> list[str]:
    """The Parquet compression codecs this installation of pyarrow can write."""
    out = []
    for c in _PARQUET_CODECS:
        try:
            if c == "none" or pa.Codec.is_available(c):
                out.append(c)
        except ValueError:  # a codec name this pyarrow does not know
            pass
    return out


def codecs_for(fmt: str) -> list[str]:
    """The compression codecs the file sink writes for ``fmt`` (both writer kinds)."""
    if fmt == "parquet":
        return parquet_codecs()
    return list(_ORC_CODECS if fmt == "orc" else _TEXT_CODECS)


def _not_writable(path: Path) -> str | None:
    """Why the file sink could not create or write the directory ``path``, else None."""
    try:
        st: os.stat_result | None = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as exc:
        return f"cannot be accessed ({exc.strerror})"
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            return "exists and is not a directory (the file sink writes a directory of files)"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is a directory this user cannot write"
        return None
    parent = path.parent
    while True:  # the nearest existing ancestor is where the directories get created
        try:
            st = parent.stat()
            break
        except (FileNotFoundError, NotADirectoryError):
            if parent.parent == parent:
                return "cannot be created"
            parent = parent.parent
        except OSError as exc:
            return f"cannot be created: {parent}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"cannot be created: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable by this user"
    return None


class FileSinkOptions(BaseModel):
    """Options of the ``file`` sink.

    Validated on the driver before any Spark job or meta store row: the path must be a
    directory this user can create or write, partition columns distinct, the codec one that
    the format can be written with.

    Attributes:
        path: output directory: a local directory (created if missing) or
            ``s3://bucket/prefix`` (boto3, extra ``eosink[s3]``; written by the Python
            writers).
        format: ``parquet`` (default), ``orc``, ``json`` (JSON lines), ``csv`` (with a header)
            or ``text`` (one string column, one line per row).
        partition_by: distinct columns giving Hive-style ``col=value/`` directories. Values
            are escaped (``/`` becomes ``%2F``...) so that no value can leave ``path``.
        compression: codec (:func:`codecs_for`): Parquet ``snappy`` (default), ``none``,
            ``gzip``, ``brotli``, ``lz4``, ``lz4_raw``, ``zstd``; ORC ``snappy`` (default),
            ``none``, ``zlib``, ``zstd``, ``lz4``; JSON, CSV and text ``none`` (default),
            ``gzip``, ``bzip2``. ``uncompressed`` means ``none``.
        writer: ``auto`` (default): Spark's own writers stage the epoch (the native path)
            when eosink runs the DataFrame (``eosink.run``), Python writers in Spark tasks
            under ``format("eosink")``. ``spark``: the native path or an error. ``python``:
            always the Python writers.
        format_options: Spark's options of the format's writer (``{"timestampFormat": ...}``,
            ``{"parquet.block.size": "67108864"}``...), native path only. For CSV eosink sets
            ``header=true`` and ``escape="`` unless given here.
        fsync: fsync staged files and published directories (durability on power loss).
        rollover_seconds: rolling: an open file is published once its first epoch is this
            old (checked at every epoch, and by a timer between micro-batches).
        max_row_count: rolling: an open file is published once it holds this many rows.
        max_file_bytes: rolling: an open file is published once it holds this many bytes.
        inactivity_seconds: rolling: an open file that got no rows for this long is
            published (so a quiet partition's rows do not wait for the next epoch).
            With none of the four rolling options (the default) every epoch publishes its
            own files. With any of them, each partition directory has one open file that
            collects the rows of consecutive epochs, published when any condition is met,
            at a batch run's end and when a stream stops or ends (``availableNow``).
        s3_endpoint_url: ``s3://`` paths: the S3 endpoint (default: AWS's).
        s3_region: ``s3://`` paths: the region (default: boto3's configuration).
        s3_access_key_id: ``s3://`` paths: the access key (default: boto3's credential chain).
        s3_secret_access_key: ``s3://`` paths: the secret key; never logged or stored.
        s3_session_token: ``s3://`` paths: a session token; never logged or stored.
        s3_part_bytes: ``s3://`` paths: the size of multipart upload parts (>= 5 MiB).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    format: Literal["parquet", "orc", "json", "csv", "text"] = "parquet"
    partition_by: tuple[str, ...] = ()
    compression: str | None = None
    writer: Literal["auto", "spark", "python"] = "auto"
    format_options: dict[str, str] = Field(default_factory=dict)
    fsync: bool = True
    rollover_seconds: float | None = Field(default=None, gt=0)
    max_row_count: int | None = Field(default=None, ge=1)
    max_file_bytes: int | None = Field(default=None, ge=1)
    inactivity_seconds: float | None = Field(default=None, gt=0)
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = Field(default=None, repr=False)
    s3_secret_access_key: SecretStr | None = None
    s3_session_token: SecretStr | None = None
    s3_part_bytes: int = Field(default=8 * 1024 * 1024, ge=5 * 1024 * 1024)

    @field_validator("path")
    @classmethod
    def _local_path(cls, v: str) -> str:
        if v.startswith("s3://"):
            bucket, _, _ = v.removeprefix("s3://").partition("/")
            if not bucket:
                raise ValueError(f"{v!r} names no bucket; use s3://bucket/prefix")
            return "s3://" + v.removeprefix("s3://").rstrip("/")
        if "://" in v and not v.startswith("file://"):
            raise ValueError(
                "the file sink writes local paths and s3://bucket/prefix "
                f"(got {v.split('://')[0]}://; for s3a:// write s3://)"
            )
        resolved = Path(v.removeprefix("file://")).expanduser().resolve()
        problem = _not_writable(resolved)
        if problem:
            shown = repr(v) if str(resolved) == v else f"{v!r} ({resolved})"
            raise ValueError(f"{shown} {problem}")
        return str(resolved)

    @field_validator("partition_by", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if isinstance(v, str):  # "a,b" as written in Spark's .option("partition_by", "a,b")
            return tuple(c.strip() for c in v.split(",") if c.strip())
        return v

    @field_validator("partition_by")
    @classmethod
    def _distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        dups = sorted({c for c in v if v.count(c) > 1})
        if dups:
            which = (
                f"column {dups[0]!r} appears"
                if len(dups) == 1
                else (f"columns {', '.join(map(repr, dups))} appear")
            )
            raise ValueError(
                f"{which} more than once in {list(v)}; a column is a partition column once"
            )
        return v

    @field_validator("format_options", mode="before")
    @classmethod
    def _as_strings(cls, v: Any) -> Any:
        if isinstance(v, Mapping):  # Spark's writer options are strings
            return {str(k): str(x).lower() if isinstance(x, bool) else str(x) for k, x in v.items()}
        return v

    @field_validator("compression")
    @classmethod
    def _codec(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        c = v.strip().lower()
        c = _CODEC_ALIASES.get(c, c)
        fmt = info.data.get("format", "parquet")
        codecs = codecs_for(fmt)
        if c not in codecs:
            raise ValueError(
                f"{v!r} is not a codec for format={fmt!r}; use one of: {', '.join(codecs)}"
            )
        return c

    @model_validator(mode="after")
    def _writer(self) -> FileSinkOptions:
        if self.writer == "python" and self.format_options:
            raise ValueError(
                "format_options are options of Spark's writers; writer='python' does not use "
                "them (drop them, or use writer='auto')"
            )
        s3_set = [
            k
            for k in (
                "s3_endpoint_url",
                "s3_region",
                "s3_access_key_id",
                "s3_secret_access_key",
                "s3_session_token",
            )
            if getattr(self, k) is not None
        ]
        if self.is_s3:
            if self.writer == "spark":
                raise ValueError(
                    "writer='spark' cannot write s3:// paths (Spark would need hadoop-aws and "
                    "its own S3A credentials); use writer='auto': the Python writers upload "
                    "through boto3"
                )
            if self.format_options:
                raise ValueError(
                    "format_options are options of Spark's writers, which do not write s3:// "
                    "paths: drop them"
                )
        elif s3_set:
            raise ValueError(f"{', '.join(s3_set)} only apply to s3:// paths (path={self.path!r})")
        return self

    @property
    def is_s3(self) -> bool:
        """Whether the path is an S3 prefix."""
        return self.path.startswith("s3://")

    @property
    def rolling(self) -> bool:
        """Whether any rolling option is set (files span epochs)."""
        return any(
            v is not None
            for v in (
                self.rollover_seconds,
                self.max_row_count,
                self.max_file_bytes,
                self.inactivity_seconds,
            )
        )

    @property
    def codec(self) -> str:
        """The codec files are written with (the format's default when none is given)."""
        return self.compression or _DEFAULT_CODEC.get(self.format, "none")


def escape_partition_value(value: str) -> str:
    """Escape a partition value for a directory name (Hive/Spark style, ``%XX``)."""
    # "." and ".." are harmless: a directory is always "col=<value>", never a bare "..".
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)


def _partition_segment(value: Any) -> str:
    if value is None:
        return NULL_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        value = value.hex()
    text = str(value)
    return escape_partition_value(text) if text else NULL_PARTITION


def schema_id(kind: str, columns: Sequence[tuple[str, str]]) -> str:
    """A short fingerprint of a piece's data columns (names and types, not nullability).

    Pieces of one open file must share it: a rolling slot whose columns change rolls first.
    """
    return hashlib.sha1(json.dumps([kind, list(columns)]).encode()).hexdigest()[:12]


def sink_key(sink_id: str) -> str:
    return hashlib.sha1(sink_id.encode()).hexdigest()[:16]


def _json_default(v: Any) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def _write_json_atomic(path: Path, data: dict[str, Any], fsync: bool) -> None:
    """Write ``data`` as JSON to ``path`` by rename: readers see the old or the new file."""
    d = path.parent
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(json.dumps(data, sort_keys=True).encode())
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_path(d)


def _suffix(opts: FileSinkOptions) -> str:
    """The file name suffix of the Python writers' files."""
    return _EXT[opts.format] + _TEXT_SUFFIX.get(opts.codec, "")


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
        stream_codec = _PYARROW_STREAM_CODEC.get(opts.codec)
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
            lines = [json.dumps(r, default=_json_default) for r in batch.to_pylist()]
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
        self.opts = opts
        self.ctx = ctx
        self.s3: S3Store | None = S3Store(opts) if opts.is_s3 else None
        # On S3 the files are written to a private local directory, then uploaded.
        self.root = local_tmp_dir() if self.s3 is not None else Path(opts.path)
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
            seg_dict = pa.array(
                [
                    f"{escape_partition_value(c)}={_partition_segment(v)}"
                    for v in enc.dictionary.to_pylist()
                ],
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


class FileCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    SparkWriter[dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    Rolling,
):
    """Publishes an epoch's staged files atomically; deletes them on abort.

    The sink's marker is ``_eosink/<sink key>.json`` under ``path``: the core's marker plus
    ``last_epoch``, rewritten atomically (fsync'd) by ``commit`` before it publishes files.
    Each committed epoch's manifest is ``_eosink/commits/<sink key>/<epoch>.json``, written
    (atomically, fsync'd) once all its files are published: readers that go by the
    manifests (:func:`committed_files`) see whole epochs only. With rolling options the
    files span epochs (:mod:`eosink_file._rolling`).
    """

    def __init__(self, opts: FileSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.key = sink_key(sink_id)
        self.s3: S3Store | None = S3Store(opts) if opts.is_s3 else None
        self.root = Path(opts.path) if self.s3 is None else Path("/nonexistent")
        self.staging_rel = f"{STAGING_DIR}/{self.key}"
        self.staging = self.root / self.staging_rel
        self.marker_rel = f"{MARKER_DIR}/{self.key}.json"
        self.marker_path = self.root / self.marker_rel
        self.commits_rel = f"{MARKER_DIR}/{COMMITS_DIR}/{self.key}"
        self.commits = self.root / self.commits_rel
        self._marker: dict[str, Any] | None = None
        # Also without rolling options: files left open by an earlier run that had them are
        # published at this run's end, never forgotten.
        self.roller = Roller(
            opts,
            self.key,
            None if self.s3 else self.root,
            self.s3,
            self._write_json,
            self._read_json,
        )

    # -- storage ---------------------------------------------------------------------------
    def _read_json(self, rel: str) -> dict[str, Any] | None:
        try:
            raw = self.s3.get(rel) if self.s3 is not None else (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None
        except Exception as exc:
            if self.s3 is not None and S3Store.missing(exc):
                return None
            raise
        data: dict[str, Any] = json.loads(raw)
        return data

    def _write_json(self, rel: str, data: dict[str, Any]) -> None:
        if self.s3 is not None:  # a PUT replaces the object atomically
            self.s3.put(rel, json.dumps(data, sort_keys=True).encode())
        else:
            _write_json_atomic(self.root / rel, data, self.opts.fsync)

    # -- the native path -------------------------------------------------------------------
    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        """Why Spark's writers cannot stage this sink's epochs (then Python writers do).

        Raises:
            ConfigError: ``writer='spark'`` and they cannot.
        """
        if self.opts.writer == "python":
            return "the file sink's option writer='python'"
        if self.s3 is not None:
            return "the path is on S3 (the Python writers upload through boto3)"
        why = None
        if self.opts.format == "parquet" and self.opts.codec == "brotli":
            why = "Spark ships no Brotli codec for Parquet (compression='brotli')"
        elif self.opts.max_row_count is not None and self.opts.format in ("json", "csv", "text"):
            why = (
                "max_row_count needs each file's row count, which Spark's text writers do not "
                "report"
            )
        if why and self.opts.writer == "spark":
            raise ConfigError(f"writer='spark' is not possible: {why}; use writer='auto'")
        return why

    def write_with_spark(
        self, df: Any, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Spark's ``DataFrameWriter`` writes the epoch into its own staging directory.

        Spark's commit protocol moves only the files of committed tasks into it (failed and
        speculative attempts stay in its ``_temporary``, deleted with the epoch's staging).
        """
        stage = self.staging / str(epoch) / attempt
        fmt = self.opts.format
        w = df.write.format(fmt).mode("errorifexists")
        w = w.option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        w = w.option("compression", self.opts.codec)
        if fmt == "csv":  # what the Python writers write: a header, RFC 4180 quoting
            w = w.option("header", "true").option("escape", '"')
        for k, v in self.opts.format_options.items():
            w = w.option(k, v)
        if self.opts.partition_by:
            w = w.partitionBy(*self.opts.partition_by)
        w.save(str(stage))
        data_cols = [f for f in df.schema.fields if f.name not in self.opts.partition_by]
        sid = schema_id("spark", [(f.name, f.dataType.simpleString()) for f in data_cols])
        files: list[dict[str, Any]] = []
        for p in sorted(stage.rglob("*")):
            if p.name.startswith((".", "_")) or not p.is_file():
                continue
            rel = p.relative_to(stage)
            if any(part.startswith("_") for part in rel.parts):
                continue  # Spark's _temporary (a failed attempt's leftovers)
            size = p.stat().st_size
            if _empty_file(p, fmt, size):
                p.unlink()
                continue
            files.append(
                {
                    "staged": p.relative_to(self.root).as_posix(),
                    "partition": rel.parent.as_posix() if rel.parent.parts else "",
                    "rows": _file_rows(p, fmt) if self.opts.max_row_count else None,
                    "bytes": size,
                    "schema": sid,
                }
            )
        if self.opts.fsync:  # Spark's writers do not fsync: do it here, files in parallel
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(fsync_path, [self.root / f["staged"] for f in files]))
            for d in {stage / Path(f["partition"]) for f in files}:
                fsync_path(d)
        return [{"files": files}]

    def init(self) -> None:
        if self.s3 is not None:
            self.s3.check_bucket()
        else:
            self.root.mkdir(parents=True, exist_ok=True)
        self.roller.load()
        if self.roller.committed["slots"] and not self.opts.rolling:
            log.warning(
                "file sink: %d file(s) left open by an earlier run with rolling options; "
                "they are published at the end of this run",
                len(self.roller.committed["slots"]),
            )

    def target_id(self) -> str:
        return f"file:{self.opts.path}" if self.s3 is not None else f"file:{self.root}"

    # -- the marker ------------------------------------------------------------------------
    def read_marker(self) -> dict[str, Any] | None:
        try:
            data = self._read_json(self.marker_rel)
        except ValueError as exc:
            raise SinkError(
                f"the eosink marker {self.marker_rel} under {self.opts.path} is corrupt "
                f"({exc}); it records which epochs this directory holds. Restore it, or move "
                "the directory aside"
            ) from None
        if data is None:
            return None
        self._marker = data
        return dict(data)

    def _store_marker(self, marker: dict[str, Any]) -> None:
        self._write_json(self.marker_rel, marker)
        self._marker = marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        last = self._last_epoch()
        self._store_marker({**marker, "last_epoch": last})

    def _last_epoch(self) -> int:
        if self._marker is None:
            self.read_marker()
        return int((self._marker or {}).get("last_epoch", -1))

    # -- the protocol ----------------------------------------------------------------------
    def pre_commit(self, epoch: int, results: Sequence[dict[str, Any]]) -> Prepared[dict[str, Any]]:
        staged = [f for r in results for f in r["files"]]
        if self.opts.rolling:
            c = self.roller.prepare(epoch, staged)
            held_rows, held_bytes = self.roller.held(c["state"])
            return Prepared(
                c,
                files=len(c["rolled"]),
                bytes=sum(int(r["bytes"]) for r in c["rolled"]),
                held_rows=held_rows,
                held_bytes=held_bytes,
            )
        if self.s3 is not None:  # the writers' uploads are open at their final names
            files = sorted(staged, key=lambda f: str(f["final"]))
            for f in files:
                f["start_epoch"] = f["end_epoch"] = epoch
            return Prepared(
                {"files": files}, files=len(files), bytes=sum(int(f["bytes"]) for f in files)
            )
        token = uuid.uuid4().hex[:12]
        files = []
        for n, f in enumerate(sorted(staged, key=lambda f: str(f["staged"]))):
            # "parquet", "jsonl.gz"; Spark's "c000.snappy.parquet" loses its "c000".
            ext = piece_ext(f["staged"])
            name = f"part-{epoch:010d}-{n:05d}-{token}.{ext}"
            final = f"{f['partition']}/{name}" if f["partition"] else name
            files.append(
                {
                    "staged": f["staged"],
                    "final": final,
                    "rows": f["rows"],
                    "bytes": f["bytes"],
                    "start_epoch": epoch,
                    "end_epoch": epoch,
                }
            )
        return Prepared(
            {"files": files, "token": token},
            files=len(files),
            bytes=sum(int(f["bytes"]) for f in files),
        )

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        if epoch > self._last_epoch():
            # Before anything is visible: the marker never says less than the target holds.
            self._store_marker({**(self._marker or {}), "last_epoch": epoch})
        if committable.get("mode") == "rolling":
            rolled = self.roller.commit(epoch, committable)
            self._write_manifest(epoch, manifest(epoch, rolled)["files"])
            self.roller.after_commit(epoch, committable)
            self._clean_epoch(epoch, keep=self.roller.referenced())
            return
        if self.s3 is not None:
            for i, f in enumerate(committable["files"]):
                self.s3.complete(
                    f["final"], f["upload"]["id"], f["upload"]["parts"], int(f["bytes"])
                )
                if i == 0:
                    fault_point("mid_commit")
            # Uploads of failed or speculative task attempts of this epoch.
            mine = f"part-{epoch:010d}-s{self.key[:8]}-"
            for rel, uid in self.s3.uploads():
                if rel.rsplit("/", 1)[-1].startswith(mine):
                    self.s3.abort_upload(rel, uid)
        else:
            self._publish_local(epoch, committable)
        self._write_manifest(
            epoch, [{"path": f["final"], "bytes": f["bytes"]} for f in committable["files"]]
        )
        # Leftovers of failed or speculative task attempts of this epoch.
        self._clean_epoch(epoch, keep=self.roller.referenced())

    def _publish_local(self, epoch: int, committable: dict[str, Any]) -> None:
        dirs: set[Path] = set()
        for i, f in enumerate(committable["files"]):
            final = self.root / f["final"]
            staged = self.root / f["staged"]
            if final.exists():
                if final.stat().st_size != f["bytes"]:
                    raise SinkError(
                        f"epoch {epoch}: {final} exists with an unexpected size; "
                        "another writer uses this path"
                    )
                continue  # already published by an earlier attempt of this commit
            if not staged.exists():
                raise SinkError(
                    f"epoch {epoch}: staged file {staged} is missing and {final} was never "
                    "published; the epoch's data is lost (was the staging directory deleted?)"
                )
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staged, final)
            dirs.add(final.parent)
            if i == 0:
                fault_point("mid_commit")
        if self.opts.fsync:
            for d in dirs:
                fsync_path(d)

    def _clean_epoch(self, epoch: int, keep: set[str]) -> None:
        """Delete what is staged for ``epoch`` except ``keep`` (pieces of open slots)."""
        prefix = f"{self.staging_rel}/{epoch}/"
        if self.s3 is not None:
            self.s3.delete([r for r, _ in self.s3.objects(prefix) if r not in keep])
            return
        target = self.staging / str(epoch)
        if not keep:
            shutil.rmtree(target, ignore_errors=True)
            return
        if not target.is_dir():
            return
        for p in sorted(target.rglob("*"), reverse=True):
            if p.is_file():
                if p.relative_to(self.root).as_posix() not in keep:
                    p.unlink(missing_ok=True)
            elif p.is_dir():
                try:
                    p.rmdir()  # only when empty
                except OSError:
                    pass

    def _write_manifest(self, epoch: int, files: list[dict[str, Any]]) -> None:
        """The epoch's manifest, once every file of it is published (atomic, fsync'd)."""
        rel = f"{self.commits_rel}/{epoch}.json"
        if self.s3 is None and (self.root / rel).exists():
            return
        self._write_json(rel, {"epoch": epoch, "files": files})

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        self.roller.abort(epoch, committable)
        keep = self.roller.referenced()
        try:
            if self.s3 is not None and not self.opts.rolling:
                if committable is not None and committable.get("mode") != "rolling":
                    for f in committable["files"]:
                        self.s3.abort_upload(f["final"], f["upload"]["id"])
                else:
                    mine = f"part-{epoch:010d}-s{self.key[:8]}-"
                    for rel, uid in self.s3.uploads():
                        if rel.rsplit("/", 1)[-1].startswith(mine):
                            self.s3.abort_upload(rel, uid)
            if self.s3 is None and not keep:
                target = self.staging / str(epoch)
                victims = sorted(p for p in target.rglob("*") if p.is_file())
                for i, p in enumerate(victims):
                    p.unlink(missing_ok=True)
                    if i == 0:
                        fault_point("mid_abort")
                shutil.rmtree(target, ignore_errors=True)
            else:
                self._clean_epoch(epoch, keep)
        except Exception:
            log.exception("file sink: abort of epoch %d could not delete its staged data", epoch)

    def staged_epochs(self) -> Iterable[int]:
        if self.s3 is not None:
            epochs = {
                int(r[len(self.staging_rel) + 1 :].split("/", 1)[0])
                for r, _ in self.s3.objects(f"{self.staging_rel}/")
                if r[len(self.staging_rel) + 1 :].split("/", 1)[0].isdigit()
            }
            if not self.opts.rolling:
                mine = re.compile(rf"^part-(\d{{10}})-s{self.key[:8]}-")
                for rel, _ in self.s3.uploads():
                    m = mine.match(rel.rsplit("/", 1)[-1])
                    if m:
                        epochs.add(int(m.group(1)))
            return sorted(epochs)
        if not self.staging.is_dir():
            return []
        return [int(p.name) for p in self.staging.iterdir() if p.name.isdigit()]

    # -- rolling ---------------------------------------------------------------------------
    def roll(self, everything: bool) -> int:
        """Publish the open files that are due (every one with ``everything``)."""
        return len(self.roller.roll(everything, max(self._last_epoch(), 0)))

    def next_roll_in(self) -> float | None:
        return self.roller.next_roll_in()


def _file_rows(path: Path, fmt: str) -> int | None:
    """Rows of a Parquet or ORC file Spark wrote, from its footer."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.read_metadata(path).num_rows)
    if fmt == "orc":
        import pyarrow.orc as orc

        return int(orc.ORCFile(str(path)).nrows)
    return None


def _empty_file(path: Path, fmt: str, size: int) -> bool:
    """Whether a file Spark wrote holds no rows (it writes one for an empty DataFrame)."""
    if size == 0:
        return True
    if fmt == "parquet" and size < 65536:
        import pyarrow.parquet as pq

        return bool(pq.read_metadata(path).num_rows == 0)
    return False


_MANIFEST_NAME = re.compile(r"\d+(\.roll-[0-9a-f]+-\d+)?\.json")


def committed_files(
    path: str | os.PathLike[str], sink_id: str | None = None, **s3_options: Any
) -> list[str]:
    """The files of every committed epoch under ``path``, by the epochs' manifests.

    A reader that lists the directory during a commit may see some files of the epoch being
    published and not yet the others; a reader that reads the files this returns sees whole
    epochs only (an epoch's manifest is written once all its files are published). With
    rolling options, a file appears once it is rolled (the manifest of the epoch, or of the
    roll between epochs, that published it); rows held in open files are not listed.

    Args:
        path: the sink's directory, or its ``s3://bucket/prefix``.
        sink_id: only this sink's epochs (default: every sink writing to ``path``).
        **s3_options: for an ``s3://`` path, the sink's ``s3_*`` options (endpoint,
            region, credentials); default: boto3's configuration.

    Returns:
        Absolute paths (``s3://`` URLs on S3), by epoch, then file name.
    """
    if str(path).startswith("s3://"):
        store = S3Store(FileSinkOptions(path=str(path), **s3_options))
        base = f"{MARKER_DIR}/{COMMITS_DIR}/"
        prefix = base + (f"{sink_key(sink_id)}/" if sink_id else "")
        found: list[tuple[int, str]] = []
        for rel, _ in store.objects(prefix):
            if _MANIFEST_NAME.fullmatch(rel.rsplit("/", 1)[-1]):
                data = json.loads(store.get(rel))
                found += [(int(data["epoch"]), store.url(f["path"])) for f in data["files"]]
        return [p for _, p in sorted(found)]
    root = Path(path).expanduser().resolve()
    base_dir = root / MARKER_DIR / COMMITS_DIR
    dirs = [base_dir / sink_key(sink_id)] if sink_id else sorted(base_dir.glob("*"))
    out: list[tuple[int, str]] = []
    for d in dirs:
        for m in d.glob("*.json"):
            if not _MANIFEST_NAME.fullmatch(m.name):
                continue
            data = json.loads(m.read_bytes())
            out += [(int(data["epoch"]), str(root / f["path"])) for f in data["files"]]
    return [p for _, p in sorted(out)]


def validate_schema(opts: FileSinkOptions, schema: pa.Schema) -> None:
    seen: dict[str, str] = {}
    for name in schema.names:
        # Case-insensitive, like Spark's own file writers: readers could not tell them apart.
        other = seen.get(name.lower())
        seen[name.lower()] = name
        if other is not None:
            raise SchemaMismatchError(
                f"the DataFrame has two columns named {other!r} and {name!r}; the file sink "
                "needs distinct column names (case-insensitive, as Spark's file writers): "
                "rename one with withColumnRenamed or an alias"
            )
    for c in opts.partition_by:
        if c not in schema.names:
            raise SchemaMismatchError(
                f"partition_by column {c!r} is not in the DataFrame (columns: "
                f"{', '.join(schema.names)})"
            )
        t = schema.field(c).type
        if pa.types.is_nested(t) or pa.types.is_floating(t):
            raise SchemaMismatchError(f"column {c!r} of type {t} cannot be a partition column")
    if len(opts.partition_by) >= len(schema.names):
        raise SchemaMismatchError("every column is a partition column: no data column is left")
    if opts.format == "text":
        data = [f for f in schema if f.name not in opts.partition_by]
        if len(data) != 1 or not (
            pa.types.is_string(data[0].type) or pa.types.is_large_string(data[0].type)
        ):
            shown = ", ".join(f"{f.name} {f.type}" for f in data)
            raise SchemaMismatchError(
                "format='text' writes one string column per line (besides partition columns); "
                f"this DataFrame has: {shown}. Select one, e.g. df.selectExpr('to_json(struct(*)) "
                "AS value'), or use format='json'"
            )
    if opts.format == "csv":
        for field in schema:
            if pa.types.is_nested(field.type):
                raise SchemaMismatchError(
                    f"column {field.name!r} of type {field.type} cannot be written as CSV; "
                    "use format='parquet' or 'json', or flatten it"
                )


def make_writer(opts: FileSinkOptions, ctx: WriterContext) -> FileWriter:
    return FileWriter(opts, ctx)


def make_coordinator(opts: FileSinkOptions, sink_id: str) -> FileCoordinator:
    return FileCoordinator(opts, sink_id)


SINK: SinkPlugin[FileSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="file",
    options_model=FileSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    committable_codec=JsonCodec[dict[str, Any]](version=1),
    default_sink_id=lambda o: f"file:{o.path}",
    validate_schema=validate_schema,
    description="Parquet / ORC / JSON lines / CSV / text files, local or on S3, Hive "
    "partitions, files per epoch or rolling across epochs",
    # pyarrow only, a core dependency; s3:// paths need boto3 (eosink[s3]), checked when used
    requires={},
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    return [SINK]
