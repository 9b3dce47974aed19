"""The sql sink's coordinator: checks before phase 1, and a commit that is one transaction.

``writer_setup`` (before any task) creates eosink's tables and, when asked, the target;
checks the DataFrame's columns against the target's and, for upserts, the target's unique
key; and hands the writers the statement that creates a staging table with the target's
column types. ``pre_commit`` checks that every staging table holds the rows its task
reported and that no key repeats within the epoch without ``order_by``, then runs the
commit's statements. ``commit`` moves the epoch's rows into the target, inserts the epoch's
row in ``sql_epochs`` and drops the epoch's staging tables, in one transaction: a reader
sees the epoch completely or not at all, and a replayed commit finds the epoch's row and
does nothing.

On PostgreSQL the transaction ``pre_commit`` ran the statements in is *held* open (idle, up
to :data:`~eosink_sql.holds.HOLD_S` seconds, named ``eosink-hold <sink key> <epoch>`` in
``pg_stat_activity``) and ``commit`` finishes it: the epoch's rows are moved once, and
nothing is visible before the commit. When the held transaction is gone (the driver died,
the commit runs in another process, the server ended it), ``commit`` runs the statements
again in a new transaction, after ending any held transaction of the epoch another
(crashed or paused) coordinator left, whose locks would block it. SQLite has one writer at
a time: there ``pre_commit`` runs the statements and rolls them back (a trial).

The coordinator is made of the sink's parts:

* ``target.py``: the checks before anything is written (``validate_schema``, the target
  table, the writers' staging statement);
* ``statements.py``: the SQL that applies an epoch;
* ``holds.py``: phase 1's trial and PostgreSQL's held transaction;
* ``marker.py``: eosink's rows beside the target (``sql_epochs``, ``sql_markers``);
* ``status.py``: what a PENDING epoch holds open, for ``eosink status``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from eosink import (
    CommitOutcome,
    EpochSpec,
    Prepared,
    Retirable,
    SinkCommitCoordinator,
    SinkError,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import is_transient, sink_key

from .db import Db
from .holds import HeldTransactions
from .options import SqlSinkOptions
from .target import TargetSetup

__all__ = ["SqlCoordinator", "make_coordinator"]


class SqlCoordinator(
    TargetSetup,
    HeldTransactions,
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    Retirable,
):
    """See the module."""

    def __init__(self, opts: SqlSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        self.key = sink_key(sink_id)
        self.db = Db(opts)
        self._data_columns: list[str] = []
        self._held: dict[int, tuple[Any, Any]] = {}  # epoch -> (connection, transaction)

    def init(self) -> None:
        try:
            with self.db.engine.begin() as conn:
                self.db.ensure_own_tables(conn)
        except Exception as exc:
            raise self.db.error("cannot connect or create eosink's tables", exc) from None

    def target_id(self) -> str:
        return self.opts.target_label

    def pre_commit(self, epoch: int, results: Sequence[dict[str, Any]]) -> Prepared[dict[str, Any]]:
        """Every staging table holds its task's rows, no key repeats without ``order_by``,
        and the commit's statements succeed: they run here, so that a row the target
        refuses (NULL in a NOT NULL column, a CHECK, a foreign key, a duplicate of a unique
        key, deferred constraints too) fails the epoch before it is PENDING. On PostgreSQL
        their transaction is held for ``commit``; on SQLite it is rolled back."""
        from sqlalchemy import text

        tables = sorted(r["table"] for r in results if int(r["rows"]))
        rows = sum(int(r["rows"]) for r in results)
        counts = {r["table"]: int(r["rows"]) for r in results if int(r["rows"])}
        committable = {
            "tables": tables,
            "rows": rows,
            "counts": counts,
            "table": self.opts.table,
            "columns": list(self._data_columns),
        }
        db = self.db
        try:
            with db.engine.connect() as conn:
                present = {n for n, _ in db.staging_tables(conn, self.key, epoch)}
                for r in results:
                    if not int(r["rows"]):
                        continue
                    if r["table"] not in present:
                        raise SinkError(
                            f"sql sink epoch {epoch}: staging table {r['table']} of a task is "
                            "missing (dropped by someone else?); the epoch is written again"
                        )
                    n = conn.execute(text(f"SELECT COUNT(*) FROM {db.staging(r['table'])}"))
                    got = int(n.scalar_one())
                    if got != int(r["rows"]):
                        raise SinkError(
                            f"sql sink epoch {epoch}: staging table {r['table']} holds {got} "
                            f"rows, its task wrote {r['rows']}"
                        )
                if tables and not self._data_columns:
                    self._data_columns = self._staged_data_columns(conn, tables[0])
                    committable["columns"] = list(self._data_columns)
                if tables and self.opts.keys:
                    self._check_repeats(conn, epoch, tables)
            if tables:
                if db.pg:
                    self._hold(epoch, committable, self._how())
                else:
                    self._trial(epoch, committable, self._how())
        except SinkError:
            raise
        except Exception as exc:
            raise db.error(f"cannot check epoch {epoch}'s staged rows", exc) from None
        return Prepared(committable, files=len(tables))

    def commit(
        self, epoch: int, committable: dict[str, Any], spec: EpochSpec | None = None
    ) -> CommitOutcome | None:
        """One transaction: the rows, the epoch's row in ``sql_epochs``, the staging tables
        dropped. Idempotent by the epoch's row (``already_committed`` when it is there).
        Applied as the epoch was staged (:meth:`_staged_how`: the epoch spec's options),
        whatever options this run was given."""
        from sqlalchemy import exc as sa_exc

        db = self.db
        if epoch in self._held and self._finish_held(epoch, committable):
            return None
        self._end_other_holds(epoch)
        already = False
        try:
            with db.engine.begin() as conn:
                already = self._committed(conn, epoch)
                if not already:
                    present = {n for n, _ in db.staging_tables(conn, self.key, epoch)}
                    missing = [t for t in committable["tables"] if t not in present]
                    if missing:
                        raise SinkError(
                            f"sql sink epoch {epoch}: staging table {missing[0]} is gone but "
                            "the epoch is not committed: it was dropped outside eosink. Its "
                            "rows cannot be published: `eosink abandon` the epoch (a "
                            "recorded loss)"
                        )
                    self._check_counts(conn, epoch, committable)
                    self._apply(
                        conn, epoch, committable, self._staged_how(epoch, committable, spec)
                    )
                    fault_point("mid_commit", site="fresh")
                    self._epoch_row(conn, epoch, committable)
                self._drop(conn, epoch)
        except sa_exc.IntegrityError as exc:
            # Another coordinator (a zombie) committed the epoch concurrently: its
            # transaction won, ours rolled back. Done, if its row is there.
            with db.engine.connect() as conn:
                if self._committed(conn, epoch):
                    return CommitOutcome.already_committed("another coordinator's commit won")
            raise db.error(f"epoch {epoch}'s commit", exc) from None
        except sa_exc.OperationalError as exc:
            from eosink import CommitStateUnknownError

            if not is_transient(exc):
                raise db.error(f"epoch {epoch}'s commit", exc) from None
            raise CommitStateUnknownError(str(db.error(f"epoch {epoch}'s commit", exc))) from None
        except SinkError:
            raise
        except sa_exc.DBAPIError as exc:
            raise db.error(f"epoch {epoch}'s commit", exc) from None
        if already:
            return CommitOutcome.already_committed(f"{self.db.own('sql_epochs')} has its row")
        return None

    def _check_counts(self, conn: Any, epoch: int, committable: dict[str, Any]) -> None:
        """Every staging table still holds the rows phase 1 counted (a server crash empties
        ``UNLOGGED`` tables): never commit an epoch short."""
        from sqlalchemy import text

        for table, want in (committable.get("counts") or {}).items():
            got = conn.execute(text(f"SELECT COUNT(*) FROM {self.db.staging(table)}")).scalar()
            if int(got or 0) != int(want):
                raise SinkError(
                    f"sql sink epoch {epoch}: staging table {table} holds {got} rows, phase 1 "
                    f"counted {want}: the database lost them (a server crash empties UNLOGGED "
                    "tables; see the unlogged_staging option). The epoch is not committed. "
                    "If the rows can be sent again, `eosink abandon` the epoch (a recorded "
                    "loss) and replay them"
                )

    def abort(
        self, epoch: int, committable: dict[str, Any] | None, spec: EpochSpec | None = None
    ) -> None:
        """Drop every staging table of the epoch (all attempts), one at a time."""
        from sqlalchemy import text

        self._release(epoch)
        self._end_other_holds(epoch)
        try:
            with self.db.engine.connect() as conn:
                names = [n for n, _ in self.db.staging_tables(conn, self.key, epoch)]
            for i, name in enumerate(names):
                if i:
                    fault_point("mid_abort")
                with self.db.engine.begin() as conn:
                    conn.execute(text(f"DROP TABLE IF EXISTS {self.db.staging(name)}"))
        except Exception as exc:
            raise self.db.error(f"cannot drop epoch {epoch}'s staging tables", exc) from None

    def staged_epochs(self) -> Iterable[int]:
        try:
            with self.db.engine.connect() as conn:
                return sorted({e for _, e in self.db.staging_tables(conn, self.key)})
        except Exception as exc:
            raise self.db.error("cannot list the staging tables", exc) from None

    def close(self) -> None:
        for epoch in list(self._held):
            self._release(epoch)
        self.db.close()


def make_coordinator(opts: SqlSinkOptions, sink_id: str) -> SqlCoordinator:
    return SqlCoordinator(opts, sink_id)
