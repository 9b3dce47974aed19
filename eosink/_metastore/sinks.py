"""The meta store's operations on a sink's row: acquiring it (fencing), its settings,
heartbeat, rolls and errors."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

from sqlalchemy import (
    Connection,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from . import statements
from .base import StoreBase
from .engine import _greatest
from .models import EpochRow, SinkRow
from .records import BATCH_ORIGINS, SinkRecord

log = logging.getLogger("eosink.metastore")


class SinkOps(StoreBase):
    """The operations on a sink's row: acquiring it (fencing), its settings,"""

    def acquire(
        self,
        sink_id: str,
        plugin: str,
        options_json: str | None = None,
        *,
        note: str | None = None,
    ) -> SinkRecord:
        """Become the live coordinator of ``sink_id``: bump its generation (fencing any other).

        The owner is recorded as ``host:pid``, followed by `` (note)`` when ``note`` is given
        (``format stream``: see :attr:`eosink._protocol.SinkRuntime.micro_batch`)."""
        owner = f"{socket.gethostname()}:{os.getpid()}" + (f" ({note})" if note else "")
        return self._retry("acquire", lambda _: self._acquire(sink_id, plugin, options_json, owner))

    def _acquire(
        self, sink_id: str, plugin: str, options_json: str | None, owner: str
    ) -> SinkRecord:
        now = time.time()
        with self._tx() as conn:
            res = conn.execute(
                update(SinkRow)
                .where(SinkRow.sink_id == sink_id)
                .values(
                    generation=SinkRow.generation + 1,
                    owner=owner,
                    plugin=plugin,
                    options_json=options_json,
                    updated_at=now,
                    heartbeat_at=now,
                )
            )
            if res.rowcount == 0:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(SinkRow).values(
                                sink_id=sink_id,
                                plugin=plugin,
                                generation=1,
                                owner=owner,
                                lineage=None,
                                epoch_base=0,
                                high_water=-1,
                                committed_epochs=0,
                                options_json=options_json,
                                created_at=now,
                                updated_at=now,
                                heartbeat_at=now,
                            )
                        )
                except IntegrityError:  # raced with another driver creating it
                    conn.execute(
                        update(SinkRow)
                        .where(SinkRow.sink_id == sink_id)
                        .values(
                            generation=SinkRow.generation + 1,
                            owner=owner,
                            updated_at=now,
                            heartbeat_at=now,
                        )
                    )
            rec = self._sink(conn, sink_id)
        assert rec is not None
        log.debug("sink %s acquired by %s, generation %d", sink_id, owner, rec.generation)
        return rec

    @staticmethod
    def _sink(conn: Connection, sink_id: str) -> SinkRecord | None:
        row = conn.execute(statements.SINK, {"b_sid": sink_id}).one_or_none()
        if row is None:
            return None
        return SinkRecord(
            sink_id=row.sink_id,
            plugin=row.plugin,
            generation=row.generation,
            owner=row.owner,
            lineage=row.lineage,
            epoch_base=row.epoch_base,
            high_water=row.high_water,
            committed_epochs=row.committed_epochs,
            arrow_schema=row.arrow_schema,
            updated_at=row.updated_at,
            target=row.target,
            gc_floor=row.gc_floor,
            created_at=row.created_at,
            last_error=row.last_error,
            last_error_at=row.last_error_at,
            heartbeat_at=row.heartbeat_at,
            last_roll=json.loads(row.last_roll) if row.last_roll else None,
            retired_high=row.retired_high,
            retired_at=row.retired_at,
            retired_by=row.retired_by,
        )

    def sink(self, sink_id: str) -> SinkRecord | None:
        def run(_: int) -> SinkRecord | None:
            with self._tx() as conn:
                return self._sink(conn, sink_id)

        return self._retry("a read", run)

    def sinks(self) -> list[SinkRecord]:
        with self._tx() as conn:
            ids = conn.execute(select(SinkRow.sink_id).order_by(SinkRow.sink_id)).scalars().all()
            return [r for r in (self._sink(conn, i) for i in ids) if r is not None]

    def _set(self, sink_id: str, generation: int, what: str, **values: Any) -> None:
        def run(_: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                conn.execute(update(SinkRow).where(SinkRow.sink_id == sink_id).values(**values))

        self._retry(what, run)

    def set_origin(self, sink_id: str, generation: int, epoch: int, origin: str) -> None:
        """Re-tag an epoch's ``origin`` (``batch-auto`` and ``batch-auto-unreported``)."""

        def run(_: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                conn.execute(
                    update(EpochRow)
                    .where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch)
                    .values(origin=origin)
                )

        self._retry(f"set epoch {epoch}'s origin", run)

    def set_lineage(self, sink_id: str, generation: int, lineage: str, epoch_base: int) -> None:
        self._set(sink_id, generation, "set_lineage", lineage=lineage, epoch_base=epoch_base)

    def set_schema(self, sink_id: str, generation: int, arrow_schema: bytes) -> None:
        self._set(sink_id, generation, "set_schema", arrow_schema=arrow_schema)

    def set_target(self, sink_id: str, generation: int, target: str) -> None:
        """Bind ``sink_id`` to its target (the core refuses another target later)."""
        self._set(sink_id, generation, "set_target", target=target)

    def adopt(self, sink_id: str, generation: int, *, last_epoch: int) -> None:
        """Take over a sink whose history this store lost: epochs <= ``last_epoch`` are known
        to the target only (treated like garbage-collected committed epochs)."""
        self._set(
            sink_id,
            generation,
            "adopt",
            gc_floor=last_epoch,
            high_water=_greatest(self.engine.dialect.name, SinkRow.high_water, last_epoch),
        )

    def retire(self, sink_id: str, generation: int, *, high: int, by: str) -> SinkRecord:
        """``eosink retire``: in one transaction (fenced by ``generation``, which it bumps:
        every coordinator of the sink is fenced), delete the sink's epochs (its known losses
        stay: a loss is recorded for ever) and keep its row as the record of the retirement:
        no lineage, no schema, no error, epochs up to ``high`` counted as committed
        (:meth:`max_epoch`), ``retired_high``, ``retired_at`` and ``retired_by`` set. Its
        target binding stays."""

        def run(_: int) -> SinkRecord:
            now = time.time()
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                conn.execute(delete(EpochRow).where(EpochRow.sink_id == sink_id))
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id)
                    .values(
                        generation=SinkRow.generation + 1,
                        owner=by,
                        heartbeat_at=None,
                        lineage=None,
                        epoch_base=0,
                        high_water=_greatest(self.engine.dialect.name, SinkRow.high_water, high),
                        gc_floor=high,
                        committed_epochs=0,
                        arrow_schema=None,
                        options_json=None,
                        last_error=None,
                        last_error_at=None,
                        last_roll=None,
                        retired_high=high,
                        retired_at=now,
                        retired_by=by,
                        updated_at=now,
                    )
                )
                rec = self._sink(conn, sink_id)
            assert rec is not None
            return rec

        return self._retry("retire the sink", run)

    def set_retired(self, sink_id: str, generation: int, retirement: dict[str, Any]) -> None:
        """Record a retirement this store learnt from the target's marker (``high``, ``at``,
        ``by``: :meth:`SinkRecord.retirement`), for a store that never knew the sink."""
        self._set(
            sink_id,
            generation,
            "record the retirement",
            retired_high=int(retirement["high"]),
            retired_at=retirement.get("at"),
            retired_by=retirement.get("by"),
        )

    def stream_high(self, sink_id: str) -> int:
        """The largest epoch any streaming run of ``sink_id`` used (-1 if none)."""

        def run(_: int) -> int:
            with self._tx() as conn:
                mx = conn.execute(
                    select(func.max(EpochRow.epoch)).where(
                        EpochRow.sink_id == sink_id,
                        EpochRow.origin.not_in(BATCH_ORIGINS) | EpochRow.origin.is_(None),
                    )
                ).scalar_one_or_none()
                floor = conn.execute(
                    select(SinkRow.gc_floor).where(SinkRow.sink_id == sink_id)
                ).scalar_one_or_none()
            return max(-1 if mx is None else mx, -1 if floor is None else floor)

        return self._retry("a read", run)

    def max_epoch(self, sink_id: str) -> int:
        """The largest epoch this sink ever used (-1 if none)."""

        def run(_: int) -> int:
            with self._tx() as conn:
                hw = conn.execute(
                    select(SinkRow.high_water, SinkRow.gc_floor).where(SinkRow.sink_id == sink_id)
                ).one_or_none()
                mx = conn.execute(
                    select(func.max(EpochRow.epoch)).where(EpochRow.sink_id == sink_id)
                ).scalar_one_or_none()
            marks = [-1] if hw is None else [hw[0], hw[1]]
            return max(*marks, -1 if mx is None else mx)

        return self._retry("a read", run)

    def heartbeat(self, sink_id: str, generation: int, *, stopped: bool = False) -> bool:
        """Say that the owner of ``generation`` still runs (``stopped``: that it stopped
        cleanly: the heartbeat is cleared). One try, not retried, never raises: False when
        the store did not take it or another coordinator owns the sink now."""
        try:
            with self._tx() as conn:
                res = conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id, SinkRow.generation == generation)
                    .values(heartbeat_at=None if stopped else time.time())
                )
                return bool(res.rowcount)
        except Exception:
            log.debug("sink %s: heartbeat not recorded", sink_id, exc_info=True)
            return False

    def record_roll(self, sink_id: str, generation: int, *, files: int, everything: bool) -> None:
        """Note a roll between epochs (``files`` published; ``everything``: every open file).
        Informational, for ``eosink status``; one try, fenced by generation, never raises."""
        note = json.dumps({"at": time.time(), "files": files, "everything": everything})
        try:
            with self._tx() as conn:
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id, SinkRow.generation == generation)
                    .values(last_roll=note)
                )
        except Exception:
            log.debug("sink %s: roll not recorded", sink_id, exc_info=True)

    def record_error(self, sink_id: str, message: str) -> None:
        """Keep ``message`` as the sink's last error (shown by ``eosink status``). Best
        effort, not fenced: a store that cannot take it must not hide the error itself."""
        try:
            with self._tx() as conn:
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id)
                    .values(last_error=message[:4000], last_error_at=time.time())
                )
        except Exception:
            log.debug("sink %s: could not record the last error", sink_id, exc_info=True)
