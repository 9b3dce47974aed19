"""Phase 2 of an upsert epoch, the copy-on-write: which data files of the current snapshot
hold one of the epoch's keys, their rows without those keys, and the data files written
(the rows kept and the epoch's upserts) into a fresh directory of the epoch, for the one
table commit of :mod:`~eosink_iceberg.upsert`. Why copy-on-write: see :mod:`~eosink_iceberg.cdc`.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import _compat
from .cdc import changes_dir
from .datafiles import write_uuid

__all__ = ["key_filter", "new_files_dir", "rewrite_plan", "without_keys", "write_data"]


def key_filter(keys: pa.Table) -> Any:
    """A pyiceberg row filter that every data file holding one of ``keys`` matches (used to
    prune files by their statistics; the exact match is the join)."""
    from pyiceberg import expressions

    ex: Any = expressions  # pydantic models: mypy misreads their constructors
    AlwaysTrue, And, In = ex.AlwaysTrue, ex.And, ex.In
    GreaterThanOrEqual, LessThanOrEqual = ex.GreaterThanOrEqual, ex.LessThanOrEqual

    try:
        if keys.num_columns == 1:
            name = keys.column_names[0]
            values = pc.unique(keys.column(0))
            if len(values) <= 200:  # pyiceberg evaluates IN against bounds up to 200 values
                return In(name, [v.as_py() for v in values])
        expr: Any = AlwaysTrue()
        for name in keys.column_names:
            lo, hi = pc.min_max(keys.column(name)).values()
            expr = And(
                expr,
                And(GreaterThanOrEqual(name, lo.as_py()), LessThanOrEqual(name, hi.as_py())),
            )
        return expr
    except Exception:  # a key type pyiceberg has no literal for: no pruning
        return AlwaysTrue()


def without_keys(rows: pa.Table, keys: pa.Table) -> pa.Table:
    """``rows`` whose key is not one of ``keys`` (an anti-join; the key types of ``keys`` are
    cast to those of ``rows``)."""
    names = keys.column_names
    cast = pa.table({n: keys.column(n).cast(rows.schema.field(n).type) for n in names})
    return rows.join(cast, names, join_type="left anti", use_threads=True)


def rewrite_plan(
    table: Any, metadata: Any, keys: pa.Table, io: Any
) -> tuple[list[Any], pa.Table | None, int]:
    """The data files of ``table``'s current snapshot that hold one of ``keys`` and what is
    left of their rows without those keys (in ``metadata``'s schema: after the epoch's
    schema evolution). Returns (files to delete, rows to write again, rows removed)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    if table.current_snapshot() is None or keys.num_rows == 0:
        return [], None, 0
    tasks = list(table.scan(row_filter=key_filter(keys)).plan_files())
    if not tasks:
        return [], None, 0
    schema = metadata.schema()

    def one(task: Any) -> tuple[Any, pa.Table | None, int]:
        rows = ArrowScan(metadata, io, schema, AlwaysTrue()).to_table([task])
        left = without_keys(rows, keys)
        if left.num_rows == rows.num_rows:
            return task.file, None, 0
        return task.file, left, rows.num_rows - left.num_rows

    with ThreadPoolExecutor(max_workers=min(8, len(tasks))) as pool:
        done = list(pool.map(one, tasks))
    hit = [(f, left, n) for f, left, n in done if left is not None]
    if not hit:
        return [], None, 0
    kept = pa.concat_tables([left for _, left, _ in hit], promote_options="permissive")
    return [f for f, _, _ in hit], kept, sum(n for _, _, n in hit)


def write_data(
    metadata: Any, rows: pa.Table, io: Any, sink_id: str, epoch: int, directory: str
) -> list[Any]:
    """Write ``rows`` as data files of the table under ``directory`` (a path below the table's
    data location, whose name carries the sink and the epoch); their DataFiles."""
    if rows.num_rows == 0:
        return []
    props = {**metadata.properties, "write.data.path": directory}
    props.pop("write.object-storage.enabled", None)
    meta = metadata.model_copy(update={"properties": props})
    return list(_compat.arrow_to_data_files(meta, rows, io, write_uuid(sink_id, epoch)))


def new_files_dir(location: str, sink_id: str, epoch: int) -> str:
    """A fresh directory for the data files one commit attempt of ``epoch`` writes."""
    return changes_dir(location, sink_id, epoch, f"c{uuid.uuid4().hex[:12]}")
