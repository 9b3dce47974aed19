"""Phase 1 (``pre_commit``, persisted PENDING) and phase 2 (``commit``, retried while the one
transient-error rule says so, then COMMITTED), and discarding what was staged."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .. import _metrics
from .._journal import Entry, record_all
from .._metastore import (
    BATCH_AUTO,
    BATCH_AUTO_UNREPORTED,
    BATCH_ORIGINS,
    COMMITTED,
    PENDING,
)
from .._rules import after_commit_attempt
from .._spec import EpochSpec
from .._transient import classify_error
from ..errors import (
    CommitFailedError,
    FencedError,
    SinkError,
)
from ..faults import fault_point
from ..sink import (
    CommitOutcome,
    Prepared,
)
from .figures import FIGURES_KEPT, EpochFigures
from .helpers import _committable, _keep_newest
from .state import _State

log = logging.getLogger("eosink")


class _Live:
    """The default of :meth:`_Phases.commit_epoch`'s ``spec``: the epoch this run staged."""


LIVE = _Live()


class _Phases(_State):
    """Phase 1 (``pre_commit``, persisted PENDING) and phase 2 (``commit``, retried while the one"""

    def finish(self, epoch: int) -> EpochFigures:
        """Commit ``epoch`` from its PENDING row (a crashed run's complete data)."""
        rec = self.store.epoch(self.sink_id, epoch)
        assert rec is not None and rec.status == PENDING and rec.committable is not None
        log.info("sink %s epoch %d: finishing the commit of a crashed run", self.sink_id, epoch)
        c = _committable(self.plugin, self.sink_id, rec)
        spec = self.spec_of(rec.spec, epoch)
        _metrics.epoch_pending(self.sink_id, self.plugin.name, epoch, rec.created_at)
        fig = EpochFigures(
            rec.epoch,
            rec.rows,
            rec.files,
            rec.bytes,
            batch_end_at=rec.batch_end_at or 0.0,
            pre_commit_ms=rec.pre_commit_ms or 0.0,
        )
        self.commit_epoch(epoch, c, fig, spec)
        return fig

    def _discard_refused(self, epoch: int) -> None:
        log.info(
            "sink %s epoch %d: phase 1 refused the epoch; deleting what its writers staged",
            self.sink_id,
            epoch,
        )
        try:
            self.discard(epoch)
        except Exception:
            log.warning(
                "sink %s epoch %d: could not delete the staged data now; the next start does",
                self.sink_id,
                epoch,
                exc_info=True,
            )

    def discard(self, epoch: int) -> None:
        """Delete what was staged for ``epoch`` (no committable): failed writers, a skip."""
        self._abort(epoch, None)

    def _abort(self, epoch: int, committable: Any, spec: EpochSpec | None = None) -> bool:
        """Call the plugin's abort; False (row stays ABORTED, retried next start) if it raised."""
        self.assert_live()
        try:
            if self.caps.epoch_spec:
                self.coordinator.abort(epoch, committable, spec=spec)  # type: ignore[call-arg]
            else:
                self.coordinator.abort(epoch, committable)
            return True
        except Exception:
            log.exception(
                "sink %s: abort of epoch %d raised (a plugin contract violation); "
                "it is retried on the next start",
                self.sink_id,
                epoch,
            )
            return False

    def is_committed(self, epoch: int) -> bool:
        """True when ``epoch`` is already visible (a replay): its new output is discarded."""
        rec = self.store.epoch(self.sink_id, epoch)
        if rec is not None:
            return rec.status == COMMITTED
        sink = self.store.sink(self.sink_id)
        # Committed rows older than the GC window are gone; the GC floor remembers.
        return sink is not None and epoch <= sink.gc_floor

    def status_of(self, epoch: int) -> str | None:
        rec = self.store.epoch(self.sink_id, epoch)
        return None if rec is None else rec.status

    def pre_commit(
        self,
        epoch: int,
        results: Sequence[Any],
        *,
        rows: int,
        write_s: float,
        writer: str = "python",
        schema: pa.Schema | None = None,
    ) -> tuple[Any, EpochFigures]:
        """Phase 1: build the committable and persist PENDING, with the epoch's spec (the
        options of this run, ``schema``)."""
        fault_point("after_write_results")
        t0 = time.perf_counter()
        try:
            prepared = self.coordinator.pre_commit(epoch, results)
            if not isinstance(prepared, Prepared):
                raise SinkError(
                    f"sink {self.sink_id}: the {self.plugin.name!r} plugin's pre_commit "
                    f"returned a {type(prepared).__name__}, not eosink.Prepared(committable, "
                    "files=, bytes=) (the plugin interface of eosink 0.1.0; see docs/plugins.md, "
                    '"Upgrading a plugin written for a pre-release interface")'
                )
            committable = prepared.committable
            files, nbytes = prepared.files, prepared.bytes
            data = self.plugin.committable_codec.encode(committable)
            spec, spec_text = self.epoch_spec(schema)
        except Exception:
            # Refused in phase 1 (a check of the plugin's, a codec error): nothing is
            # PENDING, so the epoch's staged data will never have a committable. Delete it
            # now rather than at the next start (rule 4).
            self._discard_refused(epoch)
            raise
        fault_point("after_pre_commit")
        batch_end = time.time()
        pre_ms = (time.perf_counter() - t0) * 1000
        # Before the PENDING row (so before Spark's checkpoint): a driver on another machine
        # finishes the epoch from the journal alone, a stream's in its checkpoint, a batch
        # run's beside the target. (No fence check here: the batch's decision made it; a
        # zombie's entry loses to a newer generation's entry of the same epoch.)
        batch = self.lineage in BATCH_ORIGINS
        # A run without epoch= is unreported until it returns to its caller (run_returned):
        # crashed at any point from here, its re-run is refused (UnfinishedRunError).
        origin = BATCH_AUTO_UNREPORTED if self.lineage == BATCH_AUTO else self.lineage
        target = self.target_journal()
        journals = [target] if batch else [self.journal, target]
        generation = self.generation if batch or self.journal is None else self.journal.generation
        assert generation is not None
        entry = Entry(
            epoch=epoch,
            generation=generation,
            committable=data,
            codec_version=self.plugin.committable_codec.version,
            rows=rows,
            files=files,
            bytes=nbytes,
            batch_end_at=batch_end,
            pre_commit_ms=pre_ms,
            origin=origin,
            spec=spec_text,
        )
        record_all([j for j in journals if j is not None], entry)
        self.store.persist_pending(
            self.sink_id,
            self.generation,
            epoch,
            data,
            self.plugin.committable_codec.version,
            rows=rows,
            files=files,
            nbytes=nbytes,
            batch_end_at=batch_end,
            pre_commit_ms=pre_ms,
            origin=origin,
            spec=spec_text,
        )
        _keep_newest(
            self._staged_specs, epoch, spec, FIGURES_KEPT
        )  # what commit_epoch hands the plugin
        _metrics.epoch_pending(self.sink_id, self.plugin.name, epoch)
        fig = EpochFigures(
            epoch,
            rows,
            files,
            nbytes,
            write_s=write_s,
            pre_commit_ms=pre_ms,
            persist_ms=(time.perf_counter() - t0) * 1000 - pre_ms,
            batch_end_at=batch_end,
            held_rows=prepared.held_rows,
            held_bytes=prepared.held_bytes,
            writer=writer,
        )
        self._keep_figures(epoch, fig)
        log.debug(
            "sink %s epoch %d: PENDING (rows=%d files=%d bytes=%d write=%.3fs (%s) "
            "pre_commit=%.1fms persist=%.1fms%s)",
            self.sink_id,
            epoch,
            rows,
            files,
            nbytes,
            write_s,
            writer,
            fig.pre_commit_ms,
            fig.persist_ms,
            f" held in open files: rows={prepared.held_rows} bytes={prepared.held_bytes}"
            if prepared.held_rows or prepared.held_bytes
            else "",
        )
        fault_point("after_persist")
        return committable, fig

    def _keep_figures(self, epoch: int, fig: EpochFigures) -> None:
        """Remember ``fig`` as ``epoch``'s figures; only the newest :data:`FIGURES_KEPT` epochs'
        are kept (a stream runs for months: its driver's memory must not grow per epoch)."""
        _keep_newest(self.figures, epoch, fig, FIGURES_KEPT)

    def _attempt_commit(
        self, epoch: int, committable: Any, spec: EpochSpec | None = None
    ) -> CommitOutcome:
        """One call of the plugin's ``commit``, its outcome explicit: what it returned (None,
        or a value that is no :class:`CommitOutcome`, as plugins written before outcomes
        return: ``done``), or what it raised (``retry_later`` when the one transient-error
        rule calls it transient: ``commit`` is idempotent by contract, so whoever raised
        it, it is retried; else ``failed``). A :class:`FencedError` propagates."""
        try:
            if self.caps.epoch_spec:
                got = self.coordinator.commit(epoch, committable, spec=spec)  # type: ignore[call-arg]
            else:
                got = self.coordinator.commit(epoch, committable)
        except FencedError:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if classify_error(exc).transient:
                return CommitOutcome("retry_later", reason, exc)
            return CommitOutcome("failed", reason, exc)
        return got if isinstance(got, CommitOutcome) else CommitOutcome.done()

    def _commit_error(self, epoch: int, outcome: CommitOutcome) -> BaseException:
        """The error a commit that failed for good raises: the plugin's own, or one that
        says the outcome it returned."""
        if outcome.error is not None:
            return outcome.error
        what = f"sink {self.sink_id} epoch {epoch}"
        if outcome.kind == "retry_later":
            return CommitFailedError(
                f"{what}: commit still not possible after {self.commit_retry_max_s:g}s of "
                f"retries: {outcome.reason}"
            )
        return SinkError(f"{what}: commit failed for good: {outcome.reason}")

    def commit_epoch(
        self,
        epoch: int,
        committable: Any,
        fig: EpochFigures | None = None,
        spec: EpochSpec | _Live | None = LIVE,
    ) -> None:
        """Phase 2: commit (retried with backoff while transient) and mark COMMITTED.

        ``spec`` is what the epoch was staged with (None: persisted without one); by default
        the one this runtime's :meth:`pre_commit` persisted for ``epoch``."""
        if isinstance(spec, _Live):
            spec = self._staged_specs.pop(epoch, None)
        fig = fig or self.figures.get(epoch) or EpochFigures(epoch)
        fault_point("before_commit")
        self.assert_live()
        t0 = time.perf_counter()
        delay = 0.05
        first_failure: float | None = None
        while True:
            outcome = self._attempt_commit(epoch, committable, spec)
            now = time.monotonic()
            step = after_commit_attempt(outcome.kind, first_failure, now, self.commit_retry_max_s)
            if step == "committed":
                break
            first_failure = now if first_failure is None else first_failure
            final = step == "fail"
            self.store.record_error(
                self.sink_id,
                f"epoch {epoch}: commit failed{' for good' if final else ' (retried)'}: "
                f"{outcome.reason}",
            )
            if final:
                raise self._commit_error(epoch, outcome)
            _metrics.commit_retried(self.sink_id, self.plugin.name, outcome.error)
            log.warning(
                "sink %s epoch %d: commit failed (%s); retrying in %.2fs",
                self.sink_id,
                epoch,
                outcome.reason,
                delay,
            )
            time.sleep(delay * (1 + random.random() * 0.2))
            delay = min(delay * 2, 5.0)
            # A retry may start over with the target (e.g. fence a Kafka transactional id):
            # never after another coordinator took the sink over.
            self.assert_live()
        if outcome.kind == "already_committed":
            log.info(
                "sink %s epoch %d: already in the target%s (a commit replayed after a crash); "
                "marking it COMMITTED",
                self.sink_id,
                epoch,
                f" ({outcome.reason})" if outcome.reason else "",
            )
        fault_point("after_commit")
        fig.commit_ms = (time.perf_counter() - t0) * 1000
        origin = self.store.mark_committed(
            self.sink_id, self.generation, epoch, commit_ms=fig.commit_ms
        )
        fig.committed_at = time.time()
        self._keep_figures(epoch, fig)
        _metrics.epoch_ended(self.sink_id, self.plugin.name, epoch, _metrics.COMMITTED, figures=fig)
        fault_point("after_mark_committed")
        target = self.target_journal()
        if target is not None:
            if origin in BATCH_ORIGINS or origin not in (None, self.lineage):
                # A batch epoch, or another stream's (rule 7): that stream's journal may lack
                # its entry, and a driver of it that lost the store asks here.
                target.mark_committed(epoch, origin)
            else:
                try:  # a leftover entry is re-committed idempotently, never lost
                    target.forget(epoch)
                except Exception:
                    log.warning(
                        "sink %s: cannot delete epoch %d's entry in the target's journal",
                        self.sink_id,
                        epoch,
                        exc_info=True,
                    )
        # Only this stream's own epochs: committing another run's epoch (recovery, rule 7)
        # says nothing of this stream's entries (one may be an epoch committed ahead of the
        # checkpoint, which a restart on a lost store needs).
        if self.journal is not None and origin in (None, self.lineage):
            try:  # the newest committed epoch's entry stays: older ones are committed
                self.journal.forget_before(epoch)
            except Exception:  # a leftover entry is re-committed idempotently, never lost
                log.warning(
                    "sink %s: cannot delete journal entries below epoch %d in the checkpoint",
                    self.sink_id,
                    epoch,
                    exc_info=True,
                )
        log.info(
            "sink %s epoch %d: COMMITTED (rows=%d files=%d commit=%.1fms visibility_lag=%.3fs)",
            self.sink_id,
            epoch,
            fig.rows,
            fig.files,
            fig.commit_ms,
            fig.visibility_lag_s,
        )
        from ..registry import plugin_manager

        try:
            plugin_manager().hook.eosink_epoch_committed(
                sink_id=self.sink_id, epoch=epoch, figures=fig.as_dict()
            )
        except Exception:
            # The epoch is committed: a listener's failure must never undo or stop that.
            log.exception(
                "sink %s epoch %d: an eosink_epoch_committed hook raised (ignored; the epoch "
                "is committed)",
                self.sink_id,
                epoch,
            )
        self._since_gc += 1
        if self._since_gc >= self.gc_every:
            self._since_gc = 0
            n = self.store.gc(self.sink_id, self.generation, self.gc_keep)
            if n:
                log.debug("sink %s: garbage-collected %d committed epochs", self.sink_id, n)
