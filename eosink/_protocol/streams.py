"""A stream's start: its checkpoint's lineage and epoch base, the journal in the
checkpoint, a fresh checkpoint and the rebase above other runs (rules 6, 8 and 9)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from .._journal import Journal
from .._rules import (
    Refusal,
    base_of_fresh_checkpoint,
    journal_entries_to_take,
    move_base_above_other_runs,
    unrecorded_checkpointed,
)
from ..errors import (
    NewCheckpointError,
    SinkIdentityError,
)
from ..faults import fault_point
from .decisions import _Decisions
from .helpers import _known, _span, retired_by_whom

log = logging.getLogger("eosink")


class _Streams(_Decisions):
    """A stream's start: its checkpoint's lineage and epoch base, the journal in the"""

    def open_stream(self, ckpt: Any, new_checkpoint: str, *, inline: bool = False) -> int:
        """Map the checkpoint's batch ids to sink epochs: return the epoch base.

        A checkpoint seen before keeps its lineage (and base), from the meta store or, when
        the store has no record of the sink's streams (a driver on another machine, a lost
        store), from eosink's journal in the checkpoint (:mod:`eosink._journal`), whose
        PENDING entries the store lacks are imported: Spark checkpointed their epochs (all of
        them in ``inline`` mode, where PENDING means complete), so recovery commits them. A
        fresh checkpoint on a sink with history is refused (rule 6) unless
        ``new_checkpoint == "continue"``. Either way this driver claims the journal's next
        generation: every older driver of the query, on any machine, is fenced.

        Raises:
            NewCheckpointError: a fresh checkpoint on a sink with history.
            SinkIdentityError: Spark checkpointed epochs that neither the meta store nor the
                journal holds (a checkpoint of an eosink without the journal, and a lost
                store).
        """
        sid = self.sink_id
        # A crashed batch run's PENDING epoch known only beside the target (another machine's
        # store): its staged data is not leftovers for this stream's recovery to delete.
        self.import_target_journal()
        rec = self.store.sink(sid)
        assert rec is not None
        journal = Journal(ckpt, sid)
        self.inline = inline
        lineage = ckpt.read_lineage()
        kept = journal.state() or {}
        self.after_inline = lineage is not None and kept.get("lineage") == lineage
        self.after_inline = self.after_inline and bool(kept.get("inline"))
        last_batch = ckpt.last_committed_batch()
        nxt = 0 if last_batch is None else last_batch + 1
        if lineage is not None and rec.lineage != lineage:
            # The store knows another stream of the sink, or none: this checkpoint's own
            # journal says which epochs are its (a driver on another machine, another meta
            # store, or another query of the sink ran since on its own checkpoint).
            if kept.get("lineage") == lineage and rec.retired_high is not None and not rec.lineage:
                log.warning(
                    "sink %s was retired by `eosink retire` %s (epochs up to %d) since this "
                    "query last ran on checkpoint %s; it resumes from eosink's journal in the "
                    "checkpoint, with its next epochs above the retired ones",
                    sid,
                    retired_by_whom(rec),
                    rec.retired_high,
                    ckpt.location,
                )
            elif kept.get("lineage") == lineage:
                log.warning(
                    "sink %s: meta store %s has no record of this sink's stream on checkpoint "
                    "%s (a driver on another machine, another meta store, or another query of "
                    "this sink ran since); resuming from eosink's journal in the checkpoint "
                    "(epoch base %d)",
                    sid,
                    self.store.url_redacted,
                    ckpt.location,
                    int(kept["epoch_base"]),
                )
            if kept.get("lineage") == lineage:
                self.store.set_lineage(sid, self.generation, lineage, int(kept["epoch_base"]))
                rec = self.store.sink(sid)
                assert rec is not None
        if lineage is not None and rec.lineage == lineage:
            base = rec.epoch_base
            self.lineage = lineage
            self._attach(journal, base)
            checkpointed = base + nxt - 1
            self._import_journal(sys.maxsize if inline else checkpointed)
            self._check_checkpointed(ckpt, base, checkpointed)
            self.write_marker()
            return base
        last = self.store.max_epoch(sid)
        fresh = base_of_fresh_checkpoint(last, nxt, new_checkpoint)
        if isinstance(fresh, Refusal):
            assert fresh.reason == "fresh-checkpoint", fresh
            retired = (
                f" (sink {sid!r} was retired by `eosink retire` {retired_by_whom(rec)}, with "
                f"epochs up to {rec.retired_high}: its target still holds their rows)"
                if rec.retired_high is not None and last <= rec.retired_high
                else ""
            )
            raise NewCheckpointError(
                f"sink {sid!r} already has epochs up to {last} written by other "
                f"runs{retired}, and checkpoint_location {ckpt.location!r} is new to it. "
                "A fresh checkpoint re-reads the source from its starting offsets, which "
                "would duplicate rows. Restart with the original checkpoint_location, or pass "
                "new_checkpoint='continue' to write this query's epochs after "
                f"epoch {last} (right when the new query's source starts where the old "
                "stopped)."
            )
        base = fresh
        if last >= 0:
            log.warning(
                "sink %s: new checkpoint %s; continuing on a new epoch range from %d",
                sid,
                ckpt.location,
                last + 1,
            )
        if lineage is None:
            lineage = ckpt.write_lineage()
            fault_point("after_lineage_written")
        self.lineage = lineage
        self.store.set_lineage(sid, self.generation, lineage, base)
        self._attach(journal, base)
        self.write_marker()
        return base

    def start_stream(self, ckpt: Any, new_checkpoint: str, *, inline: bool) -> int:
        """The start of a stream, in the protocol's order: the one place that orders it, for
        every front end (``eosink.run``'s streams and ``format("eosink")``'s data source, whose
        ``streamWriter`` Spark calls at the query's start and again for each micro-batch's
        commit). Opens the stream (:meth:`open_stream`), runs the start's recovery
        (:meth:`start_recovery`) and moves the base above other runs' epochs
        (:meth:`rebase_stream`; a held recovery's epochs are aborted if it moves).

        Returns:
            The epoch base (epoch = base + batchId).

        Raises:
            As :meth:`open_stream`.
        """
        base = self.open_stream(ckpt, new_checkpoint, inline=inline)
        self.start_recovery(ckpt, base)
        return self.rebase_stream(ckpt, base, held=not inline)

    def start_recovery(self, ckpt: Any, base: int) -> None:
        """A stream's recovery at its start (after :meth:`open_stream`), before Spark fixed
        its first batch: rules 1, 3, 7 and 9 now, rules 2 and 4 for its own epochs from the
        first batch not checkpointed on held for :meth:`resume_stream`. Inline mode, or a
        previous driver of the query that committed inline (its PENDING epochs may be
        committed in part, so they cannot be aborted): every PENDING epoch is committed now
        (complete data; the replayed batch is then skipped). In inline mode the data staged
        for the first batch not checkpointed is kept: ``format("eosink")``'s data source
        starts the stream again for each micro-batch's commit, after its tasks staged it (a
        crashed attempt's staging is then the micro-batch's commit's to handle, as it is at
        any inline micro-batch)."""
        last = ckpt.last_committed_batch()
        first = base + (0 if last is None else last + 1)
        if self.inline:
            self.recover(first_epoch=sys.maxsize, keep_staged=frozenset({first}))
        elif self.after_inline:
            log.info(
                "sink %s: the query's previous driver committed inline; its PENDING "
                "epochs are committed now",
                self.sink_id,
            )
            self.recover(first_epoch=sys.maxsize)
        else:
            self.recover(first_epoch=first, hold=True)

    def attach_stream(self, journal: Journal, base: int) -> None:
        """Join a stream that another coordinator set up (:meth:`open_stream`, recovery):
        a Spark Connect server's worker, or the client finishing after the query ended.
        Claims the journal's next generation (``lineage`` must be the stream's)."""
        self._attach(journal, base)

    def _attach(self, journal: Journal, base: int, first_batch: int | None = None) -> None:
        """Claim the journal's next generation (fencing older drivers) with the stream's
        lineage and base, and keep the journal for phase 1 and the fence checks.

        ``first_batch``: the first batch id the base maps (set when the base moves, else
        carried over from the journal's newest generation of the same base)."""
        if first_batch is None:
            kept = journal.state() or {}
            same = kept.get("lineage") == self.lineage and kept.get("epoch_base", base) == base
            first_batch = int(kept.get("first_batch", 0)) if same else 0
        self.first_batch = first_batch
        gen = journal.claim(self.lineage, base, self.run_id, first_batch, self.inline)
        self.journal = journal
        log.info(
            "sink %s: journal in checkpoint %s, generation %d (epoch base %d)",
            self.sink_id,
            journal.ckpt.location,
            gen,
            base,
        )

    def _import_journal(self, upto: int) -> None:
        """Persist PENDING the journal's entries up to epoch ``upto`` that the store lacks
        (rule 9)."""
        assert self.journal is not None
        have = {r.epoch for r in self.store.epochs(self.sink_id)} | self._lost()
        entries = self.journal.entries()
        origins = {e: ent.origin for e, ent in entries.items()}
        retired = self.retired_high()
        for e in journal_entries_to_take(origins, have, self.lineage, upto, retired):
            ent = entries[e]
            log.warning(
                "sink %s epoch %d: PENDING in the checkpoint's journal, unknown to meta store "
                "%s; taking it from the journal (it is committed by the recovery)",
                self.sink_id,
                e,
                self.store.url_redacted,
            )
            self._persist_entry(ent)

    def _check_checkpointed(self, ckpt: Any, base: int, checkpointed: int) -> None:
        """Refuse when Spark checkpointed an epoch of this stream that no record holds.

        Epochs below the journal's oldest entry are committed (an entry is deleted only once
        a later epoch is committed); so are those at or below the store's floor (garbage-
        collected, or known from the target's marker). Every other epoch up to
        ``checkpointed`` needs its row.
        """
        assert self.journal is not None
        entries = self.journal.entries()
        sink = self.store.sink(self.sink_id)
        assert sink is not None
        # Below base + first_batch: batches of the query before its base moved, whose epochs
        # (other runs' now) were checked then.
        have = {r.epoch for r in self.store.epochs(self.sink_id)} | self._lost()
        missing = unrecorded_checkpointed(
            checkpointed,
            have,
            sink.gc_floor,
            min(entries) if entries else None,
            base + self.first_batch,
        )
        if missing:
            raise SinkIdentityError(
                f"sink {self.sink_id!r}: Spark checkpointed epochs up to {checkpointed}, but "
                f"epoch(s) {_span(missing)} are neither in meta store "
                f"{self.store.url_redacted} nor in eosink's journal in checkpoint "
                f"{ckpt.location} (a checkpoint written by an eosink without the journal, with "
                "its meta store lost or another one given). Run with the original meta store "
                "(metastore_url=) to finish them; or, accepting that those epochs are lost, "
                "start from a new checkpoint_location with new_checkpoint='continue'"
            )

    def resume_stream(self, base: int, batch_id: int) -> None:
        """At a stream's first micro-batch (``batch_id``, the batch Spark re-runs or runs
        next): the recovery :meth:`recover` held at the start (``hold=True``), now that Spark
        has fixed which batches are checkpointed. The journal's entries of the epochs below
        ``base + batch_id`` that the store lacks are imported (rule 9; an older driver may
        have got Spark to checkpoint one after this driver started), they are committed (rule
        1), and the stream's epochs from ``base + batch_id`` on are aborted (rules 2 and 4).
        """
        first = base + batch_id
        if self.journal is not None:
            self._import_journal(first - 1)
            self._check_checkpointed(self.journal.ckpt, base, first - 1)
        self.recover(first_epoch=first)

    def rebase_stream(self, ckpt: Any, base: int, *, held: bool = False) -> int:
        """After recovery: move the stream's base above epochs other runs used meanwhile
        (rule 8). ``held``: the recovery held the stream's PENDING epochs from the first
        batch not checkpointed on (``recover(hold=True)``); they are aborted if the base moves.

        Other runs' epochs are the store's rows of another origin, and the epochs the store
        knows only from the target's marker (:attr:`adopted_last`) or its GC floor beyond what
        this query checkpointed: its own epochs there would have rows (from the store or the
        journal) or, garbage-collected, an entry in its journal.
        """
        last_batch = ckpt.last_committed_batch()
        nxt = 0 if last_batch is None else last_batch + 1
        sink = self.store.sink(self.sink_id)
        plan = move_base_above_other_runs(
            self.lineage,
            base,
            nxt,
            [_known(r) for r in self.store.epochs(self.sink_id)],
            self.own_journal_epochs() if self.journal is not None else None,
            self.adopted_last,
            sink.gc_floor if sink is not None else None,
            held=held,
        )
        if plan.base == base:
            return base
        if plan.abort_held:
            # PENDING epochs held for the first micro-batch (recover(hold=True)) would land
            # below the new base, where they would count as checkpointed: abort them now.
            self.recover(first_epoch=base + nxt)
        new_base = plan.base
        top = new_base + nxt - 1
        log.warning(
            "sink %s: epochs up to %d were written by other runs since this query numbered them; "
            "its epochs continue from %d",
            self.sink_id,
            top,
            top + 1,
        )
        if self.journal is not None:  # first: the store's base is what a restart trusts
            self._attach(self.journal, new_base, first_batch=nxt)
        self.store.set_lineage(self.sink_id, self.generation, self.lineage, new_base)
        self.write_marker()
        return new_base
