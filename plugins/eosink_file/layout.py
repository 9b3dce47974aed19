"""The target's layout: partition directories, schema ids, and the layout record
(``_eosink/layout.json``) that every sink writing a path must agree with."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from eosink import (
    ConfigError,
    SchemaMismatchError,
    SinkError,
)
from eosink.util import write_file_atomic

from ._hadoop import HadoopStore, java_message, spark_session
from ._s3 import S3Store
from .options import FileSinkOptions, validate_columns

log = logging.getLogger("eosink.file")


STAGING_DIR = "_eosink_staging"
MARKER_DIR = "_eosink"
COMMITS_DIR = "commits"
LAYOUT_REL = f"{MARKER_DIR}/layout.json"
"""The target's layout record (:func:`layout_of`), shared by every sink writing the path."""
LAYOUT_KEYS = ("format", "partition_by")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Characters escaped in partition directory names (Hive/Spark's set, plus NUL), as %XX.
_ESCAPE = {chr(c) for c in range(0x00, 0x20)} | set("\"#%'*/:=?\\\x7f{[]^")


def escape_partition_value(value: str) -> str:
    """Escape a partition value for a directory name (Hive/Spark style, ``%XX``)."""
    # "." and ".." are harmless: a directory is always "col=<value>", never a bare "..".
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)


def partition_segment(value: Any) -> str:
    if value is None:
        return NULL_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        value = value.hex()
    text = str(value)
    return escape_partition_value(text) if text else NULL_PARTITION


MAX_NAME_BYTES = 255
"""The longest partition directory name (``col=value``, escaped, in UTF-8 bytes) the file
sink writes: ``NAME_MAX`` of Linux filesystems and HDFS's default
``dfs.namenode.fs-limits.max-component-length``. On S3 the Python writers stage each
partition directory on local disk before uploading it, so the limit holds there too."""

_SHOWN_CHARS = 60


def partition_value_problem(column: str, value: Any) -> tuple[str, int] | None:
    """Why neither writer may write ``value`` into a directory of the partition column
    ``column``: ``("hive", 0)``, ``("nul", 0)`` or ``("long", <bytes of the escaped
    directory name>)``; None when it can be written.

    * ``__HIVE_DEFAULT_PARTITION__`` is the directory of NULL (and ``''``): every reader
      reads the value back as NULL (Spark's writer fails outright when a NULL and the
      literal meet in one task).
    * A NUL character can be in no directory name on any filesystem (the Python writers
      could escape it; Spark's writer, which does not, fails): refused on both paths.
    * A directory name longer than :data:`MAX_NAME_BYTES` once escaped.
    """
    if isinstance(value, str):
        if value == NULL_PARTITION:
            return ("hive", 0)
        if "\x00" in value:
            return ("nul", 0)
    if value is None:
        return None
    size = len(f"{escape_partition_value(column)}={partition_segment(value)}".encode())
    return ("long", size) if size > MAX_NAME_BYTES else None


def partition_value_error(
    column: str, value: Any, reason: str, size: int = 0
) -> SchemaMismatchError:
    """The :class:`~eosink.SchemaMismatchError` of a partition value that
    :func:`partition_value_problem` refuses (the same text for both writer paths)."""
    text = value.hex() if isinstance(value, bytes) else str(value)
    shown = repr(text[:_SHOWN_CHARS])
    if len(text) > _SHOWN_CHARS:
        shown += f" (the first {_SHOWN_CHARS} characters)"
    col = repr(column)
    if reason == "hive":
        why = (
            f"the name of the directory Hive and Spark write NULL (and '') into: every reader "
            f"would read these rows back as NULL. Replace the value before writing (e.g. "
            f"F.when(F.col({col}) == {NULL_PARTITION!r}, <another value>)"
            f".otherwise(F.col({col}))), filter those rows, or partition by another column"
        )
    elif reason == "nul":
        why = (
            "a value with a NUL character, which no directory name can hold (Spark's writer "
            f"fails on it). Remove it (F.regexp_replace(F.col({col}), '\\x00', '')), filter "
            "those rows, or partition by another column"
        )
    else:
        why = (
            f"a value whose directory name ({escape_partition_value(column)}=...) is {size} "
            f"bytes once escaped, over the {MAX_NAME_BYTES} bytes a directory name may have "
            "(local filesystems, HDFS). Shorten the values (F.substring, or a hash such as "
            f"F.sha2(F.col({col}), 256)), or partition by another column"
        )
    return SchemaMismatchError(
        f"partition_by column {col} holds {shown}, {why}. Nothing of this epoch was "
        "published or persisted"
    )


_GUARD_MARK = "EOSINK_FILE_PARTITION_VALUE:"
# Characters of a refused value the native path's error carries back: one more than the
# message shows, so that it can say the value is longer.
_GUARD_SHOWN = _SHOWN_CHARS + 1
_GUARDED = re.compile(re.escape(_GUARD_MARK) + r"(\d+):(hive|nul|long):(\d+):([0-9A-Fa-f]*)")


