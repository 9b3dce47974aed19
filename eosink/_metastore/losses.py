"""The meta store's known losses: epochs given up by an operator (``eosink abandon``) and
open files dropped (``eosink recover --drop-lost-open-files``)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import (
    Connection,
    insert,
    select,
    update,
)

from ..errors import InvalidTransitionError
from .base import StoreBase
from .models import ABORTED, COMMITTED, PENDING, EpochRow, LossRow, SinkRow
from .records import LossRecord


class LossOps(StoreBase):
    """The known losses: epochs given up by an operator (``eosink abandon``) and"""

    def abandon(self, sink_id: str, epoch: int, reason: str, by: str) -> LossRecord:
        """Give up a PENDING (or ABORTED) epoch for good, as an operator's decision: in one
        transaction the sink's generation is bumped (every coordinator is fenced), the
        epoch is recorded as a known loss (:meth:`losses`) and marked ABORTED, so that the
        next run deletes its staged data and never publishes it.

        Raises:
            InvalidTransitionError: the epoch is COMMITTED or unknown to this store.
        """

        def run(_: int) -> LossRecord:
            now = time.time()
            with self._tx() as conn:
                row = conn.execute(
                    select(EpochRow.__table__).where(
                        EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                    )
                ).one_or_none()
                if row is None or row.status == COMMITTED:
                    raise InvalidTransitionError(
                        f"sink {sink_id!r} epoch {epoch}: "
                        + ("is COMMITTED" if row is not None else "unknown to this meta store")
                        + "; only a PENDING or ABORTED epoch can be abandoned"
                    )
                known = self._loss_row(conn, sink_id, epoch)
                if known is not None:  # abandoned before (or by a lost answer's attempt)
                    return self._loss(known)
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id)
                    .values(
                        generation=SinkRow.generation + 1,
                        owner=by,
                        updated_at=now,
                        heartbeat_at=None,
                    )
                )
                if row.status == PENDING:
                    conn.execute(
                        update(EpochRow)
                        .where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch)
                        .values(status=ABORTED, updated_at=now)
                    )
                loss = LossRecord(
                    sink_id, epoch, row.rows, row.files, row.bytes, row.origin, reason, by, now
                )
                conn.execute(
                    insert(LossRow).values(
                        sink_id=sink_id,
                        epoch=epoch,
                        rows=loss.rows,
                        files=loss.files,
                        nbytes=loss.bytes,
                        origin=loss.origin,
                        reason=reason,
                        recorded_by=by,
                        recorded_at=now,
                    )
                )
                return loss

        return self._retry(f"abandon epoch {epoch}", run)

    def record_loss(
        self,
        sink_id: str,
        epoch: int,
        *,
        rows: int,
        files: int,
        nbytes: int,
        origin: str,
        reason: str,
        by: str,
    ) -> LossRecord:
        """Record rows of a COMMITTED epoch that an operator gave up after the fact (an open
        rolling file whose staged data was destroyed outside eosink), shown by ``status``
        as a known loss like an abandoned epoch. A second loss of the same epoch is added to
        the first (rows, files and bytes summed, reasons joined)."""

        def run(_: int) -> LossRecord:
            now = time.time()
            with self._tx() as conn:
                known = self._loss_row(conn, sink_id, epoch)
                if known is None:
                    conn.execute(
                        insert(LossRow).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            rows=rows,
                            files=files,
                            nbytes=nbytes,
                            origin=origin,
                            reason=reason,
                            recorded_by=by,
                            recorded_at=now,
                        )
                    )
                else:
                    conn.execute(
                        update(LossRow)
                        .where(LossRow.sink_id == sink_id, LossRow.epoch == epoch)
                        .values(
                            rows=LossRow.rows + rows,
                            files=LossRow.files + files,
                            nbytes=LossRow.nbytes + nbytes,
                            reason=(known.reason + "; " + reason)[:8000],
                            recorded_by=by,
                            recorded_at=now,
                        )
                    )
                row = self._loss_row(conn, sink_id, epoch)
                assert row is not None
                return self._loss(row)

        return self._retry(f"record a loss of epoch {epoch}", run)

    @staticmethod
    def _loss_row(conn: Connection, sink_id: str, epoch: int) -> Any:
        """The ``eosink_loss`` row of an epoch, or None."""
        return conn.execute(
            select(LossRow.__table__).where(LossRow.sink_id == sink_id, LossRow.epoch == epoch)
        ).one_or_none()

    @staticmethod
    def _loss(row: Any) -> LossRecord:
        return LossRecord(
            row.sink_id,
            row.epoch,
            row.rows,
            row.files,
            row.bytes,
            row.origin,
            row.reason,
            row.recorded_by,
            row.recorded_at,
        )

    def losses(self, sink_id: str) -> list[LossRecord]:
        """The epochs of ``sink_id`` abandoned as known losses, in epoch order."""

        def run(_: int) -> list[LossRecord]:
            with self._tx() as conn:
                rows = conn.execute(
                    select(LossRow.__table__)
                    .where(LossRow.sink_id == sink_id)
                    .order_by(LossRow.epoch)
                ).all()
            return [self._loss(r) for r in rows]

        return self._retry("a read", run)
