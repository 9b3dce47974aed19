"""The two-phase protocol on the driver: recovery, phase 1, phase 2 (the template method).

The plugin implements only phase methods; every state transition happens here, through the
fenced :class:`~eosink._metastore.MetaStore`.
"""

from __future__ import annotations

import io
import logging
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import pyarrow as pa

from ._checkpoint import CheckpointDir
from ._journal import Entry, Journal
from ._metastore import (
    ABORTED,
    BATCH,
    BATCH_AUTO,
    BATCH_AUTO_UNREPORTED,
    BATCH_ORIGINS,
    COMMITTED,
    FORMAT_STREAM_OWNER,
    HEARTBEAT_SECONDS,
    PENDING,
    MetaStore,
)
from ._mixins import capabilities_of
from ._rules import (
    FINISH,
    SKIP,
    WRITE,
    KnownEpoch,
    PendingEpoch,
    Refusal,
    UnfinishedRun,
    aborts_to_finish,
    base_of_fresh_checkpoint,
    decide_auto_epoch,
    decide_batch_epoch,
    decide_stream_epoch,
    is_own_epoch,
    journal_entries_to_take,
    move_base_above_other_runs,
    plan_pending,
    sweep_staged,
    target_entries_to_take,
    unrecorded_checkpointed,
)
from ._transient import classify_error
from .errors import (
    FencedError,
    NewCheckpointError,
    SinkError,
    SinkIdentityError,
    UnfinishedRunError,
)
from .faults import fault_point
from .sink import (
    Capabilities,
    JournalHome,
    Prepared,
    Rolling,
    SinkCommitCoordinator,
    SinkPlugin,
    StagedEpochs,
    TargetMarker,
)

log = logging.getLogger("eosink")

__all__ = ["Epoch", "EpochFigures", "SinkRuntime"]


FIGURES_KEPT = 1000
"""Epochs whose :class:`EpochFigures` a driver keeps in memory (the newest ones): a runtime's
``figures`` and a streaming handle's. The meta store keeps every epoch's (``eosink status``);
the ``eosink_epoch_committed`` hook receives each one."""


