"""The target's layout: partition directories, schema ids, and the layout record
(``_eosink/layout.json``) that every sink writing a path must agree with."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from eosink import (
    ConfigError,
    SinkError,
)

from ._hadoop import spark_session
from ._rolling import fsync_path
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


def validate_schema(opts: FileSinkOptions, schema: pa.Schema) -> None:
    """Check the DataFrame's columns against the options, then the target: an ``s3://``
    bucket reachable with the credentials, and the layout the target records
    (:func:`check_layout`). Runs on the driver before the meta store is opened."""
    validate_columns(opts, schema)
    got = read_layout(opts)
    if got is not None:
        check_layout(opts, got[0], got[1])
