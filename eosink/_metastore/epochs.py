"""The meta store's two-phase state machine of epochs: PENDING, COMMITTED, ABORTED."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from ..errors import InvalidTransitionError
from . import statements
from .base import StoreBase
from .models import ABORTED, COMMITTED, PENDING, EpochRow, SinkRow
from .records import BATCH_ORIGINS, EpochRecord


class EpochOps(StoreBase):
    """The two-phase state machine of epochs: PENDING, COMMITTED, ABORTED."""

    @staticmethod
    def _record(row: Any) -> EpochRecord:
        return EpochRecord(
            sink_id=row.sink_id,
            epoch=row.epoch,
            status=row.status,
            committable=row.committable,
            codec_version=row.codec_version,
            generation=row.generation,
            rows=row.rows,
            files=row.files,
            bytes=row.bytes,
            batch_end_at=row.batch_end_at,
            pre_commit_ms=row.pre_commit_ms,
            commit_ms=row.commit_ms,
            committed_at=row.committed_at,
            origin=row.origin,
            created_at=row.created_at,
            spec=row.spec,
        )

    def epoch(self, sink_id: str, epoch: int) -> EpochRecord | None:
        def run(_: int) -> EpochRecord | None:
            with self._tx() as conn:
                row = conn.execute(
                    statements.EPOCH, {"b_sid": sink_id, "b_epoch": epoch}
                ).one_or_none()
                return None if row is None else self._record(row)

        return self._retry("a read", run)

    def epochs(
        self,
        sink_id: str,
        statuses: Sequence[str] = (PENDING, COMMITTED, ABORTED),
        limit: int = 0,
    ) -> list[EpochRecord]:
        """Epochs of ``sink_id`` with one of ``statuses``, by epoch (the newest ``limit``)."""
        q = select(EpochRow.__table__).where(
            EpochRow.sink_id == sink_id, EpochRow.status.in_(statuses)
        )
        if limit:
            q = q.order_by(EpochRow.epoch.desc()).limit(limit)
        else:
            q = q.order_by(EpochRow.epoch)

        def run(_: int) -> list[EpochRecord]:
            with self._tx() as conn:
                return [self._record(r) for r in conn.execute(q).all()]

        return sorted(self._retry("a read", run), key=lambda r: r.epoch)

    def persist_pending(
        self,
        sink_id: str,
        generation: int,
        epoch: int,
        committable: bytes,
        codec_version: int,
        *,
        rows: int,
        files: int,
        nbytes: int,
        batch_end_at: float,
        pre_commit_ms: float,
        origin: str | None = None,
        spec: str | None = None,
    ) -> None:
        """(none) -> PENDING. Once this returns, the epoch can be finished from the row alone.

        ``origin`` is ``"batch"`` or the streaming lineage writing the epoch; ``spec`` the
        stored :class:`~eosink.EpochSpec` it was staged with.
        """

        def run(attempt: int) -> None:
            now = time.time()
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                values = {
                    "sink_id": sink_id,
                    "epoch": epoch,
                    "status": PENDING,
                    "committable": committable,
                    "codec_version": codec_version,
                    "generation": generation,
                    "rows": rows,
                    "files": files,
                    "bytes": nbytes,
                    "batch_end_at": batch_end_at,
                    "pre_commit_ms": pre_commit_ms,
                    "origin": origin,
                    "spec": spec,
                    "created_at": now,
                    "updated_at": now,
                }
                if_new = statements.insert_epoch_if_new(conn.dialect.name)
                if if_new is not None:
                    inserted = statements.inserted(conn.execute(if_new, values))
                else:
                    try:
                        with conn.begin_nested():
                            conn.execute(statements.INSERT_EPOCH, values)
                        inserted = True
                    except IntegrityError:
                        inserted = False
                if not inserted:
                    row = conn.execute(
                        statements.EPOCH_STATE, {"b_sid": sink_id, "b_epoch": epoch}
                    ).one_or_none()
                    if (
                        attempt
                        and row is not None
                        and row.status == PENDING
                        and row.generation == generation
                        and bytes(row.committable) == committable
                    ):
                        return  # our earlier attempt committed; its answer was lost
                    raise InvalidTransitionError(
                        f"sink {sink_id!r} epoch {epoch}: "
                        f"{None if row is None else row.status} -> {PENDING} is not allowed"
                    )

        self._retry(f"persist PENDING of epoch {epoch}", run)

    def _transition(
        self,
        conn: Connection,
        sink_id: str,
        epoch: int,
        src: str,
        dst: str,
        attempt: int = 0,
        **values: Any,
    ) -> bool:
        """``src`` -> ``dst``; False when a retried attempt finds ``dst`` already reached."""
        key = {"b_sid": sink_id, "b_epoch": epoch}
        res = conn.execute(
            statements.TRANSITION,
            {**key, "b_src": src, "status": dst, "updated_at": time.time(), **values},
        )
        if res.rowcount != 1:
            cur = conn.execute(statements.EPOCH_STATE, key).scalar_one_or_none()
            if attempt and cur == dst:
                return False
            raise InvalidTransitionError(
                f"sink {sink_id!r} epoch {epoch}: {cur or '(none)'} -> {dst} is not allowed"
            )
        return True

    def mark_committed(
        self, sink_id: str, generation: int, epoch: int, *, commit_ms: float
    ) -> str | None:
        """PENDING -> COMMITTED, and raise the sink's high-water mark. Returns the epoch's
        ``origin`` (the caller's next step depends on it: no second read)."""

        def run(attempt: int) -> str | None:
            key = {"b_sid": sink_id, "b_epoch": epoch}
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                if self._transition(
                    conn,
                    sink_id,
                    epoch,
                    PENDING,
                    COMMITTED,
                    attempt,
                    commit_ms=commit_ms,
                    committed_at=time.time(),
                ):
                    conn.execute(statements.raise_high_water(conn.dialect.name), key)
                origin: str | None = conn.execute(statements.EPOCH_STATE, key).one().origin
                return origin

        return self._retry(f"mark epoch {epoch} COMMITTED", run)

    def mark_aborted(self, sink_id: str, generation: int, epoch: int) -> None:
        """PENDING -> ABORTED."""

        def run(attempt: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                self._transition(conn, sink_id, epoch, PENDING, ABORTED, attempt)

        self._retry(f"mark epoch {epoch} ABORTED", run)

    def finish_abort(self, sink_id: str, generation: int, epoch: int) -> None:
        """ABORTED -> (row deleted), once the plugin's abort cleaned up."""

        def run(attempt: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                res = conn.execute(
                    delete(EpochRow).where(
                        EpochRow.sink_id == sink_id,
                        EpochRow.epoch == epoch,
                        EpochRow.status == ABORTED,
                    )
                )
                if res.rowcount != 1:
                    gone = (
                        conn.execute(
                            select(EpochRow.status).where(
                                EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                            )
                        ).scalar_one_or_none()
                        is None
                    )
                    if attempt and gone:
                        return
                    raise InvalidTransitionError(
                        f"sink {sink_id!r} epoch {epoch}: only an ABORTED epoch can be finished"
                    )

        self._retry(f"finish the abort of epoch {epoch}", run)

    def gc(self, sink_id: str, generation: int, keep_last: int) -> int:
        """Delete COMMITTED rows of streaming epochs older than the newest ``keep_last``.

        Returns how many. The sink's GC floor (the largest deleted epoch) keeps what replay
        detection needs. Rows of batch epochs are never deleted (there is one per batch run,
        and an explicit batch epoch must stay exact).
        """

        def run(_: int) -> int:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                hw = conn.execute(
                    select(SinkRow.high_water).where(SinkRow.sink_id == sink_id)
                ).scalar_one()
                cond = (
                    (EpochRow.sink_id == sink_id)
                    & (EpochRow.status == COMMITTED)
                    & (EpochRow.epoch <= hw - keep_last)
                    & (EpochRow.origin.not_in(BATCH_ORIGINS) | EpochRow.origin.is_(None))
                )
                top = conn.execute(select(func.max(EpochRow.epoch)).where(cond)).scalar()
                if top is None:
                    return 0
                res = conn.execute(delete(EpochRow).where(cond))
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id, SinkRow.gc_floor < top)
                    .values(gc_floor=top)
                )
                return int(res.rowcount or 0)

        return self._retry("garbage collection", run)

    def count_rows(self, sink_id: str) -> int:
        with self._tx() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(EpochRow).where(EpochRow.sink_id == sink_id)
                ).scalar_one()
            )