@dataclass
class EpochFigures:
    """What happened to one epoch; exposed by handles and results, logged, sent to hooks.

    Attributes:
        epoch: the epoch.
        rows: rows written.
        files: files (or other units) the commit published (``Prepared.files``).
        bytes: their size (``Prepared.bytes``).
        write_s: seconds the writers took (Spark's job, or the Python writer tasks).
        pre_commit_ms: the coordinator's ``pre_commit``, in milliseconds.
        persist_ms: persisting the PENDING row in the meta store.
        commit_ms: the coordinator's ``commit`` (with retries) and the COMMITTED mark.
        batch_end_at: wall-clock time (``time.time()``) the epoch's data was complete.
        committed_at: wall-clock time its commit was visible (0 until then).
        skipped: a replay of a committed epoch (nothing written).
        held_rows: rows of committed epochs the sink still holds in open files after this
            epoch (files that span epochs: the file sink's rolling options); visible once
            their file rolls, so their visibility lag is up to the rolling interval.
        held_bytes: their size in bytes.
    """

    epoch: int
    rows: int = 0
    files: int = 0
    bytes: int = 0
    write_s: float = 0.0
    pre_commit_ms: float = 0.0
    persist_ms: float = 0.0
    commit_ms: float = 0.0
    batch_end_at: float = 0.0
    committed_at: float = 0.0
    skipped: bool = False
    held_rows: int = 0
    held_bytes: int = 0
    writer: str = ""
    """Which writers staged the epoch: ``spark`` (the native path) or ``python``."""

    @property
    def visibility_lag_s(self) -> float:
        """Commit visible minus batch end."""
        return max(0.0, self.committed_at - self.batch_end_at) if self.committed_at else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field, plus ``visibility_lag_s``: what the ``eosink_epoch_committed`` hook gets."""
        d = asdict(self)
        d["visibility_lag_s"] = self.visibility_lag_s
        return d


def schema_bytes(schema: pa.Schema) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue()


def schema_from_bytes(data: bytes) -> pa.Schema:
    return pa.ipc.open_stream(data).schema


@dataclass
class Epoch:
    """One epoch of one run, from the decision to its commit (made by the runtime).

    Both front ends (``eosink.run`` and ``format("eosink")``) drive an epoch the same way::

        ep = runtime.batch_epoch(epoch)          # or runtime.stream_epoch(base + batchId)
        if ep.skipped:                           # committed before, or finished now
            ep.discard()                         # (only if something was written meanwhile)
        else:
            setup = ep.setup(schema)             # coordinator.writer_setup
            ... write (Python writers in tasks, or the native path) ...
            ep.prepare(results, rows, write_s)   # phase 1: PENDING
            ep.commit()                          # phase 2 (or hand it to the AsyncCommitter)

    Attributes:
        epoch: the epoch.
        decision: ``write`` or ``skip``.
        recovered: a crashed run's PENDING epoch (complete data) was committed instead.
        figures: the epoch's figures once prepared (or recovered).
        committable: once prepared.
    """

    runtime: SinkRuntime
    epoch: int
    decision: str
    recovered: bool = False
    figures: EpochFigures | None = None
    committable: Any = None

    @property
    def skipped(self) -> bool:
        """Nothing to write: the epoch is committed (before, or by this recovery)."""
        return self.decision == SKIP

    def setup(self, schema: pa.Schema) -> Any:
        """The coordinator's ``writer_setup`` for this epoch's schema."""
        return self.runtime.coordinator.writer_setup(schema)

    def prepare(
        self, results: Sequence[Any], rows: int, write_s: float, *, writer: str = "python"
    ) -> EpochFigures:
        """Phase 1: the coordinator's ``pre_commit``, persisted PENDING."""
        assert self.decision == WRITE, f"epoch {self.epoch} is not to be written"
        self.committable, self.figures = self.runtime.pre_commit(
            self.epoch, results, rows=rows, write_s=write_s, writer=writer
        )
        return self.figures

    def commit(self) -> EpochFigures:
        """Phase 2: commit (retried while transient) and mark COMMITTED."""
        assert self.figures is not None, f"epoch {self.epoch} is not prepared"
        self.runtime.commit_epoch(self.epoch, self.committable, self.figures)
        return self.figures

    def discard(self) -> None:
        """Delete what was staged for the epoch without a committable (failed writers, a
        replay's output)."""
        self.runtime.discard(self.epoch)


