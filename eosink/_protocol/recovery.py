"""Recovery: what a start does with the PENDING and ABORTED epochs and staged data it finds
(rules 1-4 and 7 of docs/concepts.md, decided in :mod:`eosink._rules`)."""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from .. import _metrics
from .._metastore import (
    ABORTED,
    BATCH_AUTO_UNREPORTED,
    PENDING,
)
from .._rules import (
    PendingEpoch,
    aborts_to_finish,
    is_own_epoch,
    plan_pending,
    sweep_staged,
)
from ..faults import fault_point
from ..sink import (
    StagedEpochs,
)
from .helpers import _committable, _known
from .phases import _Phases

log = logging.getLogger("eosink")


class _Recovery(_Phases):
    """Recovery: what a start does with the PENDING and ABORTED epochs and staged data it finds"""

    def recover(
        self,
        first_epoch: int,
        keep_staged: frozenset[int] = frozenset(),
        *,
        hold: bool = False,
    ) -> None:
        """Apply the recovery rules (docs/concepts.md) before epoch ``first_epoch`` is
        pre-committed.

        PENDING epochs of this stream's lineage below ``first_epoch`` are checkpointed: commit
        them (rule 1). Those at or above it will be written again: abort them (rule 2).
        PENDING epochs of other runs (a crashed batch job, another checkpoint) hold complete
        data: commit them (rule 7; a replay of theirs is then skipped, rule 5). A batch run
        has no lineage of its own: every PENDING batch epoch is a crashed run's complete one,
        whatever epoch this run writes (a backfill below it must not abort it). Then finish
        every ABORTED epoch (rule 3) and discard data staged for epochs that have no
        committable (rule 4; except ``keep_staged``: epochs being written right now).

        ``hold``: a stream's start, before Spark fixed the batch it runs first. The stream's
        epochs at or above ``first_epoch`` are left alone (rules 2 and 4 for them wait for
        :meth:`resume_stream` at the first micro-batch): an older driver of the query, fenced
        but not yet stopped, may still get Spark to checkpoint one of them, and its data must
        then still be there.

        A crashed run's epoch without ``epoch=`` committed here by another run is first
        re-tagged ``batch-auto-unreported``: the next run without ``epoch=`` still refuses
        (:class:`UnfinishedRunError`), since only it can tell the user that a re-run of the
        crashed job would repeat it.
        """
        t0 = time.perf_counter()
        self.import_target_journal()  # PENDING epochs only the target's journal knows
        pending = [
            PendingEpoch(r.epoch, r.origin) for r in self.store.epochs(self.sink_id, (PENDING,))
        ]
        origin = {p.epoch: p.origin for p in pending}
        for step in plan_pending(self.lineage, pending, first_epoch, hold=hold):
            if step.kind == "retag":
                # Tagged before the commit: a crash in between leaves it PENDING and tagged.
                self.store.set_origin(
                    self.sink_id, self.generation, step.epoch, BATCH_AUTO_UNREPORTED
                )
            elif step.kind == "defer":
                log.info(
                    "sink %s: epoch %d is PENDING and not checkpointed; decided at the first "
                    "micro-batch",
                    self.sink_id,
                    step.epoch,
                )
            elif step.kind == "commit":
                log.info(
                    "sink %s: recovery commits %s epoch %d",
                    self.sink_id,
                    "checkpointed"
                    if is_own_epoch(self.lineage, origin[step.epoch])
                    else "the complete PENDING",
                    step.epoch,
                )
                self.finish(step.epoch)
            else:
                log.info(
                    "sink %s: recovery aborts epoch %d (not checkpointed; it will be written "
                    "again)",
                    self.sink_id,
                    step.epoch,
                )
                self.store.mark_aborted(self.sink_id, self.generation, step.epoch)
                _metrics.epoch_ended(self.sink_id, self.plugin.name, step.epoch, _metrics.ABORTED)
        aborted = {r.epoch: r for r in self.store.epochs(self.sink_id, (ABORTED,))}
        known = [_known(r) for r in aborted.values()]
        for e in aborts_to_finish(known):
            self._finish_aborted(aborted[e])
        if self.caps.staged_epochs:
            live = {r.epoch for r in self.store.epochs(self.sink_id, (PENDING,))} | keep_staged
            staged = cast(StagedEpochs, self.coordinator).staged_epochs()
            for e in sweep_staged(staged, live, self.is_committed, first_epoch, hold=hold):
                log.info("sink %s: discarding data staged for epoch %d", self.sink_id, e)
                self._abort(e, None)
        log.info(
            "sink %s: recovery done before epoch %d in %.1f ms",
            self.sink_id,
            first_epoch,
            (time.perf_counter() - t0) * 1000,
        )

    def _finish_aborted(self, rec: Any) -> bool:
        """Abort an ABORTED epoch's staged data and delete its row; False if the abort raised."""
        c = _committable(self.plugin, self.sink_id, rec) if rec.committable is not None else None
        spec = self.spec_of(rec.spec, rec.epoch) if c is not None else None
        fault_point("recovery_before_abort")
        if self._abort(rec.epoch, c, spec):
            target = self.target_journal()
            if target is not None:
                # Before the row goes: an entry left behind would be taken for a PENDING
                # epoch whose staged data is gone.
                target.forget(rec.epoch)
            fault_point("recovery_before_finish_abort")
            self.store.finish_abort(self.sink_id, self.generation, rec.epoch)
            log.info("sink %s epoch %d: ABORTED, staged data deleted", self.sink_id, rec.epoch)
            return True
        return False
