"""The ``file`` sink: Parquet, ORC, JSON lines, CSV or text files, local, on S3 or on a
Hadoop filesystem.

Layout under ``path`` (a local directory, an ``s3://bucket/prefix`` with the same keys, or a
Hadoop filesystem URI)::

    _eosink_staging/<sink key>/<epoch>/<attempt>/<partition dirs>/<file>           (staged)
    _eosink_staging/<sink key>/slots/<slot>-<start epoch>.<ext>   (an open file, local rows)
    <col=value>/.../part-<epoch>-<n>-<token>.<ext>                (published, every epoch)
    <col=value>/.../part-<start epoch>-s<sink key 8>.<ext>        (published, rolled)
    _eosink/<sink key>.json                                    (the sink's marker)
    _eosink/layout.json                         (format and partition_by, every sink's)
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
uploads completed at commit (:mod:`eosink_file._s3`); on other Hadoop filesystems
(``hdfs://``...) the driver works through Spark's own FileSystem (:mod:`eosink_file._hadoop`).
Before an epoch is persisted, its staged files must hold the rows Spark wrote
(:meth:`FileCoordinator.check_spark_write`): a path that is not the same directory on every
node loses the remote tasks' files without an error from Spark.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import stat
import sys
import time
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
    JournalHome,
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
from eosink.util import sink_key

from ._hadoop import HadoopStore, java_message, spark_session
from ._rolling import Roller, fsync_path, manifest, piece_ext
from ._s3 import S3Store, local_tmp_dir

log = logging.getLogger("eosink.file")

STAGING_DIR = "_eosink_staging"
MARKER_DIR = "_eosink"
COMMITS_DIR = "commits"
LAYOUT_REL = f"{MARKER_DIR}/layout.json"
"""The target's layout record (:func:`layout_of`), shared by every sink writing the path."""
LAYOUT_KEYS = ("format", "partition_by")
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


_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
# Schemes Hadoop may read but the file sink cannot publish files to.
_NOT_FILESYSTEMS = ("http", "https", "ftp", "sftp", "jdbc", "kafka")


def _file_uri_path(uri: str) -> str:
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
            local = _file_uri_path(v)
            problem = _not_writable(Path(local).resolve())
            if problem:
                raise ValueError(f"{v!r} ({Path(local).resolve()}) {problem}")
            return f"file://{local}"
        m = _URI.match(v)
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
        m = None if self.is_s3 else _URI.match(self.path)
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


def layout_of(opts: FileSinkOptions) -> dict[str, Any]:
    """The options that shape what readers of the target see, as the target records them.

    ``format`` (one reader reads one format) and ``partition_by`` (Spark, pyarrow and Hive
    discover partitions from the directory names: a directory with ``g=...`` directories
    and files at its root shows only one of the two). Not recorded: ``compression`` (each
    file names its codec, in its footer or its suffix; readers mix them), the rolling
    options (file sizes and visibility, not content), ``writer``, ``fsync`` and
    ``format_options`` (the writers' options).
    """
    return {"format": opts.format, "partition_by": list(opts.partition_by)}


