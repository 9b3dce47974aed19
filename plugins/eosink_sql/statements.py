"""The SQL of an epoch's commit: the statements that move its staged rows into the target
(append; or the deletes, then the upserts of the latest change of each key), the check that
no key repeats within an epoch without ``order_by``, and how a persisted epoch is applied
(the options it was staged with, from its epoch spec).
"""

from __future__ import annotations

from typing import Any

from eosink import EpochSpec, SinkError

from .state import CoordinatorState

__all__ = ["Statements"]


class Statements(CoordinatorState):
    """The coordinator's part that writes an epoch's SQL (no transaction of its own: the
    caller's connection runs it)."""

    def _how(self) -> dict[str, Any]:
        """How an epoch staged by this run is applied (phase 1 tries it): from the options
        this run was given."""
        return {
            "table": self.opts.table,
            "mode": self.opts.mode,
            "keys": list(self.opts.keys),
            "order_by": self.opts.order_by,
            "op_column": self.opts.op_column,
            "delete_ops": list(self.opts.delete_ops),
            "columns": list(self._data_columns),
        }

    def _check_repeats(self, conn: Any, epoch: int, tables: list[str]) -> None:
        from sqlalchemy import text

        db = self.db
        keys = list(self.opts.keys)
        order = self.opts.order_by
        group = keys + ([order] if order and order not in keys else [])
        src = self._union(tables, group)
        row = conn.execute(
            text(
                f"SELECT {db.columns(group)} FROM ({src}) s GROUP BY {db.columns(group)} "
                "HAVING COUNT(*) > 1 LIMIT 1"
            )
        ).first()
        if row is None:
            return
        key = dict(zip(group, row, strict=True))
        if self.opts.order_by:
            raise SinkError(
                f"sql sink epoch {epoch}: rows of key {key} tie on order_by "
                f"{self.opts.order_by!r}: which one wins is undefined; make order_by unique "
                "per key (a Kafka offset, a change sequence)"
            )
        raise SinkError(
            f"sql sink epoch {epoch}: key {key} appears in more than one row of the epoch; "
            "pass order_by=<column> (the row with the largest value wins), or deduplicate"
        )

    def _union(self, tables: list[str], cols: list[str]) -> str:
        c = self.db.columns(cols)
        return " UNION ALL ".join(f"SELECT {c} FROM {self.db.staging(t)}" for t in tables)

    @staticmethod
    def _staged_how(
        epoch: int, committable: dict[str, Any], spec: EpochSpec | None
    ) -> dict[str, Any]:
        """How a persisted epoch is applied: the mode, keys, order and deletes of the options
        it was staged with (its :class:`~eosink.EpochSpec`), the table and columns of its
        committable; a committable of codec version 1 carries its own copy.

        Raises:
            SinkError: a committable of version 2 without its spec (not persisted by eosink).
        """
        if "spec" in committable:
            return dict(committable["spec"])
        if spec is None:
            raise SinkError(
                f"sql sink epoch {epoch}: its committable came without the epoch spec it was "
                "staged with (the core passes it to a sink that declares epoch_spec); "
                "cannot tell its mode and keys"
            )
        o = spec.options
        return {
            "table": committable["table"],
            "mode": o["mode"],
            "keys": list(o.get("keys") or []),
            "order_by": o.get("order_by"),
            "op_column": o.get("op_column"),
            "delete_ops": list(o.get("delete_ops") or []),
            "columns": list(committable["columns"]),
        }

    def _apply(
        self, conn: Any, epoch: int, committable: dict[str, Any], how: dict[str, Any]
    ) -> None:
        """The epoch's statements (no commit): append, or deletes then upserts, as ``how``
        says."""
        from sqlalchemy import text

        tables = list(committable["tables"])
        if not tables:
            return
        spec = how
        db = self.db
        cols = list(spec["columns"])
        target = db.target_of(spec["table"])
        if spec["mode"] == "append":
            conn.execute(
                text(f"INSERT INTO {target} ({db.columns(cols)}) {self._union(tables, cols)}")
            )
            return
        keys = list(spec["keys"])
        op = spec["op_column"]
        order = spec["order_by"]
        src = cols + ([order] if order and order not in cols else []) + ([op] if op else [])
        # The largest order_by wins; a NULL one never does (NULLs sort last here, as on
        # SQLite; PostgreSQL would put them first in DESC).
        if order:
            rank = f"ORDER BY ({db.quote(order)} IS NULL), {db.quote(order)} DESC"
            latest = (
                f"SELECT * FROM (SELECT {db.columns(src)}, ROW_NUMBER() OVER "
                f"(PARTITION BY {db.columns(keys)} {rank}) AS eosink_rn "
                f"FROM ({self._union(tables, src)}) u) r WHERE eosink_rn = 1"
            )
        else:  # no key repeats in the epoch (pre_commit refuses it): each row is the latest
            latest = self._union(tables, src)
        params = {f"op{i}": v for i, v in enumerate(spec["delete_ops"])}
        is_delete = f"{db.quote(op)} IN ({', '.join(':' + p for p in params)})" if op else "1 = 0"
        key_tuple = f"({db.columns(keys)})"
        # Deletes first, then upserts: the epoch's last change of each key is applied.
        if op:
            conn.execute(
                text(
                    f"DELETE FROM {target} WHERE {key_tuple} IN "
                    f"(SELECT {db.columns(keys)} FROM ({latest}) d WHERE {is_delete})"
                ),
                params,
            )
        others = [c for c in cols if c not in keys]
        action = (
            "DO UPDATE SET " + ", ".join(f"{db.quote(c)} = excluded.{db.quote(c)}" for c in others)
            if others
            else "DO NOTHING"
        )
        keep = f"({db.quote(op)} IS NULL OR NOT ({is_delete}))" if op else "1 = 1"
        conn.execute(
            text(
                f"INSERT INTO {target} ({db.columns(cols)}) SELECT {db.columns(cols)} "
                f"FROM ({latest}) s WHERE {keep} ON CONFLICT ({db.columns(keys)}) {action}"
            ),
            params,
        )

    def _drop(self, conn: Any, epoch: int, names: list[str] | None = None) -> None:
        """Drop the epoch's staging tables (``names``, when the caller listed them)."""
        from sqlalchemy import text

        if names is None:
            names = [n for n, _ in self.db.staging_tables(conn, self.key, epoch)]
        for name in names:
            conn.execute(text(f"DROP TABLE IF EXISTS {self.db.staging(name)}"))