@dataclass
class SinkRuntime:
    """One live coordinator of one sink_id, with its fencing generation.

    Args:
        plugin: the sink.
        options: validated options.
        sink_id: stable sink name.
        store: the meta store.
        gc_keep: committed rows kept per sink (older ones are garbage-collected).
    """

    plugin: SinkPlugin[Any, Any, Any]
    options: Any
    sink_id: str
    store: MetaStore
    gc_keep: int = 1000
    gc_every: int = 100
    commit_retry_max_s: float = 30.0
    coordinator: SinkCommitCoordinator[Any, Any] = field(init=False)
    caps: Capabilities = field(init=False, default_factory=Capabilities)
    """What the coordinator offers beyond the mandatory contract (the plugin's declared
    record): the only source of "does this sink have a marker, a journal home...?"."""
    generation: int = field(init=False, default=0)
    figures: dict[int, EpochFigures] = field(init=False, default_factory=dict)
    lineage: str = field(init=False, default=BATCH)
    """``origin`` of the epochs this run writes: ``batch`` (explicit ``epoch=``),
    ``batch-auto`` (the next free epoch) or the stream's lineage."""
    adopted_last: int | None = field(init=False, default=None)
    """Set when this meta store took the sink over from the target's marker."""
    journal: Journal | None = field(init=False, default=None)
    """A stream's journal in its checkpoint (set by :meth:`open_stream`): what phase 2
    needs, kept where a driver on another machine finds it, and the fence across machines."""
    _target: Journal | None = field(init=False, default=None)
    """The journal beside the target (:class:`~eosink.sink.JournalHome`), opened by
    :meth:`target_journal`: every run's PENDING epochs (batch runs' and streams'), so that a
    driver whose meta store lacks them (another machine, a lost store) neither deletes their
    staged data as leftovers nor reuses their epochs."""
    run_id: str | None = field(init=False, default=None)
    """The ``eosink.run`` call this coordinator serves, recorded with its journal claims."""
    _since_gc: int = field(init=False, default=0)
    _marker: dict[str, Any] | None = field(init=False, default=None)
    _heartbeat: Heartbeat | None = field(init=False, default=None)
    _imported: bool = field(init=False, default=False)
    first_batch: int = field(init=False, default=0)
    """The first batch id the stream's epoch base maps (see :meth:`_attach`)."""
    inline: bool = False
    """A stream that commits inside its micro-batches (``commit_mode="inline"``)."""
    micro_batch: bool = False
    """The coordinator of one micro-batch of a ``format("eosink")`` stream, in Spark's
    data-source worker: the query runs on after :meth:`close`. Its owner is recorded as
    ``host:pid (format stream)``, and close keeps its heartbeat instead of clearing it, so
    that ``eosink status``, ``recover`` and ``abandon`` count the query as running, on any
    host, until its heartbeat is stale (:data:`~eosink._metastore.HEARTBEAT_STALE_SECONDS`
    after its last micro-batch)."""
    after_inline: bool = field(init=False, default=False)
    """The stream's previous driver committed inline (:meth:`open_stream`): its PENDING
    epochs may be committed in part, so this start commits them all (:meth:`start_recovery`)."""

    def target_journal(self) -> Journal | None:
        """The journal beside the target, if the sink has one (opened once)."""
        if self._target is None and self.caps.journal_home:
            location = cast(JournalHome, self.coordinator).journal_location()
            if location:
                self._target = Journal(CheckpointDir(None, location), self.sink_id, prefix="")
        return self._target

    def import_target_journal(self) -> None:
        """Take from the target's journal (once) the PENDING epochs this meta store lacks: a
        crashed run's (a batch run, another streaming query) on another machine or store.
        They hold complete data: recovery commits them (rule 7), their staged data is not
        leftovers, and their epochs are not free."""
        journal = self.target_journal()
        if journal is None or self._imported:
            return
        self._imported = True
        have = {r.epoch for r in self.store.epochs(self.sink_id)} | self._lost()
        entries = journal.entries()
        take, forget = target_entries_to_take(
            {e: ent.origin for e, ent in entries.items()}, have, journal.committed_origin
        )
        for e in forget:
            journal.forget(e)  # committed; the entry's deletion was cut short
        for e in take:
            ent = entries[e]
            log.warning(
                "sink %s epoch %d: a crashed run's PENDING epoch (%s), in the target's journal "
                "(%s) but unknown to meta store %s; taking it from the journal",
                self.sink_id,
                e,
                "a batch run" if ent.origin in BATCH_ORIGINS else f"stream {ent.origin[:8]}",
                journal.ckpt.location,
                self.store.url_redacted,
            )
            self._persist_entry(ent)

    def _lost(self) -> set[int]:
        """Epochs an operator abandoned (``eosink abandon``): never taken from a journal."""
        return {r.epoch for r in self.store.losses(self.sink_id)}

    def assert_live(self) -> None:
        """Raise :class:`FencedError` if a newer coordinator took the sink over: through the
        meta store, or (streams) through the journal in the checkpoint, which every driver
        of the query shares whatever meta store it uses."""
        self.store.assert_live(self.sink_id, self.generation)
        if self.journal is not None:
            self.journal.assert_live()

    def start(self) -> None:
        """Check the sink's identity against the meta store and the target, then acquire it.

        Raises:
            SinkIdentityError: the sink_id is bound to another target or plugin, or the meta
                store is behind the target's marker (nothing is changed).
        """
        sid = self.sink_id
        existing = self.store.sink(sid)
        self.coordinator = self.plugin.coordinator_factory(self.options, sid)
        self.caps = capabilities_of(self.plugin, self.coordinator)
        self.coordinator.init()
        target = self.coordinator.target_id()
        if existing is not None and existing.plugin != self.plugin.name:
            raise SinkIdentityError(
                f"sink_id {sid!r} belongs to a {existing.plugin!r} sink in meta store "
                f"{self.store.url_redacted}; this run is a {self.plugin.name!r} sink. "
                "Give this sink its own sink_id="
            )
        if existing is not None and existing.target and target and existing.target != target:
            raise SinkIdentityError(
                f"sink_id {sid!r} is bound to {existing.target} (meta store "
                f"{self.store.url_redacted}), but this run writes to {target}. A sink_id names "
                "one target, because its committed epochs are recorded against it: pass another "
                "sink_id= for this target, or leave sink_id unset (the default is derived from "
                "the target)"
            )
        marker = (
            cast(TargetMarker, self.coordinator).read_marker() if self.caps.target_marker else None
        )
        known = self.store.max_epoch(sid) if existing is not None else -1
        marked = int(marker.get("last_epoch", -1)) if marker else -1
        if marker is not None and marked > known:
            if known >= 0:
                raise SinkIdentityError(
                    f"the target of sink {sid!r} holds committed epochs up to {marked} (its "
                    f"eosink marker), but meta store {self.store.url_redacted} knows only up to "
                    f"{known}: it is not the store this sink was written with, or an older copy "
                    "of it. Run with the meta store the sink was written with (metastore_url=)"
                )
            self.adopted_last = marked
        rec = self.store.acquire(
            sid, self.plugin.name, None, note=FORMAT_STREAM_OWNER if self.micro_batch else None
        )
        self.generation = rec.generation
        if self.adopted_last is not None and marker is not None:
            log.warning(
                "sink %s: meta store %s has no record of this sink, but its target holds "
                "committed epochs up to %d; taking the sink over from the target's marker "
                "(epochs up to %d count as committed)",
                sid,
                self.store.url_redacted,
                marked,
                marked,
            )
            self.store.adopt(sid, self.generation, last_epoch=marked)
            if marker.get("lineage"):
                self.store.set_lineage(
                    sid, self.generation, str(marker["lineage"]), int(marker["epoch_base"])
                )
        elif marker is None and known >= 0 and self.caps.target_marker:
            log.warning(
                "sink %s: the meta store has epochs up to %d but the target has no eosink "
                "marker (was the target deleted or recreated?); writing a new one",
                sid,
                known,
            )
        if target and (existing is None or not existing.target):
            self.store.set_target(sid, self.generation, target)
        self._marker = marker
        self.write_marker()
        # Last: a start that failed leaves no thread behind (acquire recorded a heartbeat,
        # which goes stale).
        self._heartbeat = Heartbeat(self.store, sid, self.generation)
        log.info(
            "sink %s: coordinator started (plugin %s, generation %d, meta store %s)",
            sid,
            self.plugin.name,
            self.generation,
            self.store.url_redacted,
        )

    def write_marker(self) -> None:
        """Write the sink's marker into the target when it changed (TargetMarker plugins)."""
        if not self.caps.target_marker:
            return
        rec = self.store.sink(self.sink_id)
        assert rec is not None
        want = {
            "sink_id": self.sink_id,
            "plugin": self.plugin.name,
            "target": rec.target,
            "lineage": rec.lineage,
            "epoch_base": rec.epoch_base,
        }
        have = {k: v for k, v in (self._marker or {}).items() if k != "last_epoch"}
        if have != want:
            self.assert_live()
            cast(TargetMarker, self.coordinator).write_marker(want)
            self._marker = want

    # -- one epoch of a run ----------------------------------------------------------------
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

    # -- which epochs to write -----------------------------------------------------------
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
        was, high = None, -1
        if rec is None:
            target = self.target_journal()
            was = target.committed_origin(epoch) if target else None
            if was is None:
                high = self.store.stream_high(sid)
        decision = decide_batch_epoch(epoch, rec, was, high)
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
        assert refusal.reason == "unknown-below-stream-high", refusal
        high = self.store.stream_high(sid)
        return SinkIdentityError(
            f"sink {sid!r} has no record of epoch {epoch}, and epochs up to {high} were "
            "written by streaming queries or are known only as committed (garbage-collected "
            "or taken over from the target): eosink cannot tell whether this epoch is one "
            f"of them. Pick an epoch above {high}, or leave epoch unset (the next free one)"
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
        r = self.store.epoch(self.sink_id, epoch)
        rec = _known(r) if r is not None else None
        gc_floor, journal_origin = None, None
        if rec is None:
            sink = self.store.sink(self.sink_id)
            gc_floor = sink.gc_floor if sink is not None else None
            if gc_floor is not None and epoch <= gc_floor and self.journal is not None:
                # Committed, its row garbage-collected (or known from the target's marker):
                # a replay of this stream's own epoch keeps its entry in the journal (the
                # newest committed one stays); without it, the epoch is another run's.
                entry = self.journal.entries().get(epoch)
                journal_origin = entry.origin if entry is not None else None
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
        # Read first, check fencing second: a skip decided on state that a newer
        # coordinator could have changed is never acted on.
        self.assert_live()
        return decision

    def finish(self, epoch: int) -> EpochFigures:
        """Commit ``epoch`` from its PENDING row (a crashed run's complete data)."""
        rec = self.store.epoch(self.sink_id, epoch)
        assert rec is not None and rec.status == PENDING and rec.committable is not None
        log.info("sink %s epoch %d: finishing the commit of a crashed run", self.sink_id, epoch)
        c = self.plugin.committable_codec.decode(rec.committable, rec.codec_version)
        fig = EpochFigures(
            rec.epoch,
            rec.rows,
            rec.files,
            rec.bytes,
            batch_end_at=rec.batch_end_at or 0.0,
            pre_commit_ms=rec.pre_commit_ms or 0.0,
        )
        self.commit_epoch(epoch, c, fig)
        return fig

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
            if kept.get("lineage") == lineage:
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
            raise NewCheckpointError(
                f"sink {sid!r} already has epochs up to {last} written by other runs, and "
                f"checkpoint_location {ckpt.location!r} is new to it. A fresh checkpoint "
                "re-reads the source from its starting offsets, which would duplicate "
                "rows. Restart with the original checkpoint_location, or pass "
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

    def start_recovery(self, ckpt: Any, base: int) -> None:
        """A stream's recovery at its start (after :meth:`open_stream`), before Spark fixed
        its first batch: rules 1, 3, 7 and 9 now, rules 2 and 4 for its own epochs from the
        first batch not checkpointed on held for :meth:`resume_stream`. Inline mode, or a
        previous driver of the query that committed inline (its PENDING epochs may be
        committed in part, so they cannot be aborted): every PENDING epoch is committed now
        (complete data; the replayed batch is then skipped)."""
        last = ckpt.last_committed_batch()
        first = base + (0 if last is None else last + 1)
        if self.inline or self.after_inline:
            if self.after_inline and not self.inline:
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
        for e in journal_entries_to_take(origins, have, self.lineage, upto):
            ent = entries[e]
            log.warning(
                "sink %s epoch %d: PENDING in the checkpoint's journal, unknown to meta store "
                "%s; taking it from the journal (it is committed by the recovery)",
                self.sink_id,
                e,
                self.store.url_redacted,
            )
            self._persist_entry(ent)

    def _persist_entry(self, ent: Entry) -> None:
        """Persist a journal entry PENDING in the meta store (as its run had)."""
        self.store.persist_pending(
            self.sink_id,
            self.generation,
            ent.epoch,
            ent.committable,
            ent.codec_version,
            rows=ent.rows,
            files=ent.files,
            nbytes=ent.bytes,
            batch_end_at=ent.batch_end_at,
            pre_commit_ms=ent.pre_commit_ms,
            origin=ent.origin,
        )

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
            (
                {e: ent.origin for e, ent in self.journal.entries().items()}
                if self.journal is not None
                else None
            ),
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
            "sink %s: epochs up to %d were written by other runs while this query was stopped; "
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

    def roll(self, everything: bool) -> int:
        """Let a sink whose files span epochs publish the due ones (:class:`Rolling`)."""
        if not self.caps.rolling:
            return 0
        c = cast(Rolling, self.coordinator)
        wait = None if everything else c.next_roll_in()
        if everything or (wait is not None and wait <= 0):
            self.assert_live()
            n = c.roll(everything)
            if n:
                log.info(
                    "sink %s: rolled %d open file(s)%s",
                    self.sink_id,
                    n,
                    " (end of run)" if everything else "",
                )
                self.store.record_roll(
                    self.sink_id, self.generation, files=n, everything=everything
                )
            return n
        return 0

    def close(self) -> None:
        try:
            self.coordinator.close()
        except Exception:  # pragma: no cover - close must not hide the real outcome
            log.exception("sink %s: coordinator close failed", self.sink_id)
        if self._heartbeat is not None:
            self._heartbeat.stop(keep=self.micro_batch)
            self._heartbeat = None

    # -- recovery ------------------------------------------------------------------------
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
        c = (
            self.plugin.committable_codec.decode(rec.committable, rec.codec_version)
            if rec.committable is not None
            else None
        )
        fault_point("recovery_before_abort")
        if self._abort(rec.epoch, c):
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

    def _abort(self, epoch: int, committable: Any) -> bool:
        """Call the plugin's abort; False (row stays ABORTED, retried next start) if it raised."""
        self.assert_live()
        try:
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

    # -- epochs --------------------------------------------------------------------------
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
    ) -> tuple[Any, EpochFigures]:
        """Phase 1: build the committable and persist PENDING."""
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
        for journal in journals:
            if journal is None:
                continue
            journal.record(
                Entry(
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
                )
            )
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
        )
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
        self.figures.pop(epoch, None)
        self.figures[epoch] = fig
        while len(self.figures) > FIGURES_KEPT:
            del self.figures[next(iter(self.figures))]

    def commit_epoch(self, epoch: int, committable: Any, fig: EpochFigures | None = None) -> None:
        """Phase 2: commit (retried with backoff while transient) and mark COMMITTED."""
        fig = fig or self.figures.get(epoch) or EpochFigures(epoch)
        fault_point("before_commit")
        self.assert_live()
        t0 = time.perf_counter()
        delay = 0.05
        # The retry window starts at the first failure: an attempt that itself waited long
        # (a Kafka call blocking through a broker outage) still gets retried.
        deadline: float | None = None
        while True:
            try:
                self.coordinator.commit(epoch, committable)
                break
            except FencedError:
                raise
            except Exception as exc:
                # commit is idempotent (the plugin contract): any error the one rule calls
                # transient (a plugin's CommitFailedError, a catalog's 503, a lost
                # connection) is retried, whoever raised it.
                if deadline is None:
                    deadline = time.monotonic() + self.commit_retry_max_s
                verdict = classify_error(exc)
                final = not verdict.transient or time.monotonic() > deadline
                self.store.record_error(
                    self.sink_id,
                    f"epoch {epoch}: commit failed{' for good' if final else ' (retried)'}: "
                    f"{type(exc).__name__}: {exc}",
                )
                if final:
                    raise
                log.warning(
                    "sink %s epoch %d: commit failed (%s); retrying in %.2fs",
                    self.sink_id,
                    epoch,
                    exc,
                    delay,
                )
            time.sleep(delay * (1 + random.random() * 0.2))
            delay = min(delay * 2, 5.0)
            # A retry may start over with the target (e.g. fence a Kafka transactional id):
            # never after another coordinator took the sink over.
            self.assert_live()
        fault_point("after_commit")
        fig.commit_ms = (time.perf_counter() - t0) * 1000
        self.store.mark_committed(self.sink_id, self.generation, epoch, commit_ms=fig.commit_ms)
        fig.committed_at = time.time()
        self._keep_figures(epoch, fig)
        fault_point("after_mark_committed")
        target = self.target_journal()
        rec = (
            self.store.epoch(self.sink_id, epoch)
            if target is not None or self.journal is not None
            else None
        )
        if target is not None:
            if rec is not None and rec.origin in BATCH_ORIGINS:
                target.mark_committed(epoch, rec.origin)
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
        if self.journal is not None and (rec is None or rec.origin in (None, self.lineage)):
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
        from .registry import plugin_manager

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


