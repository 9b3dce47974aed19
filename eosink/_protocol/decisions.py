"""The epoch a run writes: a batch run's (explicit or the next free one) and a stream's
micro-batch, with recovery applied first."""

from __future__ import annotations

import logging

from .._metastore import (
    BATCH,
    BATCH_AUTO,
    BATCH_ORIGINS,
    COMMITTED,
    PENDING,
)
from .._rules import (
    FINISH,
    SKIP,
    WRITE,
    Refusal,
    UnfinishedRun,
    decide_auto_epoch,
    decide_batch_epoch,
    decide_stream_epoch,
)
from ..errors import (
    SinkError,
    SinkIdentityError,
    UnfinishedRunError,
)
from .epoch import Epoch
from .figures import EpochFigures
from .helpers import _known, retired_by_whom
from .recovery import _Recovery

log = logging.getLogger("eosink")


class _Decisions(_Recovery):
    """The epoch a run writes: a batch run's (explicit or the next free one) and a stream's"""

    def batch_epoch(self, epoch: int | None) -> Epoch:
        """The epoch a batch run writes (None: the next free one), recovery applied.

        A skipped epoch (committed before) needs nothing of its own; a crashed run's PENDING
        epoch is committed now (``Epoch.recovered``); else the epoch is to be written. Either
        way recovery runs first (other runs' PENDING epochs committed, leftovers deleted).
        Raises as :meth:`batch_decision`.
        """
        decision, e = self.batch_decision(epoch)
        if decision == FINISH:
            self.recover(first_epoch=e + 1)  # a crashed run's complete epoch: commit it
            rec = self.store.epoch(self.sink_id, e)
            assert rec is not None and rec.status == COMMITTED
            fig = self.figures.get(e) or EpochFigures(e, rec.rows, rec.files, rec.bytes)
            return Epoch(self, e, SKIP, recovered=True, figures=fig)
        # A skip too: a re-run finishes what crashes left (another run's half-made commit).
        self.recover(first_epoch=e)
        return Epoch(self, e, decision)

    def batch_epoch_decided(self, epoch: int) -> Epoch:
        """A batch run's epoch that :meth:`batch_epoch` gave to be written in another process
        of the run, to be prepared and committed here: ``format("eosink")``'s data source
        decides in its ``writer`` (a Python worker of Spark's driver) and commits in its
        ``commit`` (another one). Only the target's journal is imported again (a crashed run's
        PENDING epoch known only beside the target); the decision stands."""
        self.import_target_journal()
        return Epoch(self, epoch, WRITE)

    def stream_epoch(self, epoch: int, *, inline: bool = False) -> Epoch:
        """The epoch ``base + batchId`` of a micro-batch.

        ``inline``: the front end commits inside the micro-batch and recovers at every one
        (``format("eosink")``, whose driver side keeps no state between calls): PENDING
        epochs left by a crash hold complete data and are committed first. A replay of a
        committed epoch is a skip; a crashed run's PENDING epoch is committed now
        (``Epoch.recovered``). Raises as :meth:`stream_decision`.
        """
        if inline:
            pending = self.status_of(epoch) == PENDING
            self.recover(
                first_epoch=epoch + 1 if pending else epoch, keep_staged=frozenset({epoch})
            )
        decision = self.stream_decision(epoch)
        if decision == FINISH:
            return Epoch(self, epoch, SKIP, recovered=True, figures=self.finish(epoch))
        return Epoch(self, epoch, decision)

    def batch_decision(self, epoch: int | None) -> tuple[str, int]:
        """What a batch run does with ``epoch`` (None: the next free one).

        An explicit epoch is skipped only when *that* epoch is known committed by a batch
        run with that explicit epoch; an epoch never written is written, also below the newest
        one (a backfill). Without an epoch the run gets the next free one, unless an earlier
        run without epoch crashed with its data complete: that one is committed and this run
        refused (:class:`UnfinishedRunError`), since it may repeat it.

        Raises:
            SinkIdentityError: the epoch belongs to a streaming query of this sink or to a
                run without epoch, or eosink cannot tell whether it was committed.
            UnfinishedRunError: no epoch given, and a run without epoch crashed with its
                data complete (now committed).
        """
        sid = self.sink_id
        self.import_target_journal()
        if epoch is None:
            self.lineage = BATCH_AUTO
            rows = {r.epoch: r for r in self.store.epochs(sid)}
            target = self.target_journal()
            auto = decide_auto_epoch(
                [_known(r) for r in rows.values()],
                target.unreported() if target else (),
                self.store.max_epoch(sid),
            )
            if isinstance(auto, UnfinishedRun):
                self.recover(first_epoch=0)  # a batch run commits every PENDING batch epoch
                for e in sorted({*auto.in_store, *auto.elsewhere}):
                    self._report(e, in_store=e in auto.in_store)  # a crash before: reported again
                done = ", ".join(
                    [f"epoch {e} ({rows[e].rows} rows)" for e in auto.in_store]
                    + [f"epoch {e}" for e in auto.elsewhere]
                )
                raise UnfinishedRunError(
                    f"sink {sid!r}: an earlier run without epoch= crashed after its data was "
                    f"complete; eosink has now committed it: {done}. This run wrote nothing, "
                    "because eosink cannot tell whether it repeats that run: if it does, you "
                    "are done; if it brings new data, run it again. Pass epoch= (e.g. the "
                    "date of the data) to make re-runs safe"
                )
            return auto
        self.lineage = BATCH
        r = self.store.epoch(sid, epoch)
        rec = _known(r) if r is not None else None
        was, high, retired = None, -1, None
        if rec is None:
            retired = self.retired_high()
            target = self.target_journal()
            was = target.committed_origin(epoch) if target else None
            if was is None:
                high = self.store.stream_high(sid)
        decision = decide_batch_epoch(epoch, rec, was, high, retired)
        if isinstance(decision, Refusal):
            raise self._batch_epoch_refused(decision, epoch)
        return decision

    def _batch_epoch_refused(self, refusal: Refusal, epoch: int) -> SinkIdentityError:
        sid = self.sink_id
        if refusal.reason == "auto-epoch":
            return SinkIdentityError(
                f"epoch {epoch} of sink {sid!r} was given to an earlier run without epoch= "
                "(the next free epoch then), so it cannot tell whether this run repeats "
                f"it. Pick an unused epoch (above {self.store.max_epoch(sid)} is always "
                "free), and keep either explicit or automatic epochs on one sink"
            )
        if refusal.reason == "stream-epoch":
            return SinkIdentityError(
                f"epoch {epoch} of sink {sid!r} was written by a streaming query of this "
                "sink; a batch run must not reuse it. Pick an epoch above "
                f"{self.store.stream_high(sid)}, or leave epoch unset (the next free one)"
            )
        if refusal.reason == "auto-epoch-at-target":
            return SinkIdentityError(
                f"epoch {epoch} of sink {sid!r} was given to an earlier run without epoch= "
                "(the target's batch journal says so), so eosink cannot tell whether this run "
                f"repeats it. Pick an unused epoch (above {self.store.max_epoch(sid)} is always "
                "free), and keep either explicit or automatic epochs on one sink"
            )
        if refusal.reason == "retired-epoch":
            sink = self.store.sink(sid)
            assert sink is not None and sink.retired_high is not None
            return SinkIdentityError(
                f"epoch {epoch} of sink {sid!r} belongs to the sink retired by `eosink retire` "
                f"({retired_by_whom(sink)}) with epochs up to {sink.retired_high}: its target "
                "may still hold it, so a run under this sink_id must not reuse it. Pick an "
                f"epoch above {sink.retired_high}, or leave epoch unset (the next free one)"
            )
        assert refusal.reason == "unknown-below-stream-high", refusal
        high = self.store.stream_high(sid)
        return SinkIdentityError(
            f"sink {sid!r} has no record of epoch {epoch}, and epochs up to {high} were "
            "written by streaming queries or are known only as committed (garbage-collected "
            "or taken over from the target): eosink cannot tell whether this epoch is one "
            "of them. If this run repeats one that may have committed (a job re-run on "
            "another machine, with another meta store), do not give it another epoch, which "
            "would write its rows again: run it with the first run's meta store, or share "
            "one (PostgreSQL) between the drivers. If its data is new, pick an epoch above "
            f"{high}, or leave epoch unset (the next free one)"
        )

    def run_returned(self, epoch: int) -> None:
        """A batch run returns to its caller with ``epoch`` committed: a run without
        ``epoch=`` is reported (its re-run is new data from now on)."""
        if self.lineage == BATCH_AUTO:
            self._report(epoch)

    def _report(self, epoch: int, *, in_store: bool = True) -> None:
        """Epoch ``epoch`` of a run without ``epoch=`` is reported: ``batch-auto`` again in
        the store (``in_store``: its row is there) and in the target's journal."""
        if in_store:
            self.store.set_origin(self.sink_id, self.generation, epoch, BATCH_AUTO)
        target = self.target_journal()
        if target is not None:
            target.mark_reported(epoch)

    def stream_decision(self, epoch: int) -> str:
        """What a streaming run does with ``epoch`` (``base + batchId``).

        Raises:
            SinkIdentityError: another run (a batch job, another checkpoint) wrote this epoch.
            FencedError: a newer coordinator took over.
        """
        r, sink = self.store.epoch_and_sink(self.sink_id, epoch)
        rec = _known(r) if r is not None else None
        gc_floor, journal_origin = None, None
        if rec is None:
            gc_floor = sink.gc_floor if sink is not None else None
            if gc_floor is not None and epoch <= gc_floor and self.journal is not None:
                # Committed, its row garbage-collected (or known from the target's marker):
                # a replay of this stream's own epoch keeps its entry in the journal (the
                # newest committed one stays); without it, the epoch is another run's.
                journal_origin = self.own_journal_epochs().get(epoch)
        d = decide_stream_epoch(
            epoch,
            self.lineage,
            rec,
            gc_floor,
            journal_origin,
            has_journal=self.journal is not None,
        )
        if isinstance(d, Refusal) and d.reason == "other-run-epoch":
            assert r is not None
            raise SinkIdentityError(
                f"epoch {epoch} of sink {self.sink_id!r} was written by another run "
                f"({'a batch job' if r.origin in BATCH_ORIGINS else 'another checkpoint'}) "
                "while this query was running. Restart the query: eosink then moves its "
                "epochs above every used one"
            )
        if isinstance(d, Refusal):
            assert d.reason == "other-run-gc-epoch", d
            raise SinkIdentityError(
                f"epoch {epoch} of sink {self.sink_id!r} was committed by another run "
                "(its record is garbage-collected) while this query's epochs were "
                "below it. Restart the query: eosink then moves its epochs above "
                "every used one"
            )
        decision: str = d[0]
        if decision == "abort-then-write":
            assert r is not None
            if not self._finish_aborted(r):
                raise SinkError(
                    f"sink {self.sink_id} epoch {epoch}: the {self.plugin.name!r} plugin's abort "
                    "of this epoch's earlier attempt raised (logged above; a plugin contract "
                    "violation), so it cannot be written again: nothing of it was written. "
                    "Fix what the abort needs and restart; it is retried first"
                )
            decision = WRITE
            sink = None  # the abort changed state: check fencing anew
        # Read first, check fencing second: a skip decided on state that a newer
        # coordinator could have changed is never acted on. (The sink's row was read after
        # the epoch's, in the same transaction: its generation is that check.)
        self.assert_live(sink)
        return decision
