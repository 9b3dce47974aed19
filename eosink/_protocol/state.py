"""A sink's live coordinator: its state (the dataclass fields), its start (identity checks
against the meta store and the target's marker, fencing), its journals, rolls and close."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa

from .. import _metrics
from .._journal import Entry, Journal, beside_target
from .._metastore import (
    BATCH,
    BATCH_ORIGINS,
    FORMAT_STREAM_OWNER,
    MetaStore,
    SinkRecord,
)
from .._mixins import capabilities_of
from .._rules import (
    target_entries_to_take,
)
from .._spec import EpochSpec, persisted_options
from ..errors import (
    ConfigError,
    FencedError,
)
from ..sink import (
    Capabilities,
    Rolling,
    SinkCommitCoordinator,
    SinkPlugin,
    TargetMarker,
)
from .figures import EpochFigures
from .helpers import retired_by_whom
from .identity import check_identity
from .threads import Heartbeat

log = logging.getLogger("eosink")


@dataclass
class _State:
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
    _spec: tuple[Any, EpochSpec, str] | None = field(init=False, default=None)
    """The last epoch spec built (schema, spec, stored form): options do not change within
    a run, and a stream's schema seldom does."""
    _staged_specs: dict[int, EpochSpec] = field(init=False, default_factory=dict)
    """The specs of the epochs this run prepared and has not committed yet."""
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
    retiring: bool = False
    """``eosink retire``'s runtime: the start does not announce a run after a retirement."""
    after_inline: bool = field(init=False, default=False)
    """The stream's previous driver committed inline (:meth:`open_stream`): its PENDING
    epochs may be committed in part, so this start commits them all (:meth:`start_recovery`)."""

    def target_journal(self) -> Journal | None:
        """The journal beside the target, if the sink has one (opened once)."""
        if self._target is None:
            self._target = beside_target(self.coordinator, self.caps.journal_home, self.sink_id)
        return self._target

    def own_journal_epochs(self) -> dict[int, str | None]:
        """The stream's journal (epoch -> origin), and the epochs of this stream that other
        runs committed from the target's journal (rule 7), which its own journal may lack: a
        driver killed between the two journals' writes of an epoch left its entry beside
        the target only. Both say which committed epochs are this stream's own."""
        assert self.journal is not None
        out: dict[int, str | None] = {}
        target = self.target_journal()
        if target is not None:
            out.update(dict.fromkeys(target.committed_of(self.lineage), self.lineage))
        out.update((e, ent.origin) for e, ent in self.journal.entries().items())
        return out

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

    def assert_live(self, sink: SinkRecord | None = None) -> None:
        """Raise :class:`FencedError` if a newer coordinator took the sink over: through the
        meta store (``sink``: its row as just read, instead of a read of its own), or
        (streams) through the journal in the checkpoint, which every driver of the query
        shares whatever meta store it uses."""
        if sink is None:
            self.store.assert_live(self.sink_id, self.generation)
        elif sink.generation != self.generation:
            raise FencedError(
                f"sink {self.sink_id!r}: this coordinator (generation {self.generation}) was "
                f"fenced by a newer one (generation {sink.generation}); it stops without "
                "changing any state"
            )
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
        marker = (
            cast(TargetMarker, self.coordinator).read_marker() if self.caps.target_marker else None
        )
        marked, retired = check_identity(
            self.store, sid, existing, self.plugin.name, target, marker
        )
        if marked is not None:
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
                self.adopted_last,
                self.adopted_last,
            )
            self.store.adopt(sid, self.generation, last_epoch=self.adopted_last)
            if retired is not None:
                self.store.set_retired(sid, self.generation, retired)
            if marker.get("lineage"):
                self.store.set_lineage(
                    sid, self.generation, str(marker["lineage"]), int(marker["epoch_base"])
                )
        elif (
            marker is None
            and self.caps.target_marker
            and existing is not None
            and (known := self.store.max_epoch(sid)) >= 0
        ):
            log.warning(
                "sink %s: the meta store has epochs up to %d but the target has no eosink "
                "marker (was the target deleted or recreated?); writing a new one",
                sid,
                known,
            )
        if target and (existing is None or not existing.target):
            self.store.set_target(sid, self.generation, target)
        self._say_retired()
        self._marker = marker
        self.write_marker()
        # Last: a start that failed leaves no thread behind (acquire recorded a heartbeat,
        # which goes stale).
        self._heartbeat = Heartbeat(self.store, sid, self.generation, self.plugin.name)
        log.info(
            "sink %s: coordinator started (plugin %s, generation %d, meta store %s)",
            sid,
            self.plugin.name,
            self.generation,
            self.store.url_redacted,
        )

    def retired_high(self) -> int | None:
        """The highest epoch of the sink ``eosink retire`` retired (None: never retired)."""
        rec = self.store.sink(self.sink_id)
        return None if rec is None else rec.retired_high

    def _say_retired(self) -> None:
        """At the first start after ``eosink retire``: say where this run's epochs start."""
        rec = self.store.sink(self.sink_id)
        if rec is None or rec.retired_high is None or self.retiring:
            return
        if self.store.max_epoch(self.sink_id) <= rec.retired_high:
            log.warning(
                "sink %s was retired (eosink retire, %s) with epochs up to %d; it starts "
                "again under the same sink_id: its epochs are above %d (the retired sink's "
                "target may still hold those), and a batch run's epoch= at or below it is "
                "refused",
                self.sink_id,
                retired_by_whom(rec),
                rec.retired_high,
                rec.retired_high,
            )

    def write_marker(self) -> None:
        """Write the sink's marker into the target when it changed (TargetMarker plugins)."""
        if not self.caps.target_marker:
            return
        rec = self.store.sink(self.sink_id)
        assert rec is not None
        want: dict[str, Any] = {
            "sink_id": self.sink_id,
            "plugin": self.plugin.name,
            "target": rec.target,
            "lineage": rec.lineage,
            "epoch_base": rec.epoch_base,
        }
        if rec.retired_high is not None:
            want["retired"] = rec.retirement()
        have = {k: v for k, v in (self._marker or {}).items() if k != "last_epoch"}
        if have != want:
            self.assert_live()
            cast(TargetMarker, self.coordinator).write_marker(want)
            self._marker = want

    def epoch_spec(self, schema: pa.Schema | None) -> tuple[EpochSpec, str]:
        """The spec of an epoch this run stages with ``schema``, and its stored form."""
        cached = self._spec
        if cached is not None and (
            cached[0] is schema
            or (schema is not None and cached[0] is not None and cached[0].equals(schema))
        ):
            return cached[1], cached[2]
        try:
            spec = EpochSpec(options=persisted_options(self.options), schema=schema)
            text = spec.encode()
        except Exception as exc:
            if self.caps.epoch_spec:
                raise ConfigError(
                    f"sink {self.sink_id}: the {self.plugin.name!r} sink declares epoch_spec, "
                    f"but its options cannot be persisted as JSON ({type(exc).__name__}: "
                    f"{exc}): give the options model JSON-serializable fields"
                ) from None
            # A sink that never reads the spec must not fail for it: its options stay out.
            log.warning(
                "sink %s: its options cannot be persisted with its epochs (%s: %s); the "
                "epoch spec keeps the schema only",
                self.sink_id,
                type(exc).__name__,
                exc,
            )
            spec = EpochSpec(schema=schema)
            text = spec.encode()
        self._spec = (schema, spec, text)
        return spec, text

    def spec_of(self, stored: str | None, epoch: int) -> EpochSpec | None:
        """A persisted epoch's spec (None: persisted without one).

        Raises:
            SchemaOutdatedError: a newer eosink wrote it.
        """
        if stored is None:
            return None
        return EpochSpec.decode(stored, f"sink {self.sink_id} epoch {epoch}")

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
            spec=ent.spec,
        )

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
            _metrics.runtime_closed(self.sink_id, self.plugin.name)