class Heartbeat:
    """Records in the sink's row, every :data:`HEARTBEAT_SECONDS`, that its coordinator
    runs (a daemon thread), and clears it on :meth:`stop`: ``eosink status`` and the
    operator commands tell a live owner on another host from a dead one by it. Fenced: a
    coordinator that lost the sink stops beating."""

    def __init__(self, store: MetaStore, sink_id: str, generation: int) -> None:
        self.store = store
        self.sink_id = sink_id
        self.generation = generation
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="eosink-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if not self.store.heartbeat(self.sink_id, self.generation):
                log.debug("sink %s: heartbeat not recorded", self.sink_id)

    def stop(self, *, keep: bool = False) -> None:
        """Stop beating; clear the heartbeat (a coordinator that stopped cleanly), or with
        ``keep`` record a last one (its job runs on: a micro-batch's coordinator)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.store.heartbeat(self.sink_id, self.generation, stopped=not keep)


class AsyncCommitter:
    """Runs phase 2 off the batch's critical path, in epoch order.

    An epoch is committed once ``checkpointed(epoch)`` is true. :meth:`drain` returns when every
    checkpointed epoch is committed. A terminal failure is kept and re-raised by
    :meth:`raise_if_failed` (the runner then stops the query).
    """

    def __init__(
        self,
        runtime: SinkRuntime,
        checkpointed: Callable[[int], bool],
        poll_s: float = 0.02,
    ) -> None:
        self.runtime = runtime
        self.checkpointed = checkpointed
        self.poll_s = poll_s
        self._q: queue.Queue[tuple[int, Any, EpochFigures]] = queue.Queue()
        self._head: tuple[int, Any, EpochFigures] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="eosink-committer", daemon=True)
        self._thread.start()

    def submit(self, epoch: int, committable: Any, fig: EpochFigures) -> None:
        self._q.put((epoch, committable, fig))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def outstanding(self) -> int:
        with self._lock:
            return self._q.qsize() + (1 if self._head is not None else 0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._head is None and not self._q.empty():
                    self._head = self._q.get_nowait()
                head = self._head
            if head is None or self.error is not None:
                with self._lock:
                    self._idle.notify_all()
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            epoch, committable, fig = head
            try:
                ready = self.checkpointed(epoch)
            except Exception:  # a checkpoint read hiccup: try again
                log.debug("checkpoint check failed", exc_info=True)
                ready = False
            if not ready:
                with self._lock:
                    self._idle.notify_all()
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            try:
                self.runtime.commit_epoch(epoch, committable, fig)
            except BaseException as exc:
                log.error(
                    "sink %s epoch %d: commit failed for good: %s", self.runtime.sink_id, epoch, exc
                )
                self.error = exc
            with self._lock:
                if self.error is None:
                    self._head = None
                self._idle.notify_all()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def drain(self, *, until_checkpointed: bool = True, timeout: float | None = None) -> None:
        """Wait until no checkpointed epoch is left uncommitted (or an error)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.error is None:
                head = self._head
                if head is None and self._q.empty():
                    break
                if until_checkpointed:
                    nxt = head[0] if head is not None else self._q.queue[0][0]
                    try:
                        if not self.checkpointed(nxt):
                            break
                    except Exception:
                        pass
                self._wake.set()
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._idle.wait(0.05 if left is None else min(0.05, left))
        self.raise_if_failed()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)


def _known(r: Any) -> KnownEpoch:
    """An epoch's meta-store row as the rules see it."""
    return KnownEpoch(r.epoch, r.status, r.origin)


def _span(epochs: Sequence[int]) -> str:
    """``3``, ``3-7`` or ``3, 5, 9-12``: epochs as runs."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and runs[-1][1] == e - 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
