"""Delta's per-file statistics (``add.stats``) from a data file's Parquet footer.

Readers skip files with them (``WHERE ts >= ...`` reads only the files whose range may hold a
match), and count rows with ``numRecords``. A statistic that is *wrong* makes a filtered read
drop rows silently; one that is *missing* only costs a read. So every value written here is a
true bound of the file's rows, and a column whose bound is not exact is left out:

* ``numRecords``: the footer's row count; ``nullCount``: the sum over its row groups (a
  column is left out when any row group lacks the count).
* ``minValues`` / ``maxValues`` for integers, strings, dates and timestamps only (floats are
  left out: NaN has no place in an order; decimals, booleans, binaries and nested columns
  too). Timestamps are written with millisecond precision, as Delta spells them: the minimum
  truncated down and the maximum **rounded up** to the next millisecond (a maximum truncated
  down would exclude the file's last microseconds from ``ts >= max``). Strings longer than
  :data:`STRING_PREFIX` characters keep a truncated minimum (a prefix is never larger) and
  no maximum.
* Only the columns Delta indexes: ``delta.dataSkippingStatsColumns`` when the table sets it,
  else the first ``delta.dataSkippingNumIndexedCols`` (default 32; -1: all) of the table's
  non-partition columns, in table order.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["STRING_PREFIX", "file_stats", "indexed_columns"]

STRING_PREFIX = 32
_EPOCH = dt.datetime(1970, 1, 1)
_PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}


def indexed_columns(
    table_columns: Sequence[str], partition_by: Sequence[str], config: Mapping[str, str]
) -> list[str]:
    """The columns Delta keeps statistics of (see the module docstring)."""
    named = config.get("delta.dataSkippingStatsColumns")
    if named:
        want = {c.strip().strip("`") for c in named.split(",") if c.strip()}
        return [c for c in table_columns if c in want and c not in partition_by]
    data = [c for c in table_columns if c not in partition_by]
    n = int(config.get("delta.dataSkippingNumIndexedCols", "32"))
    return data if n < 0 else data[:n]


def file_stats(metadata: Any, schema: pa.Schema, columns: Sequence[str]) -> str:
    """The ``stats`` JSON of a Parquet file: ``metadata`` its footer
    (``pyarrow.parquet.FileMetaData``), ``schema`` its Arrow schema, ``columns`` the indexed
    columns (:func:`indexed_columns`)."""
    out: dict[str, Any] = {"numRecords": int(metadata.num_rows)}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    positions = _leaf_positions(metadata)
    for name in columns:
        if name not in positions or name not in schema.names:
            continue
        stats = [
            metadata.row_group(g).column(positions[name]).statistics
            for g in range(metadata.num_row_groups)
        ]
        if metadata.num_row_groups == 0:
            continue
        if all(s is not None and s.has_null_count for s in stats):
            nulls[name] = int(sum(s.null_count for s in stats))
        bounds = _bounds(schema.field(name).type, stats)
        if bounds is not None:
            lo, hi = bounds
            if lo is not None:
                mins[name] = lo
            if hi is not None:
                maxs[name] = hi
    if metadata.num_rows:
        out["minValues"] = mins
        out["maxValues"] = maxs
    out["nullCount"] = nulls
    return json.dumps(out, separators=(",", ":"))


def _leaf_positions(metadata: Any) -> dict[str, int]:
    """Top-level primitive columns of the footer by name -> their column chunk index."""
    if metadata.num_row_groups == 0:
        return {}
    rg = metadata.row_group(0)
    out = {}
    for i in range(rg.num_columns):
        path = rg.column(i).path_in_schema
        if "." not in path:
            out[path] = i
    return out


def _bounds(t: pa.DataType, stats: list[Any]) -> tuple[Any, Any] | None:
    """The column's (min, max) as Delta writes them, or None (not exact, or no values)."""
    if not all(s is not None and s.has_min_max for s in stats):
        return None
    if not stats:
        return None
    if pa.types.is_integer(t):
        return min(int(s.min) for s in stats), max(int(s.max) for s in stats)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        los = [_text(s.min) for s in stats]
        his = [_text(s.max) for s in stats]
        if any(v is None for v in (*los, *his)):
            return None
        lo = min(v for v in los if v is not None)
        hi = max(v for v in his if v is not None)
        return (lo[:STRING_PREFIX], hi if len(hi) <= STRING_PREFIX else None)
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        lo_d = min(_date(s.min) for s in stats)
        hi_d = max(_date(s.max) for s in stats)
        return lo_d.isoformat(), hi_d.isoformat()
    if pa.types.is_timestamp(t):
        per_ms = _PER_MS[t.unit]
        if per_ms is None or any(s.physical_type != "INT64" for s in stats):
            return None  # INT96 timestamps carry no usable order statistics
        lo_i = min(_raw(s, "min") for s in stats)
        hi_i = max(_raw(s, "max") for s in stats)
        zone = "Z" if t.tz is not None else ""
        return (
            _timestamp(lo_i // per_ms) + zone,
            _timestamp(-((-hi_i) // per_ms)) + zone,  # rounded up to the millisecond
        )
    return None


def _text(v: Any) -> str | None:
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            return None
    return v if isinstance(v, str) else None


def _date(v: Any) -> dt.date:
    if isinstance(v, dt.datetime):
        return v.date()
    if isinstance(v, dt.date):
        return v
    return (_EPOCH + dt.timedelta(days=int(v))).date()


def _raw(s: Any, which: str) -> int:
    """A timestamp statistic as its integer (in the column's unit), whatever pyarrow made of
    it."""
    value = getattr(s, f"{which}_raw")
    if isinstance(value, int):
        return value
    raise TypeError(f"timestamp statistic {value!r} is not an integer")


def _timestamp(ms: int) -> str:
    t = _EPOCH + dt.timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}"