def _parse_layout(raw: bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise SinkError(
            f"the file sink's layout record {where} is corrupt ({exc}); it records the "
            "format and partition_by the files under that directory were written with. "
            'Restore it, or write it again: {"format": "parquet", "partition_by": [...]}'
        ) from None
    return data


def check_layout(opts: FileSinkOptions, recorded: Mapping[str, Any] | None, where: str) -> None:
    """Refuse options whose :func:`layout_of` differs from the target's record.

    Raises:
        ConfigError: naming the recorded and the new values, and how to move to a new
            layout.
    """
    if recorded is None:
        return
    want = layout_of(opts)
    have = {k: recorded.get(k) for k in LAYOUT_KEYS}
    changed = [k for k in LAYOUT_KEYS if have[k] != want[k]]
    if not changed:
        return
    shown_have = ", ".join(f"{k}={have[k]!r}" for k in changed)
    shown_want = ", ".join(f"{k}={want[k]!r}" for k in changed)
    read = f"spark.read.format({have['format']!r}).load({opts.path!r})"
    raise ConfigError(
        f"the file sink's target {opts.path} holds files written with {shown_have} (its "
        f"layout record {where}); this run asks for {shown_want}. Readers take one layout "
        "per directory (one format; partition directories found from the names), so files "
        "in two layouts would hide rows from them. Keep "
        f"{shown_have} for this path; or write the new layout to a new path (copy what is "
        f"here with eosink.run({read}, sink='file', path=<new path>, {shown_want}, epoch=0), "
        "then keep writing there); or, to start over, delete the whole directory "
        f"{opts.path} (its _eosink directory included). Nothing was written"
    )


def _connect_client() -> bool:
    """Whether this process is a Spark Connect client (an active Connect session, no JVM)."""
    connect = sys.modules.get("pyspark.sql.connect.session")
    if connect is None or spark_session() is not None:
        return False
    try:
        return connect.SparkSession.getActiveSession() is not None
    except Exception:
        return False


def read_layout(opts: FileSinkOptions) -> tuple[dict[str, Any] | None, str] | None:
    """The target's layout record read before anything is written (no side effects), and
    where it is; None where it cannot be read yet (other Hadoop filesystems, or a driver
    without Spark: the coordinator's ``init`` checks it there).

    On ``s3://`` this is also the start-up probe of the endpoint, credentials and bucket
    (:meth:`S3Store.check_bucket`, bounded in time).
    """
    if opts.is_s3:
        store = S3Store(opts)
        try:
            raw = store.check_bucket(read=LAYOUT_REL)
        except (ConfigError, SinkError) as exc:
            if not _connect_client():
                raise
            # A Spark Connect client: a stream's coordinator runs on the server, whose
            # credentials and network may differ; its init probes the same way there.
            log.info("file sink: %s cannot be checked from this client (%s)", opts.path, exc)
            return None
        where = store.url(LAYOUT_REL)
        return (None if raw is None else _parse_layout(raw, where)), where
    local = opts.local_path
    if local is None:
        return None
    f = local / LAYOUT_REL
    try:
        raw = f.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None, str(f)
    except OSError as exc:
        raise ConfigError(f"the file sink cannot read {f}: {exc.strerror or exc}") from None
    return _parse_layout(raw, str(f)), str(f)


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
    JournalHome,
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
        local = opts.local_path
        self.root = local if local is not None else Path("/nonexistent")
        # A Hadoop filesystem URI goes through Spark's own FileSystem on the driver. A
        # file:// URI too, where Spark's writers may stage its epochs (per-epoch files under
        # eosink.run); else (rolling, Python writers, no JVM here) it is the local directory
        # it names, with the same layout.
        self.hadoop: HadoopStore | None = None
        scheme = opts.hadoop_scheme
        if scheme is not None and (
            scheme != "file" or (not opts.rolling and opts.writer != "python")
        ):
            spark = spark_session()
            if spark is not None:
                self.hadoop = HadoopStore(spark, opts.path)
            elif scheme != "file":
                raise ConfigError(
                    f"the file sink writes {scheme}:// paths through Spark's own writers and "
                    "Hadoop FileSystem, which need eosink.run() on a classic Spark driver "
                    '(not format("eosink"), whose writers are Python writers, nor Spark '
                    "Connect); write to a local path or s3:// there"
                )
        self.staging_rel = f"{STAGING_DIR}/{self.key}"
        self.staging = self.root / self.staging_rel
        self.marker_rel = f"{MARKER_DIR}/{self.key}.json"
        self.marker_path = self.root / self.marker_rel
        self.commits_rel = f"{MARKER_DIR}/{COMMITS_DIR}/{self.key}"
        self.commits = self.root / self.commits_rel
        self._marker: dict[str, Any] | None = None
        # The target's layout record (None until recorded: at the first commit).
        self._layout: dict[str, Any] | None = None
        # Also without rolling options: files left open by an earlier run that had them are
        # published at this run's end, never forgotten.
        self.roller = Roller(
            opts,
            self.key,
            local,
            self.s3,
            self._write_json,
            self._read_json,
        )

    # -- storage ---------------------------------------------------------------------------
    def _read_json(self, rel: str) -> dict[str, Any] | None:
        if self.hadoop is not None:
            got = self.hadoop.read(rel)
            return None if got is None else dict(json.loads(got))
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
        elif self.hadoop is not None:
            self.hadoop.write_atomic(
                rel, json.dumps(data, sort_keys=True).encode(), self.opts.fsync
            )
            if self.opts.fsync and self.hadoop.scheme == "file":
                fsync_path((self.root / rel).parent)
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
        if why and self.opts.local_path is None:
            raise ConfigError(
                f"the file sink cannot write {self.opts.path!r}: {why}, and the Python writers "
                f"do not write {self.opts.hadoop_scheme}:// paths"
            )
        return why

    def write_with_spark(
        self, df: Any, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Spark's ``DataFrameWriter`` writes the epoch into its own staging directory.

        Spark's commit protocol moves only the files of committed tasks into it (failed and
        speculative attempts stay in its ``_temporary``, deleted with the epoch's staging).
        A local path is given to Spark as a ``file://`` URI: it is a directory on the nodes'
        own disks, whatever Spark's default filesystem is. Parquet and ORC files get their
        row counts from their footers (:meth:`check_spark_write` adds them up).
        """
        stage_rel = f"{self.staging_rel}/{epoch}/{attempt}"
        fmt = self.opts.format
        w = df.write.format(fmt).mode("error")
        w = w.option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        w = w.option("compression", self.opts.codec)
        if fmt == "csv":  # what the Python writers write: a header, RFC 4180 quoting
            w = w.option("header", "true").option("escape", '"')
        for k, v in self.opts.format_options.items():
            w = w.option(k, v)
        if self.opts.partition_by:
            w = w.partitionBy(*self.opts.partition_by)
        hadoop = self.hadoop
        w.save(hadoop.url(stage_rel) if hadoop else f"file://{self.root / stage_rel}")
        data_cols = [f for f in df.schema.fields if f.name not in self.opts.partition_by]
        sid = schema_id("spark", [(f.name, f.dataType.simpleString()) for f in data_cols])
        # The files of Spark's job as the driver sees them (never _temporary: the leftovers
        # of failed attempts; never Spark's "." files: Hadoop's checksums).
        if hadoop is not None:
            listed = hadoop.files(stage_rel)
        else:
            stage = self.root / stage_rel
            listed = [
                (p.relative_to(self.root).as_posix(), p.stat().st_size)
                for p in stage.rglob("*")
                if p.is_file()
            ]
        local = hadoop is None or hadoop.scheme == "file"
        files: list[dict[str, Any]] = []
        for rel, size in sorted(listed):
            parts = rel[len(stage_rel) + 1 :].split("/")
            if parts[-1].startswith(".") or any(x.startswith("_") for x in parts):
                continue
            rows: int | None = None
            if fmt in ("parquet", "orc") and size > 0:
                rows = self._footer_rows(rel, local)
            if size == 0 or rows == 0:  # Spark writes one empty file for an empty DataFrame
                if local:
                    (self.root / rel).unlink()
                else:
                    assert hadoop is not None
                    hadoop.delete(rel)
                continue
            files.append(
                {
                    "staged": rel,
                    "partition": "/".join(parts[:-1]),
                    "rows": rows,
                    "bytes": size,
                    "schema": sid,
                }
            )
        if self.opts.fsync and local:  # Spark's writers do not fsync: here, in parallel
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(fsync_path, [self.root / f["staged"] for f in files]))
            for d in {(self.root / f["staged"]).parent for f in files}:
                fsync_path(d)
        return [{"files": files, "stage": stage_rel}]

    def _footer_rows(self, rel: str, local: bool) -> int:
        """The rows of a staged Parquet or ORC file, from its footer."""
        if local:
            if self.opts.format == "parquet":
                import pyarrow.parquet as pq

                return int(pq.read_metadata(self.root / rel).num_rows)
            import pyarrow.orc as orc

            return int(orc.ORCFile(str(self.root / rel)).nrows)
        assert self.hadoop is not None
        if self.opts.format == "parquet":
            return self.hadoop.parquet_rows(rel)
        return self.hadoop.orc_rows(rel)

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        """Refuse an epoch whose staged files do not hold the rows Spark's write counted.

        Parquet and ORC: the rows of their footers. JSON lines, CSV and text staged on the
        driver's own filesystem (a local path, ``file://``): their records, counted in the
        files (decompressed when compressed). On other Hadoop filesystems, which every node
        and the driver see alike, JSON, CSV and text files are not read back (that would
        copy the whole epoch to the driver): only Parquet and ORC are counted there.

        Raises:
            SinkError: the files hold fewer rows than Spark wrote (or, where the count is
                exact, more), before anything of the epoch is persisted.
        """
        t0 = time.perf_counter()
        files = [f for r in results for f in r["files"]]
        stage = next((r["stage"] for r in results if r.get("stage")), None)
        fmt = self.opts.format
        counted = 0
        exact = True
        if fmt in ("parquet", "orc"):
            counted = sum(int(f["rows"]) for f in files)
        elif self.opts.local_path is None:
            log.debug("file sink epoch %d: %s files on %s are not counted", epoch, fmt, stage)
            return
        else:
            for n, is_exact in _count_records(
                [self.root / f["staged"] for f in files], fmt, self.opts.format_options
            ):
                if n is None:  # a codec eosink cannot read (format_options' compression)
                    return
                counted += n
                exact = exact and is_exact
        where = f"{self.opts.path.rstrip('/')}/{stage}" if stage else self.opts.path
        log.debug(
            "file sink epoch %d: %d file(s) hold %d row(s) (Spark counted %d): %.1f ms",
            epoch,
            len(files),
            counted,
            rows,
            (time.perf_counter() - t0) * 1000,
        )
        if counted == rows or (not exact and counted > rows):
            if counted != rows:
                log.info(
                    "file sink epoch %d: %d %s records for %d rows (values that contain "
                    "line breaks); the rows of such files cannot be counted exactly",
                    epoch,
                    counted,
                    fmt,
                    rows,
                )
            return
        if counted < rows:
            raise SinkError(
                f"epoch {epoch}: Spark's write counted {rows} rows, but the {len(files)} "
                f"file(s) the driver finds in the staging directory {where} hold {counted}: "
                f"{rows - counted} rows were written where the driver does not see them. "
                f"The likely cause: the path {self.opts.path} is not the same directory on "
                "every node (a local path or file:// URI on each machine's own disk, not a "
                "mount every node shares), so the files of the tasks that ran on other "
                "machines stayed on those machines. Write to a location every node and the "
                "driver share (hdfs://, s3://, abfs://, gs://, a shared mount). (Over "
                "Spark Connect, \"the driver\" here is the client's Python, where eosink's "
                "coordinator runs: the path must be the same directory there too.) Nothing "
                "of this epoch was published or persisted."
            )
        raise SinkError(
            f"epoch {epoch}: Spark's write counted {rows} rows, but the {len(files)} file(s) "
            f"in the staging directory {where} hold {counted}: files that are not this "
            "write's are there (another writer uses this staging directory?). Nothing of "
            "this epoch was published or persisted."
        )

    def init(self) -> None:
        if self.s3 is not None:
            self.s3.check_bucket()
        elif self.hadoop is not None:
            try:
                self.hadoop.mkdirs(MARKER_DIR)
            except Exception as exc:
                raise SinkError(
                    f"the file sink cannot create {self.hadoop.url(MARKER_DIR)}: "
                    f"{java_message(exc)}"
                ) from None
        else:
            self.root.mkdir(parents=True, exist_ok=True)
        self._init_layout()
        self.roller.load()
        if self.roller.committed["slots"] and not self.opts.rolling:
            log.warning(
                "file sink: %d file(s) left open by an earlier run with rolling options; "
                "they are published at the end of this run",
                len(self.roller.committed["slots"]),
            )

    def _layout_where(self) -> str:
        if self.s3 is not None:
            return self.s3.url(LAYOUT_REL)
        if self.hadoop is not None:
            return self.hadoop.url(LAYOUT_REL)
        return str(self.root / LAYOUT_REL)

    def _init_layout(self) -> None:
        """Check this run's layout against the target's record (:func:`check_layout`).

        Without a record, a target that already holds committed epochs (written before
        eosink recorded layouts) adopts this run's layout now, once; an empty one records
        it with its first commit, so that a run that fails before committing anything does
        not fix a layout.
        """
        where = self._layout_where()
        try:
            raw = self._read_json(LAYOUT_REL)
        except ValueError as exc:
            raise SinkError(f"the file sink's layout record {where} is corrupt ({exc})") from None
        if raw is not None:
            check_layout(self.opts, raw, where)
            self._layout = {k: raw.get(k) for k in LAYOUT_KEYS}
            return
        self._layout = None
        if self._holds_commits():
            log.info(
                "file sink: the target %s has no layout record (written before eosink "
                "recorded one); adopting this run's format=%r, partition_by=%r in %s",
                self.opts.path,
                self.opts.format,
                list(self.opts.partition_by),
                where,
            )
            self._record_layout()

    def _holds_commits(self) -> bool:
        """Whether any sink committed an epoch to this target (a manifest exists)."""
        base = f"{MARKER_DIR}/{COMMITS_DIR}"
        if self.s3 is not None:
            return next(iter(self.s3.objects(base + "/")), None) is not None
        if self.hadoop is not None:
            return any(self.hadoop.names(f"{base}/{key}") for key in self.hadoop.names(base))
        return any(p.is_file() for p in (self.root / base).rglob("*.json"))

    def _record_layout(self, layout: Mapping[str, Any] | None = None) -> None:
        """Write the layout record (``layout``, default: this run's), unless the target has
        one already (then that one holds: :meth:`pre_commit` checks this run against it)."""
        have = self._read_json(LAYOUT_REL)
        if have is None:
            have = {k: (layout or layout_of(self.opts))[k] for k in LAYOUT_KEYS}
            self._write_json(LAYOUT_REL, {**have, "version": 1})
        self._layout = {k: have.get(k) for k in LAYOUT_KEYS}

    def target_id(self) -> str:
        return f"file:{self.opts.sink_path}"

    def journal_location(self) -> str | None:
        """The core's batch journal: ``_eosink/journal`` beside the files (local paths)."""
        local = self.opts.local_path
        return None if local is None else str(local / MARKER_DIR / "journal")

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
        # A layout recorded since init (an older run's epoch recovered at this start).
        check_layout(self.opts, self._layout, self._layout_where())
        staged = [f for r in results for f in r["files"]]
        if self.s3 is None and self.opts.local_path is not None:
            self._check_staged(epoch, staged)
        if self.opts.rolling:
            c = {**self.roller.prepare(epoch, staged), "layout": layout_of(self.opts)}
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
                {"files": files, "layout": layout_of(self.opts)},
                files=len(files),
                bytes=sum(int(f["bytes"]) for f in files),
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
            {"files": files, "token": token, "layout": layout_of(self.opts)},
            files=len(files),
            bytes=sum(int(f["bytes"]) for f in files),
        )

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        if self._layout is None:  # the target's first commit records its layout: the
            self._record_layout(committable.get("layout"))  # one its files were staged in
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
        elif self.hadoop is not None:
            self._publish_hadoop(epoch, committable)
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

    def _check_staged(self, epoch: int, staged: Sequence[dict[str, Any]]) -> None:
        """Every file a task staged is on the driver, with the size the task wrote."""
        for f in staged:
            p = self.root / f["staged"]
            try:
                size: int | None = p.stat().st_size
            except FileNotFoundError:
                size = None
            if size == f["bytes"]:
                continue
            found = "is not there" if size is None else f"has {size} bytes"
            rows = f" ({f['rows']} rows)" if f.get("rows") is not None else ""
            raise SinkError(
                f"epoch {epoch}: a Spark task staged {p} with {f['bytes']} bytes{rows}, and "
                f"on the driver it {found}. The likely cause: the path {self.opts.path} is "
                "not the same directory on every node (a local path or file:// URI on each "
                "machine's own disk, not a mount every node shares), so the files of the "
                "tasks that ran on other machines stayed there. Write to a location every "
                "node and the driver share (a shared mount, s3://, or hdfs://, abfs://, "
                "gs:// through eosink.run). Nothing of this epoch was published or persisted."
            )

    def _publish_hadoop(self, epoch: int, committable: dict[str, Any]) -> None:
        """Publish by renames through the Hadoop FileSystem (see :mod:`eosink_file._hadoop`)."""
        fs = self.hadoop
        assert fs is not None
        made: set[str] = set()
        for i, f in enumerate(committable["files"]):
            final, staged = f["final"], f["staged"]
            have = fs.size(final)
            if have is None:
                parent = final.rpartition("/")[0]
                if parent not in made:
                    fs.mkdirs(parent)
                    made.add(parent)
                if not fs.rename(staged, final):
                    have = fs.size(final)
                    if have is None and fs.size(staged) is None:
                        raise SinkError(
                            f"epoch {epoch}: staged file {fs.url(staged)} is missing and "
                            f"{fs.url(final)} was never published; the epoch's data is lost "
                            "(was the staging directory deleted?)"
                        )
                    if have is None:
                        raise SinkError(
                            f"epoch {epoch}: cannot rename {fs.url(staged)} to {fs.url(final)}"
                        )
            if have is not None and have != f["bytes"]:
                raise SinkError(
                    f"epoch {epoch}: {fs.url(final)} exists with an unexpected size; "
                    "another writer uses this path"
                )
            if have is None and i == 0:
                fault_point("mid_commit")
        if self.opts.fsync and fs.scheme == "file":
            for d in made:
                fsync_path(self.root / d)

    def _clean_epoch(self, epoch: int, keep: set[str]) -> None:
        """Delete what is staged for ``epoch`` except ``keep`` (pieces of open slots)."""
        prefix = f"{self.staging_rel}/{epoch}/"
        if self.s3 is not None:
            self.s3.delete([r for r, _ in self.s3.objects(prefix) if r not in keep])
            return
        if self.hadoop is not None and not keep:
            self.hadoop.delete(prefix.rstrip("/"), recursive=True)
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
        if self.hadoop is not None:
            if self.hadoop.exists(rel):
                return
        elif self.s3 is None and (self.root / rel).exists():
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
            if self.hadoop is not None and not keep:
                rel = f"{self.staging_rel}/{epoch}"
                first = next(iter(self.hadoop.files(rel)), None)
                if first is not None:
                    self.hadoop.delete(first[0])
                    fault_point("mid_abort")
                self.hadoop.delete(rel, recursive=True)
            elif self.s3 is None and not keep:
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
        if self.hadoop is not None:
            return [int(n) for n in self.hadoop.names(self.staging_rel) if n.isdigit()]
        if not self.staging.is_dir():
            return []
        return [int(p.name) for p in self.staging.iterdir() if p.name.isdigit()]

    # -- rolling ---------------------------------------------------------------------------
    def roll(self, everything: bool) -> int:
        """Publish the open files that are due (every one with ``everything``)."""
        return len(self.roller.roll(everything, max(self._last_epoch(), 0)))

    def next_roll_in(self) -> float | None:
        return self.roller.next_roll_in()

    def drop_lost_open_files(self) -> list[dict[str, Any]]:
        """``eosink recover --drop-lost-open-files``: drop the open rolling files whose
        committed rows can no longer be published (:meth:`Roller.drop_lost`)."""
        return self.roller.drop_lost()


_CHUNK = 8 * 1024 * 1024


def _option(options: Mapping[str, str], name: str, default: str) -> str:
    """A Spark writer option (case-insensitive names, as Spark takes them)."""
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    return default


def _chunks(path: Path) -> Iterable[bytes] | None:
    """The uncompressed bytes of a staged JSON, CSV or text file, by chunks; None for a
    codec this cannot read (a ``compression`` given in ``format_options``)."""
    name = path.name
    if name.endswith((".deflate", ".lz4", ".snappy", ".zst", ".zstd", ".br", ".xz", ".lzo")):
        return None

    def raw() -> Iterable[bytes]:
        with open(path, "rb") as fh:
            while True:
                b = fh.read(_CHUNK)
                if not b:
                    return
                yield b

    if not name.endswith((".gz", ".bz2")):
        return raw()

    def decompressed() -> Iterable[bytes]:
        import bz2
        import zlib

        def new() -> Any:
            return bz2.BZ2Decompressor() if name.endswith(".bz2") else zlib.decompressobj(31)

        d = new()
        for b in raw():
            while b:
                yield d.decompress(b)
                b = d.unused_data if d.eof else b""
                if b:  # a file of several gzip members / bzip2 streams
                    d = new()

    return decompressed()


def _records(path: Path, fmt: str, options: Mapping[str, str]) -> tuple[int | None, bool]:
    """The records of a staged JSON lines, CSV or text file Spark wrote, and whether the
    count is exact (else it is an upper bound: values may contain line breaks).

    JSON lines: one line per row, line breaks inside values escaped: exact. CSV with
    eosink's quoting (quote and escape ``"``): the line breaks outside quoted values, less
    the header: exact. Text, and CSV quoted otherwise: the line breaks.
    """
    chunks = _chunks(path)
    if chunks is None:
        return None, False
    sep = _option(options, "lineSep", "\n").encode()
    if fmt == "json":
        return sum(b.count(sep) for b in chunks), all(c < 0x20 for c in sep)
    if fmt == "text":
        return sum(b.count(sep) for b in chunks), False
    header = 1 if _option(options, "header", "true").lower() == "true" else 0
    quote = _option(options, "quote", '"').encode()
    exact = (
        len(quote) == 1
        and len(sep) == 1
        and _option(options, "escape", '"').encode() == quote
        and _option(options, "escapeQuotes", "true").lower() == "true"
    )
    if not exact:
        lines = sum(b.count(sep) for b in chunks)
        return max(lines - header, 0), False
    n = _outside_quotes(chunks, sep, quote)
    return max(n - header, 0), True


def _outside_quotes(chunks: Iterable[bytes], sep: bytes, quote: bytes) -> int:
    """How many ``sep`` bytes lie outside quoted values (RFC 4180 quoting: a quoted value's
    own quotes are doubled, so quotes come in pairs)."""
    q = re.escape(quote)
    quoted = re.compile(q + b"[^" + q + b"]*" + q)
    n = 0
    carry = b""
    for b in chunks:
        if carry:
            b, carry = carry + b, b""
        if quote not in b:
            n += b.count(sep)
            continue
        if b.count(quote) % 2:  # the chunk ends inside a quoted value: finish it next time
            cut = b.rindex(quote)
            b, carry = b[:cut], b[cut:]
        n += quoted.sub(b"", b).count(sep)
    return n


def _count_records(
    paths: Sequence[Path], fmt: str, options: Mapping[str, str]
) -> list[tuple[int | None, bool]]:
    """:func:`_records` of each file (in threads: reading and decompressing release the GIL)."""
    if len(paths) <= 1:
        return [_records(p, fmt, options) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(4, len(paths))) as pool:
        return list(pool.map(lambda p: _records(p, fmt, options), paths))


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
        path: the sink's directory, its ``s3://bucket/prefix``, or its Hadoop filesystem
            URI (``hdfs://...``: read through the active Spark session's FileSystem).
        sink_id: only this sink's epochs (default: every sink writing to ``path``).
        **s3_options: for an ``s3://`` path, the sink's ``s3_*`` options (endpoint,
            region, credentials); default: boto3's configuration.

    Returns:
        Absolute paths (``s3://`` URLs on S3, URIs on other Hadoop filesystems; a
        ``file://`` sink's are local paths), by epoch, then file name.
    """
    text = str(path)
    if text[:5].lower() == "file:":
        path = _file_uri_path(text)
    elif _URI.match(text) and not text.startswith("s3://"):
        spark = spark_session()
        if spark is None:
            raise ConfigError(
                f"committed_files({text!r}) reads a Hadoop filesystem through Spark: "
                "call it on a driver with an active (classic) SparkSession"
            )
        fs = HadoopStore(spark, FileSinkOptions.model_validate({"path": text}).path)
        hits: list[tuple[int, str]] = []
        base_rel = f"{MARKER_DIR}/{COMMITS_DIR}"
        keys = [sink_key(sink_id)] if sink_id else fs.names(base_rel)
        for key in keys:
            for name in fs.names(f"{base_rel}/{key}"):
                if _MANIFEST_NAME.fullmatch(name):
                    data = json.loads(fs.read(f"{base_rel}/{key}/{name}") or b"{}")
                    hits += [(int(data["epoch"]), fs.url(f["path"])) for f in data["files"]]
        return [p for _, p in sorted(hits)]
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
    """Check the DataFrame's columns against the options, then the target: an ``s3://``
    bucket reachable with the credentials, and the layout the target records
    (:func:`check_layout`). Runs on the driver before the meta store is opened."""
    _validate_columns(opts, schema)
    got = read_layout(opts)
    if got is not None:
        check_layout(opts, got[0], got[1])


def _validate_columns(opts: FileSinkOptions, schema: pa.Schema) -> None:
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
    default_sink_id=lambda o: f"file:{o.sink_path}",
    validate_schema=validate_schema,
    description="Parquet / ORC / JSON lines / CSV / text files, local or on S3, Hive "
    "partitions, files per epoch or rolling across epochs",
    # pyarrow only, a core dependency; s3:// paths need boto3 (eosink[s3]), checked when used
    requires={},
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    return [SINK]
