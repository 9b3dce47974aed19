"""An epoch's staged records: where they go (topics and partitions), how large they are, the
chunks a staged file is cut into, and a chunk's records read back in order.

The coordinator cuts each staged file into *chunks* of at most ``chunk_bytes`` (by the row
sizes in the Parquet footer) and gives every chunk of one file to the same transactional id,
in order, so records of one partition (and so of one key, for a DataFrame partitioned by
key) keep their order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eosink import SinkError
from eosink.util import abandon_hint

from .stage import Stage

__all__ = ["Record", "chunks_of", "largest_record", "merge_targets", "read_chunk", "targets_of"]

Record = tuple[Any, Any, Any, Any, Any]

"""(topic, value, key, headers, partition) of one record, as produced."""


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
