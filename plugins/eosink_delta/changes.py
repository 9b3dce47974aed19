"""Change data capture into a Delta table: ``mode="upsert"`` (keys, order_by, op_column).

1. **Staging** (the writers): an epoch's change rows, as they are, are written as Parquet
   files into its staged-changes directory (``layout.changes_dir``, hidden from readers and
   from ``VACUUM``).
2. **Phase 1** (:func:`check_changes`, before the epoch is PENDING) reads their key,
   ``order_by`` and ``op_column`` and refuses what no commit could publish: a null key, a
   key repeated without ``order_by``, two rows of one key tied on it.
3. **Phase 2** (:func:`merge`) keeps the last change of each key (the largest ``order_by``;
   a NULL never wins) and applies them in **one** ``MERGE``: a matched key is deleted (its
   change's ``op_column`` is in ``delete_ops``) or updated, an unmatched one inserted unless
   it is a delete. The ``MERGE``'s commit carries the epoch's app transactions
   (``epochs.py``), so it is in the table exactly when the epoch is: a replay is found by
   them and never applied twice. A concurrent writer's conflicting commit makes it fail
   before anything is visible; the core retries it on the new version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eosink import SchemaMismatchError, SinkError

from .options import DeltaSinkOptions

__all__ = ["DELETE", "check_changes", "merge", "read_changes", "winners"]

DELETE = "__eosink_delete"
_IDX = "__eosink_idx"


def read_changes(fs: Any, root: str, paths: Sequence[str], columns: list[str] | None) -> pa.Table:
    """The staged change files' rows (``columns`` only, when given)."""
    import pyarrow.parquet as pq

    tables = [pq.read_table(f"{root}/{p}", filesystem=fs, columns=columns) for p in paths]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")


def check_changes(opts: DeltaSinkOptions, epoch: int, data: pa.Table) -> None:
    """What would make the epoch's commit fail for good, checked before it is PENDING.

    Raises:
        SchemaMismatchError: a null key.
        SinkError: a key repeated without ``order_by``, or two rows of a key tied on it.
    """
    if data.num_rows == 0:
        return
    for k in opts.keys:
        n = data.column(k).null_count
        if n:
            raise SchemaMismatchError(
                f"delta sink epoch {epoch}: key column {k!r} is null in {n} row(s); every "
                "change needs its key (filter or fill them). Nothing was committed."
            )
    group = list(dict.fromkeys([*opts.keys, *([opts.order_by] if opts.order_by else [])]))
    probe = data.select(group)
    if opts.order_by:  # a NULL order_by never wins: ties among NULLs do not matter
        probe = probe.filter(pc.is_valid(probe.column(opts.order_by)))
    counts = probe.group_by(group).aggregate([([], "count_all")])
    dup = counts.filter(pc.greater(counts.column("count_all"), 1))
    if dup.num_rows == 0:
        return
    row = {c: dup.column(c)[0].as_py() for c in group}
    if opts.order_by:
        raise SinkError(
            f"delta sink epoch {epoch}: rows of key {row} tie on order_by {opts.order_by!r}: "
            "which one wins is undefined; make order_by unique per key (a Kafka offset, a "
            "change sequence). Nothing was committed."
        )
    raise SinkError(
        f"delta sink epoch {epoch}: key {row} appears in more than one row of the epoch; pass "
        "order_by=<column> (the row with the largest value wins), or deduplicate. Nothing "
        "was committed."
    )


def winners(opts: DeltaSinkOptions, data: pa.Table) -> pa.Table:
    """The last change of each key (the row with the largest ``order_by``; a NULL never
    wins), without the ``op_column``, with a boolean :data:`DELETE` column."""
    if opts.order_by and data.num_rows:
        order = data.column(opts.order_by)
        idx = pc.array_sort_indices(
            order.combine_chunks(), order="ascending", null_placement="at_start"
        )
        data = data.take(idx)
    ranked = data.select(list(opts.keys)).append_column(
        _IDX, pa.array(range(data.num_rows), pa.int64())
    )
    last = ranked.group_by(list(opts.keys), use_threads=False).aggregate([(_IDX, "max")])
    data = data.take(last.column(f"{_IDX}_max"))
    if opts.op_column and opts.op_column in data.column_names:
        ops = data.column(opts.op_column).cast(pa.string())
        deleted = pc.fill_null(pc.is_in(ops, value_set=pa.array(list(opts.delete_ops))), False)
        data = data.drop_columns([opts.op_column])
    else:
        deleted = pa.array([False] * data.num_rows)
    return data.append_column(DELETE, deleted)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def merge(
    opts: DeltaSinkOptions, table: Any, source: pa.Table, commit_properties: Any
) -> dict[str, Any]:
    """Apply ``source`` (:func:`winners`, cast to the table's types) to ``table`` in one
    ``MERGE`` whose commit carries ``commit_properties``; the ``MERGE``'s metrics."""
    on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in opts.keys)
    cols = {c: f"s.{_q(c)}" for c in source.column_names if c != DELETE}
    builder = table.merge(
        source,
        predicate=on,
        source_alias="s",
        target_alias="t",
        commit_properties=commit_properties,
    )
    delete = f"s.{_q(DELETE)}"
    return dict(
        builder.when_matched_delete(predicate=delete)
        .when_matched_update(updates=cols, predicate=f"NOT {delete}")
        .when_not_matched_insert(updates=cols, predicate=f"NOT {delete}")
        .execute()
    )
