"""Phase 1's trial of an epoch's statements: on SQLite run and rolled back; on PostgreSQL run in
a transaction *held* open for the commit (named ``eosink-hold <sink key> <epoch>`` in
``pg_stat_activity``, idle at most :data:`HOLD_S` seconds), and the ending of held
transactions other (crashed or paused) coordinators left, whose locks would block this one.
"""

from __future__ import annotations

import logging
from typing import Any

from eosink import SinkError, fault_point

from .marker import EpochRecords
from .statements import Statements

__all__ = ["HOLD_S", "HeldTransactions", "hold_name"]

log = logging.getLogger("eosink.sql")

HOLD_S = 120
"""How long PostgreSQL keeps a held phase-1 transaction that is idle (its
``idle_in_transaction_session_timeout``): past it the server ends the transaction and the
commit moves the rows again. It bounds how long a paused (zombie) driver's locks can delay
another driver's recovery."""


def hold_name(key: str, epoch: int) -> str:
    """The ``application_name`` of the session that holds ``epoch``'s phase-1 transaction on
    PostgreSQL (``key``: the sink's :func:`~eosink.util.sink_key`)."""
    return f"eosink-hold {key} {epoch}"


class HeldTransactions(Statements, EpochRecords):
    """The coordinator's part that tries an epoch's statements in phase 1 and, on PostgreSQL,
    holds their transaction for the commit."""

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
