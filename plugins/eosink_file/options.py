"""The ``file`` sink's options: formats, codecs, paths, rolling, and the column checks."""

from __future__ import annotations

import logging
import os
import posixpath
import re
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from eosink import (
    SchemaMismatchError,
)
from eosink._s3 import check_endpoint_url

log = logging.getLogger("eosink.file")


FORMATS = ("parquet", "orc", "json", "csv", "text")
EXT = {"parquet": "parquet", "orc": "orc", "json": "jsonl", "csv": "csv", "text": "txt"}


# Parquet codecs pyarrow writes (LZO is read-only in Arrow C++); Spark's "uncompressed" = none.
_PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd")
_CODEC_ALIASES = {"uncompressed": "none", "bz2": "bzip2"}
# Codecs both writer kinds write, per format (Spark's name; pyarrow's where it differs).
_ORC_CODECS = ("none", "snappy", "zlib", "zstd", "lz4")
_TEXT_CODECS = ("none", "gzip", "bzip2")
_DEFAULT_CODEC = {"parquet": "snappy", "orc": "snappy"}
PYARROW_STREAM_CODEC = {"gzip": "gzip", "bzip2": "bz2"}
TEXT_SUFFIX = {"gzip": ".gz", "bzip2": ".bz2"}


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


URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
# Schemes Hadoop may read but the file sink cannot publish files to.
_NOT_FILESYSTEMS = ("http", "https", "ftp", "sftp", "jdbc", "kafka")


def file_uri_path(uri: str) -> str:
    """The absolute local path of a ``file:`` URI (``file:///x``, Hadoop's ``file:/x``,
    ``file://localhost/x``), normalised (``..``, doubled and trailing ``/``) but with its
    symbolic links kept, as Hadoop takes it.

    Raises:
        ValueError: a URI naming another host, or a relative path.
    """
    rest = uri[5:]
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
        if host not in ("", "localhost"):
            raise ValueError(
                f"{uri!r} names the host {host!r}; a file: URI is a path on every node's own "
                "disk (file:///path)"
            )
        rest = "/" + path
    if not rest.startswith("/"):
        raise ValueError(f"{uri!r} is not an absolute path (file:///path)")
    return posixpath.normpath(rest).replace("//", "/")


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
        return _probe(path, "is a directory the file sink cannot write")
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
    return _probe(parent, "cannot be created")


def _probe(directory: Path, what: str) -> str | None:
    """Create and remove a hidden directory in ``directory``: ``os.access`` says yes to
    root everywhere, and to anyone on filesystems that refuse writes anyway (``/proc``,
    ``/sys``). The OS error when it fails, else None."""
    probe = directory / f".eosink-probe-{uuid.uuid4().hex[:12]}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"{what}: creating a directory in {directory} fails: {exc.strerror or exc}"
    try:
        probe.rmdir()
    except OSError:
        pass
    return None


class FileSinkOptions(BaseModel):
    """Options of the ``file`` sink.

    Validated on the driver before any Spark job or meta store row: a local path must be a
    directory this user can create or write, partition columns distinct, the codec one that
    the format can be written with.

    Attributes:
        path: output directory: a local directory (created if missing), a Hadoop filesystem
            URI (``file://``, ``hdfs://``, ``abfs://``, ``gs://``, ``s3a://``...: written by
            Spark's writers, published through Spark's Hadoop FileSystem,
            :mod:`eosink_file._hadoop`) or ``s3://bucket/prefix`` (boto3, extra
            ``eosink[s3]``; written by the Python writers). A local path and ``file://``
            of it name the same sink.
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
    def _path(cls, v: str) -> str:
        if v.startswith("s3://"):
            bucket, _, _ = v.removeprefix("s3://").partition("/")
            if not bucket:
                raise ValueError(f"{v!r} names no bucket; use s3://bucket/prefix")
            return "s3://" + v.removeprefix("s3://").rstrip("/")
        if v[:5].lower() == "file:":
            local = file_uri_path(v)
            problem = _not_writable(Path(local).resolve())
            if problem:
                raise ValueError(f"{v!r} ({Path(local).resolve()}) {problem}")
            return f"file://{local}"
        m = URI_SCHEME.match(v)
        if m:
            scheme = m.group(1).lower()
            if scheme in _NOT_FILESYSTEMS:
                raise ValueError(
                    f"{scheme}:// is not a filesystem the file sink can write; use a local "
                    "path, s3://bucket/prefix, or a Hadoop filesystem URI (hdfs://, abfs://, "
                    "gs://, s3a://...)"
                )
            rest = v[m.end() :]
            if not rest.split("/", 1)[0] and scheme not in ("hdfs", "viewfs"):
                raise ValueError(f"{v!r} names no bucket, container or host")
            return f"{scheme}://{rest}".rstrip("/") if rest.strip("/") else f"{scheme}://{rest}"
        resolved = Path(v).expanduser().resolve()
        problem = _not_writable(resolved)
        if problem:
            shown = repr(v) if str(resolved) == v else f"{v!r} ({resolved})"
            raise ValueError(f"{shown} {problem}")
        return str(resolved)

    @field_validator("s3_endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return check_endpoint_url(v)

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
        scheme = self.hadoop_scheme
        if scheme is not None and scheme != "file":
            where = f"{scheme}:// paths are written by Spark's own writers only"
            if self.writer == "python":
                raise ValueError(
                    f"writer='python' cannot write {self.path!r}: {where} (the Python writers "
                    "write local paths and s3://); use writer='auto'"
                )
            if self.rolling:
                raise ValueError(
                    "rolling options (max_file_bytes, max_row_count, rollover_seconds, "
                    f"inactivity_seconds) are not supported on {scheme}:// paths yet: every "
                    "epoch publishes its own files there; drop them, or write to a local path "
                    "or s3://"
                )
        return self

    @property
    def is_s3(self) -> bool:
        """Whether the path is an S3 prefix (written through boto3)."""
        return self.path.startswith("s3://")

    @property
    def hadoop_scheme(self) -> str | None:
        """The scheme of a Hadoop filesystem URI (``file``, ``hdfs``, ``s3a``...), else None
        (a local path, or ``s3://``)."""
        m = None if self.is_s3 else URI_SCHEME.match(self.path)
        return m.group(1) if m else None

    @property
    def local_path(self) -> Path | None:
        """The directory as this machine's filesystem names it: a local path, or the path
        of a ``file://`` URI (symbolic links kept, as Hadoop and the executors take it);
        None on S3 and other Hadoop filesystems."""
        if self.is_s3:
            return None
        if self.path.startswith("file://"):
            return Path(self.path.removeprefix("file://"))
        return None if self.hadoop_scheme else Path(self.path)

    @property
    def sink_path(self) -> str:
        """What names the sink's directory (its default sink_id is ``file:<sink_path>``): a
        local path and ``file://`` the same path name the same resolved local directory;
        other URIs as given (normalised)."""
        if self.path.startswith("file://"):
            return str(Path(self.path.removeprefix("file://")).resolve())
        return self.path

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


def validate_columns(opts: FileSinkOptions, schema: pa.Schema) -> None:
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