def _sql_name(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def guard_partition_values(df: Any, columns: Sequence[str]) -> Any:
    """``df`` with each string partition column checked as Spark's writer takes it: a value
    :func:`partition_value_problem` refuses fails the task with a marker that
    :func:`guarded_error` turns into the Python writers' error (same rule, same text).

    One ``CASE`` per string column, evaluated where Spark's writer reads the row (no other
    job, no other pass over the data).
    """
    from pyspark.sql import functions as F

    # What Spark's writer escapes (NUL excepted: it does not, and it is refused here), as
    # chr() calls: independent of how the session parses string literals.
    escaped = ", ".join(f"chr({ord(c)})" for c in sorted(_ESCAPE) if c != "\x00")
    types = {f.name: f.dataType.typeName() for f in df.schema.fields}
    checks = {}
    for i, c in enumerate(columns):
        if types.get(c) not in ("string", "varchar", "char"):
            continue
        q = _sql_name(c)
        limit = MAX_NAME_BYTES - len(f"{escape_partition_value(c)}=".encode())
        size = (
            f"(octet_length({q}) + 2 * (char_length({q}) - "
            f"char_length(translate({q}, concat({escaped}), ''))))"
        )
        # hex(), not base64(): Spark's base64 breaks lines every 76 characters by default.
        shown = f"hex(CAST(substring({q}, 1, {_GUARD_SHOWN}) AS BINARY))"

        def fail(reason: str, nbytes: str, i: int = i, shown: str = shown) -> str:
            mark = f"'{_GUARD_MARK}{i}:{reason}:'"
            return f"CAST(raise_error(concat({mark}, {nbytes}, ':', {shown})) AS STRING)"

        hive, nul = fail("hive", "'0'"), fail("nul", "'0'")
        long = fail("long", f"{size} + {MAX_NAME_BYTES - limit}")
        # An escaped character takes 3 bytes: values of up to limit / 3 bytes skip the
        # translate() that counts them (what the check costs is then two comparisons).
        checks[c] = F.expr(
            f"CASE WHEN {q} = '{NULL_PARTITION}' THEN {hive} "
            f"WHEN instr({q}, chr(0)) > 0 THEN {nul} "
            f"WHEN octet_length({q}) > {limit // 3} AND {size} > {limit} THEN {long} "
            f"ELSE {q} END"
        )
    return df.withColumns(checks) if checks else df


def guarded_error(exc: BaseException, columns: Sequence[str]) -> SchemaMismatchError | None:
    """The error of a partition value :func:`guard_partition_values` refused in Spark's
    writer, from Spark's failure; None for any other failure."""
    # Spark repeats the task's message in its own; some copies are cut short.
    found = list(_GUARDED.finditer(str(exc)))
    if not found:
        return None
    m = max(found, key=lambda f: len(f.group(4)))
    i, reason, size = int(m.group(1)), m.group(2), int(m.group(3))
    raw = m.group(4)
    value = bytes.fromhex(raw[: len(raw) // 2 * 2]).decode("utf-8", "replace")
    return partition_value_error(columns[i], value, reason, size)


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
        return _read_hadoop_layout(opts)
    f = local / LAYOUT_REL
    try:
        raw = f.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None, str(f)
    except OSError as exc:
        raise ConfigError(f"the file sink cannot read {f}: {exc.strerror or exc}") from None
    return _parse_layout(raw, str(f)), str(f)


def _read_hadoop_layout(opts: FileSinkOptions) -> tuple[dict[str, Any] | None, str] | None:
    """:func:`read_layout` on a Hadoop filesystem (``hdfs://``...), through the driver's
    Spark: also the first check that the path's FileSystem can be opened (a host that does
    not resolve is a ConfigError here, before the meta store). None without a classic
    Spark session in this process (the coordinator's ``init`` checks it where it runs)."""
    spark = spark_session()
    if spark is None or opts.hadoop_scheme is None:
        return None
    store = HadoopStore(spark, opts.path)
    where = store.url(LAYOUT_REL)
    try:
        raw = store.read(LAYOUT_REL)
    except Exception as exc:
        raise SinkError(f"the file sink cannot read {where}: {java_message(exc)}") from None
    return (None if raw is None else _parse_layout(raw, where)), where


def json_default(v: Any) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def write_json_atomic(path: Path, data: dict[str, Any], fsync: bool) -> None:
    """Write ``data`` as JSON to ``path`` by rename: readers see the old or the new file."""
    write_file_atomic(path, json.dumps(data, sort_keys=True).encode(), fsync=fsync)


def validate_schema(opts: FileSinkOptions, schema: pa.Schema) -> None:
    """Check the DataFrame's columns against the options, then the target: an ``s3://``
    bucket reachable with the credentials, and the layout the target records
    (:func:`check_layout`). Runs on the driver before the meta store is opened."""
    validate_columns(opts, schema)
    got = read_layout(opts)
    if got is not None:
        check_layout(opts, got[0], got[1])
