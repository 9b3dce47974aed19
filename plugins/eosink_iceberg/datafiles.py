"""Data files: their names (which sink and epoch wrote them) and their JSON descriptions.

Two writers put data files under ``<table location>/data``:

* Python writers name each file with a *write uuid* that encodes the sink and the epoch
  (:func:`write_uuid`, :func:`epoch_of_file`).
* Spark's writer (the native path) writes an epoch's files into one directory per attempt,
  ``eosink-<sink key>-e<epoch>-<attempt>/`` (:func:`native_dir_name`); every file below it
  belongs to that epoch, whatever Spark named it (``part-...parquet``, ``.crc`` files,
  ``_temporary/`` of a job that never committed).

So the files of an epoch that never committed can be found by listing and deleted, whichever
path wrote them. The JSON of a DataFile is what write results and committables carry.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import re
import uuid
import zlib
from typing import Any

__all__ = [
    "SPARK_WRITE_CONF",
    "data_file_from_json",
    "data_file_to_json",
    "epoch_of_file",
    "native_dir_name",
    "native_write_dir",
    "norm",
    "sink_key",
    "write_uuid",
]

# The session confs of Spark's Parquet writes of data files (the native path, the staged
# changes of upserts), set for the write and restored: Iceberg wants INT64 microsecond timestamps
# (Spark's default is INT96), field ids, proleptic Gregorian dates as they are, and decimals
# as INT32/INT64 up to precision 18 (pyiceberg's statistics code expects them so).
SPARK_WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.fieldId.write.enabled": "true",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.writeLegacyFormat": "false",
}

_FILE_UUID = re.compile(
    r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.parquet$"
)
_NATIVE_DIR = re.compile(r"(?:^|/)eosink-([0-9a-f]{8})-e(\d+)-[A-Za-z0-9_-]+/")


def sink_key(sink_id: str) -> int:
    """A 32-bit key of the sink_id (in file names and table property names)."""
    return zlib.crc32(sink_id.encode()) & 0xFFFFFFFF


def write_uuid(sink_id: str, epoch: int) -> uuid.UUID:
    """A write uuid that encodes the epoch (high 64 bits) and the sink (next 32 bits)."""
    return uuid.UUID(int=(epoch << 64) | (sink_key(sink_id) << 32) | uuid.uuid4().int >> 96)


def native_dir_name(sink_id: str, epoch: int, attempt: str) -> str:
    """The directory (under ``<table location>/data``) of one native write of ``epoch``."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", attempt):
        raise ValueError(f"invalid attempt {attempt!r}")
    return f"eosink-{sink_key(sink_id):08x}-e{epoch}-{attempt}"


def epoch_of_file(path: str, sink_id: str) -> int | None:
    """The epoch of a file this sink wrote (a Python writer's data file, or any file below
    a native write's directory), else None."""
    key = sink_key(sink_id)
    m = _FILE_UUID.search(path)
    if m is not None:
        n = uuid.UUID(m.group(1)).int
        if (n >> 32) & 0xFFFFFFFF == key:
            return n >> 64
    d = _NATIVE_DIR.search(path)
    if d is not None and int(d.group(1), 16) == key:
        return int(d.group(2))
    return None


def native_write_dir(path: str) -> str | None:
    """The native write directory ``path`` lies in (``.../data/eosink-<key>-e<epoch>-<attempt>``,
    as spelt in ``path``), else None (a Python writer's file)."""
    d = _NATIVE_DIR.search(path)
    return path[: d.end() - 1] if d is not None else None


def norm(path: str) -> str:
    """A data file path without its scheme (listings and manifests spell it differently)."""
    return path.split("://", 1)[-1]


# -- DataFile <-> JSON ------------------------------------------------------------------------
def _enc(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"$b": base64.b64encode(v).decode()}
    if isinstance(v, decimal.Decimal):
        return {"$d": str(v)}
    if isinstance(v, uuid.UUID):
        return {"$u": str(v)}
    if isinstance(v, (_dt.date, _dt.datetime, _dt.time)):
        raise TypeError(f"unexpected {type(v).__name__} in a data file description")
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1:
        ((k, x),) = v.items()
        if k == "$b":
            return base64.b64decode(x)
        if k == "$d":
            return decimal.Decimal(x)
        if k == "$u":
            return uuid.UUID(x)
    return v


def _map(m: dict[int, Any] | None, f: Any = lambda x: x) -> Any:
    return None if m is None else [[int(k), f(v)] for k, v in m.items()]


def data_file_to_json(df: Any, spec_id: int) -> dict[str, Any]:
    """The JSON of a pyiceberg DataFile (a write result's, a committable's entry)."""
    return {
        "content": int(df.content),
        "file_path": df.file_path,
        "file_format": str(df.file_format.value),
        "partition": [_enc(v) for v in df.partition],
        "record_count": df.record_count,
        "file_size_in_bytes": df.file_size_in_bytes,
        "column_sizes": _map(df.column_sizes),
        "value_counts": _map(df.value_counts),
        "null_value_counts": _map(df.null_value_counts),
        "nan_value_counts": _map(df.nan_value_counts),
        "lower_bounds": _map(df.lower_bounds, _enc),
        "upper_bounds": _map(df.upper_bounds, _enc),
        "split_offsets": df.split_offsets,
        "spec_id": spec_id,
    }


def data_file_from_json(d: dict[str, Any]) -> Any:
    """The pyiceberg DataFile of :func:`data_file_to_json`'s JSON."""
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from ._compat import new_data_file

    def m(key: str, f: Any = lambda x: x) -> Any:
        v = d.get(key)
        return None if v is None else {int(k): f(x) for k, x in v}

    return new_data_file(
        d["spec_id"],
        content=DataFileContent(d["content"]),
        file_path=d["file_path"],
        file_format=FileFormat(d["file_format"]),
        partition=Record(*[_dec(v) for v in d["partition"]]),
        record_count=d["record_count"],
        file_size_in_bytes=d["file_size_in_bytes"],
        column_sizes=m("column_sizes"),
        value_counts=m("value_counts"),
        null_value_counts=m("null_value_counts"),
        nan_value_counts=m("nan_value_counts"),
        lower_bounds=m("lower_bounds", _dec),
        upper_bounds=m("upper_bounds", _dec),
        split_offsets=d.get("split_offsets"),
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
