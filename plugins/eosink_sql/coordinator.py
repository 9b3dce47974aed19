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
to :data:`HOLD_S` seconds, named ``eosink-hold <sink key> <epoch>`` in
``pg_stat_activity``) and ``commit`` finishes it: the epoch's rows are moved once, and
nothing is visible before the commit. When the held transaction is gone (the driver died,
the commit runs in another process, the server ended it), ``commit`` runs the statements
again in a new transaction, after ending any held transaction of the epoch another
(crashed or paused) coordinator left, whose locks would block it. SQLite has one writer at
a time: there ``pre_commit`` runs the statements and rolls them back (a trial).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from eosink import (
    CommitOutcome,
    ConfigError,
    EpochSpec,
    Prepared,
    Retirable,
    SchemaMismatchError,
    SinkCommitCoordinator,
    SinkError,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import is_transient, sink_key

from .db import Db, check_types, sql_type_of
from .options import SqlSinkOptions

__all__ = ["SqlCoordinator", "describe_open", "make_coordinator", "validate_schema"]

log = logging.getLogger("eosink.sql")

HOLD_S = 120
"""How long PostgreSQL keeps a held phase-1 transaction that is idle (its
``idle_in_transaction_session_timeout``): past it the server ends the transaction and the
commit moves the rows again. It bounds how long a paused (zombie) driver's locks can delay
another driver's recovery."""


def validate_schema(opts: SqlSinkOptions, schema: pa.Schema) -> None:
    """The DataFrame's columns against the options (no connection): types the sink can
    write, and the ``keys``, ``order_by`` and ``op_column`` it names."""
    check_types(schema)
    names = set(schema.names)
    for what, cols in (("keys", opts.keys), ("order_by", [opts.order_by] if opts.order_by else [])):
        missing = [c for c in cols if c not in names]
        if missing:
            raise SchemaMismatchError(
                f"sql sink: {what} names {missing}, not columns of the DataFrame "
                f"({', '.join(schema.names)})"
            )
    if opts.op_column is not None:
        if opts.op_column not in names:
            raise SchemaMismatchError(
                f"sql sink: op_column {opts.op_column!r} is not a column of the DataFrame"
            )
        t = schema.field(opts.op_column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaMismatchError(
                f"sql sink: op_column {opts.op_column!r} must be a string column, not {t}"
            )


def hold_name(key: str, epoch: int) -> str:
    """The ``application_name`` of the session that holds ``epoch``'s phase-1 transaction on
    PostgreSQL (``key``: the sink's :func:`~eosink.util.sink_key`)."""
    return f"eosink-hold {key} {epoch}"


def describe_open(
    sink_id: str, last: dict[str, Any] | None, pending: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """What a PENDING epoch holds in the target database, for ``eosink status``: its staging
    tables (one per task attempt that wrote rows; dropped by the commit) and, on PostgreSQL,
    its phase-1 transaction, which may still be held open (``application_name`` ``eosink-hold
    <sink key> <epoch>``), with the locks of its statements on the target table, until the
    commit, the sink's next start or ``eosink recover`` ends it, or :data:`HOLD_S` seconds
    idle. A COMMITTED epoch leaves nothing open."""
    key = sink_key(sink_id)
    out = []
    for epoch in sorted(pending):
        c = pending[epoch]
        tables = list(c.get("tables") or [])
        target = c["table"] if "table" in c else c["spec"]["table"]  # (codec version 1)
        hold = hold_name(key, epoch)
        out.append(
            {
                "kind": "staging tables",
                "what": f"epoch {epoch}: {len(tables)} staging table(s), {c['rows']} rows to "
                f"move into {target}; on PostgreSQL its phase-1 transaction may be held open "
                f"(application_name '{hold}', locks on {target}) until the "
                f"commit or {HOLD_S} s idle",
                "epoch": epoch,
                "table": target,
                "staging_tables": tables,
                "rows": int(c["rows"]),
                "hold_application_name": hold,
            }
        )
    return out


class SqlCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]], StagedEpochs, TargetMarker, Retirable
):
    """See the module."""

    def __init__(self, opts: SqlSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        self.key = sink_key(sink_id)
        self.db = Db(opts)
        self._data_columns: list[str] = []
        self._held: dict[int, tuple[Any, Any]] = {}  # epoch -> (connection, transaction)

    # -- set-up and checks ---------------------------------------------------------------
    def init(self) -> None:
        try:
            with self.db.engine.begin() as conn:
                self.db.ensure_own_tables(conn)
        except Exception as exc:
            raise self.db.error("cannot connect or create eosink's tables", exc) from None

    def target_id(self) -> str:
        return self.opts.target_label

    def _target_columns(self, conn: Any) -> dict[str, Any] | None:
        import sqlalchemy as sa

        schema, name = self.opts.schema_and_name
        insp = sa.inspect(conn)
        if not insp.has_table(name, schema=schema):
            return None
        return {c["name"]: c for c in insp.get_columns(name, schema=schema)}

    def _unique_keys(self, conn: Any) -> list[set[str]]:
        import sqlalchemy as sa

        schema, name = self.opts.schema_and_name
        insp = sa.inspect(conn)
        out = [set(insp.get_pk_constraint(name, schema=schema).get("constrained_columns") or [])]
        out += [set(u["column_names"]) for u in insp.get_unique_constraints(name, schema=schema)]
        out += [
            set(c for c in i["column_names"] if c)
            for i in insp.get_indexes(name, schema=schema)
            if i.get("unique")
        ]
        return [u for u in out if u]

    def _create_target(self, conn: Any, schema: pa.Schema) -> None:
        import sqlalchemy as sa

        tschema, name = self.opts.schema_and_name
        cols = []
        for f in schema:
            if f.name == self.opts.op_column:
                continue
            if pa.types.is_null(f.type):
                raise SchemaMismatchError(
                    f"sql sink: column {f.name!r} is all NULL, of no type: cast it "
                    f"(CAST(NULL AS ...)) so that table {self.opts.table} can be created"
                )
            typ = sql_type_of(f.type)
            if not self.db.pg and pa.types.is_decimal(f.type):
                typ = sa.Text()  # SQLite's NUMERIC affinity would round to 15 digits
            cols.append(
                sa.Column(
                    f.name,
                    typ,
                    primary_key=f.name in self.opts.keys,
                    nullable=f.name not in self.opts.keys,
                    autoincrement=False,
                )
            )
        sa.Table(name, sa.MetaData(), *cols, schema=tschema).create(conn)
        log.info("sql sink: created table %s", self.opts.table)

    def writer_setup(self, schema: pa.Schema) -> dict[str, Any]:
        """Create or check the target (see the module); the writers' staging statement."""
        validate_schema(self.opts, schema)
        db = self.db
        try:
            with db.engine.begin() as conn:
                target = self._target_columns(conn)
                if target is None:
                    if not self.opts.create_table:
                        raise ConfigError(
                            f"sql sink: table {self.opts.table} does not exist in "
                            f"{self.opts.target_label.rsplit('/', 1)[0]}: create it, or pass "
                            "create_table=True to create it from the DataFrame's schema"
                        )
                    self._create_target(conn, schema)
                    target = self._target_columns(conn)
                    assert target is not None
                data = [n for n in schema.names if n != self.opts.op_column]
                extra = [n for n in data if n not in target and n != self.opts.order_by]
                if extra:
                    raise SchemaMismatchError(
                        f"sql sink: table {self.opts.table} has no column {extra[0]!r} "
                        f"(its columns: {', '.join(target)}); add it to the table or drop it "
                        "from the DataFrame"
                    )
                required = [
                    n
                    for n, c in target.items()
                    if n not in data
                    and not c.get("nullable", True)
                    and c.get("default") is None
                    and c.get("autoincrement") is not True
                ]
                if required and self.opts.mode == "append":
                    raise SchemaMismatchError(
                        f"sql sink: table {self.opts.table} requires column {required[0]!r} "
                        "(NOT NULL, no default), which the DataFrame lacks"
                    )
                if self.opts.keys and set(self.opts.keys) not in self._unique_keys(conn):
                    raise SchemaMismatchError(
                        f"sql sink: upserts by keys {list(self.opts.keys)} need a primary key "
                        f"or unique constraint on exactly these columns of {self.opts.table}; "
                        "add one (ALTER TABLE ... ADD PRIMARY KEY (...)), or use "
                        "create_table=True on a new table"
                    )
        except (ConfigError, SinkError):
            raise
        except Exception as exc:
            raise db.error("cannot check the target table", exc) from None
        self._data_columns = [n for n in data if n in target]
        staged = list(data) + ([self.opts.op_column] if self.opts.op_column else [])
        # A staging table with the target's types (values that do not fit fail in the task,
        # before anything is persisted), plus the columns only the sink reads.
        select = ", ".join(
            db.quote(n) if n in target else f"CAST(NULL AS {self._ddl(n, schema)}) AS {db.quote(n)}"
            for n in data
        )
        if self.opts.op_column:
            select += f", CAST(NULL AS VARCHAR(64)) AS {db.quote(self.opts.op_column)}"
        if db.pg:
            create = (
                f"CREATE {'UNLOGGED ' if self.opts.unlogged_staging else ''}TABLE {{table}} "
                f"AS SELECT {select} FROM {db.target()} "
                "WITH NO DATA"
            )
        else:
            create = f"CREATE TABLE {{table}} AS SELECT {select} FROM {db.target()} WHERE 0"
        return {
            "create": create,
            "columns": staged,
            "op_column": self.opts.op_column,
            "binary": self._binary_kinds(f"SELECT {select} FROM {db.target()}", schema, staged),
        }

    def _binary_kinds(self, select: str, schema: pa.Schema, staged: list[str]) -> list[str] | None:
        """Per staged column, the Arrow type the writers cast it to for binary ``COPY``
        (ADBC), or None: every column must fit, else the writers send CSV (PostgreSQL
        converts text the way it always does). From the staging table's column types."""
        if not self.db.pg:
            return None
        try:
            import adbc_driver_postgresql  # noqa: F401
        except ImportError:
            log.info("sql sink: adbc-driver-postgresql is not installed: loading CSV")
            return None
        from .db import binary_kind

        with self.db.engine.connect() as conn:
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cur.execute(f"{select} LIMIT 0")
                desc: Any = cur.description
                oids = [int(d[1]) for d in desc]
            finally:
                cur.close()
            conn.rollback()
        kinds = [
            binary_kind(schema.field(n).type, oid) for n, oid in zip(staged, oids, strict=True)
        ]
        if any(k is None for k in kinds):
            return None
        return [str(k) for k in kinds]

    def _ddl(self, name: str, schema: pa.Schema) -> str:
        t = sql_type_of(schema.field(name).type)
        if t is None:
            raise SchemaMismatchError(f"sql sink: column {name!r} is all NULL, of no type: cast it")
        return str(t.compile(dialect=self.db.engine.dialect))

    # -- phase 1 -----------------------------------------------------------------------
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

    def _staged_data_columns(self, conn: Any, table: str) -> list[str]:
        """The target's columns an epoch staged in ``table``, as :meth:`writer_setup` would
        have fixed them: ``format("eosink")`` runs phase 1 in another process than the
        writers' set-up (a data source's commit), with a new coordinator."""
        import sqlalchemy as sa

        schema = self.opts.staging_schema if self.db.pg else None
        name = table if self.db.pg else f"eosink_{table}"
        staged = [c["name"] for c in sa.inspect(conn).get_columns(name, schema=schema)]
        target = self._target_columns(conn) or {}
        return [n for n in staged if n in target and n != self.opts.op_column]

    def _trial(self, epoch: int, committable: dict[str, Any], how: dict[str, Any]) -> None:
        from sqlalchemy import exc as sa_exc

        conn = self.db.engine.connect()
        try:
            tx = conn.begin()
            try:
                self._apply(conn, epoch, committable, how)
            except sa_exc.DBAPIError as exc:
                raise self._refused(epoch, how, exc) from None
            finally:
                tx.rollback()
        finally:
            conn.close()

    def _refused(self, epoch: int, how: dict[str, Any], exc: BaseException) -> SinkError:
        """Phase 1's error when the target refuses the epoch's statements."""
        return self.db.error(
            f"epoch {epoch} is refused by table {how['table']} (its "
            "statements were tried and rolled back; nothing was written)",
            exc,
        )

    def _hold_name(self, epoch: int) -> str:
        return hold_name(self.key, epoch)

    def _hold(self, epoch: int, committable: dict[str, Any], how: dict[str, Any]) -> None:
        """Run the epoch's statements in a transaction kept open for :meth:`commit`."""
        from sqlalchemy import exc as sa_exc
        from sqlalchemy import text

        self._release(epoch)  # a hold of an earlier attempt of this epoch, by this object
        self._end_other_holds(epoch)  # a zombie's: its locks would block these statements
        conn = self.db.engine.connect()
        tx = conn.begin()
        try:
            conn.execute(
                text(
                    "SELECT set_config('application_name', :n, true), "
                    "set_config('idle_in_transaction_session_timeout', :t, true)"
                ),
                {"n": self._hold_name(epoch), "t": f"{HOLD_S}s"},
            )
            self._apply(conn, epoch, committable, how)
            conn.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))  # deferred ones: now
        except sa_exc.DBAPIError as exc:
            tx.rollback()
            conn.close()
            raise self._refused(epoch, how, exc) from None
        except BaseException:
            tx.rollback()
            conn.close()
            raise
        self._held[epoch] = (conn, tx)

    def _release(self, epoch: int) -> None:
        """Roll back this object's held transaction of ``epoch``, if any."""
        held = self._held.pop(epoch, None)
        if held is None:
            return
        conn, tx = held
        try:
            tx.rollback()
        except Exception:  # the connection is gone: so is the transaction
            log.debug("sql sink: rolling back a held transaction failed", exc_info=True)
        finally:
            conn.close()

    def _end_other_holds(self, epoch: int) -> None:
        """End the held transactions of ``epoch`` that other coordinators (a crashed or a
        paused driver) left open: their locks on the staging tables and the target's rows
        would block this commit or abort until the server's idle timeout."""
        from sqlalchemy import text

        if not self.db.pg:
            return
        try:
            with self.db.engine.connect() as conn:
                ended = conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :n AND datname = current_database() "
                        "AND pid <> pg_backend_pid()"
                    ),
                    {"n": self._hold_name(epoch)},
                ).all()
                conn.commit()
            if ended:
                log.info(
                    "sql sink %s epoch %d: ended %d transaction(s) another coordinator held",
                    self.sink_id,
                    epoch,
                    len(ended),
                )
        except Exception as exc:  # not allowed (another role's session): wait for the timeout
            log.warning(
                "sql sink %s epoch %d: cannot end transactions other coordinators hold (%s); "
                "waiting for them (at most %d s)",
                self.sink_id,
                epoch,
                str(getattr(exc, "orig", exc)).strip().splitlines()[0],
                HOLD_S,
            )

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

    # -- phase 2 -----------------------------------------------------------------------
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

    def _epoch_row(self, conn: Any, epoch: int, committable: dict[str, Any]) -> None:
        from sqlalchemy import text

        conn.execute(
            text(
                f"INSERT INTO {self.db.own('sql_epochs')} "
                "(sink_key, epoch, committed_at, rows_written) VALUES (:k, :e, :t, :r)"
            ),
            {"k": self.key, "e": epoch, "t": time.time(), "r": committable["rows"]},
        )

    def _finish_held(self, epoch: int, committable: dict[str, Any]) -> bool:
        """Commit the transaction ``pre_commit`` held; False when it is gone (the caller
        then commits the epoch anew: idempotent, by the epoch's row)."""
        from sqlalchemy import exc as sa_exc

        conn, tx = self._held.pop(epoch)
        try:
            fault_point("mid_commit", site="held")
            self._epoch_row(conn, epoch, committable)
            names = [n for n, _ in self.db.staging_tables(conn, self.key, epoch)]
            if set(names) - set(committable["tables"]):  # another attempt's: a zombie may
                self._end_other_holds(epoch)  # hold them, and block the drops
            self._drop(conn, epoch, names)
            tx.commit()
            return True
        except sa_exc.DBAPIError as exc:
            log.info(
                "sql sink %s epoch %d: the transaction held since phase 1 is gone (%s); "
                "committing the epoch anew",
                self.sink_id,
                epoch,
                str(getattr(exc, "orig", exc)).strip().splitlines()[0],
            )
            try:
                tx.rollback()
            except Exception:
                pass
            return False
        finally:
            if not tx.is_active:
                conn.close()

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

    def _committed(self, conn: Any, epoch: int) -> bool:
        """Whether the epoch's row is in ``sql_epochs`` (its commit is done)."""
        from sqlalchemy import text

        row = conn.execute(
            text(f"SELECT 1 FROM {self.db.own('sql_epochs')} WHERE sink_key = :k AND epoch = :e"),
            {"k": self.key, "e": epoch},
        ).first()
        return row is not None

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

    # -- the marker ----------------------------------------------------------------------
    def read_marker(self) -> dict[str, Any] | None:
        from sqlalchemy import text

        db = self.db
        try:
            with db.engine.connect() as conn:
                raw = conn.execute(
                    text(f"SELECT marker FROM {db.own('sql_markers')} WHERE sink_key = :k"),
                    {"k": self.key},
                ).scalar()
                last = conn.execute(
                    text(f"SELECT MAX(epoch) FROM {db.own('sql_epochs')} WHERE sink_key = :k"),
                    {"k": self.key},
                ).scalar()
        except Exception as exc:
            raise db.error("cannot read the sink's marker", exc) from None
        if raw is None and last is None:
            return None
        marker: dict[str, Any] = dict(json.loads(raw)) if raw is not None else {}
        marker["last_epoch"] = int(last) if last is not None else -1
        return marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        from sqlalchemy import text

        raw = json.dumps({k: v for k, v in marker.items() if k != "last_epoch"}, sort_keys=True)
        db = self.db
        try:
            with db.engine.begin() as conn:
                conn.execute(
                    text(f"DELETE FROM {db.own('sql_markers')} WHERE sink_key = :k"),
                    {"k": self.key},
                )
                conn.execute(
                    text(f"INSERT INTO {db.own('sql_markers')} (sink_key, marker) VALUES (:k, :m)"),
                    {"k": self.key, "m": raw},
                )
        except Exception as exc:
            raise db.error("cannot write the sink's marker", exc) from None

    def retire_records(self, dry_run: bool) -> list[str]:
        """``eosink retire``: the sink's rows of ``sql_epochs`` (its marker row stays: the
        retirement's)."""
        from sqlalchemy import text

        db = self.db
        table = db.own("sql_epochs")
        try:
            with db.engine.begin() as conn:
                n = int(
                    conn.execute(
                        text(f"SELECT COUNT(*) FROM {table} WHERE sink_key = :k"), {"k": self.key}
                    ).scalar()
                    or 0
                )
                if n and not dry_run:
                    conn.execute(text(f"DELETE FROM {table} WHERE sink_key = :k"), {"k": self.key})
        except Exception as exc:
            raise db.error("cannot delete the sink's rows of sql_epochs", exc) from None
        return [f"{n} row(s) of {table} (which epochs were applied)"] if n else []

    def close(self) -> None:
        for epoch in list(self._held):
            self._release(epoch)
        self.db.close()


def make_coordinator(opts: SqlSinkOptions, sink_id: str) -> SqlCoordinator:
    return SqlCoordinator(opts, sink_id)
