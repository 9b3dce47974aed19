"""``eosink retire``: remove what a decommissioned sink keeps outside its target's data, and
record the retirement so that a later run under the same sink_id starts above it.

What a sink keeps besides its data: its meta-store rows (epochs, known losses), the batch
journal beside the target (:class:`~eosink.JournalHome`), staged data
(:class:`~eosink.StagedEpochs`), open rolling files (:class:`~eosink.Rolling`, published:
their rows are committed), its marker in the target (:class:`~eosink.TargetMarker`) and
records only the sink knows (:class:`~eosink.Retirable`: a SQL sink's ``sql_epochs`` rows,
a Kafka sink's control-topic markers).

The retirement is recorded twice, in the sink's meta-store row and in its marker, because
some targets keep the retired sink's epochs forever (Iceberg snapshot summaries, Kafka's
committed messages): a later run whose epochs started again at 0 would find them "already
committed" and skip its data. So every later run under the sink_id writes epochs above the
retired sink's highest (:func:`eosink._rules.base_of_fresh_checkpoint`,
:func:`eosink._rules.decide_batch_epoch`), on this meta store or, through the marker, on
any other.

Order (each step idempotent: a retirement cut short is run again): finish the stopped sink
(recovery, rolls), refuse if an epoch is still PENDING, record the retirement in the meta
store (the sink's epochs deleted, every coordinator fenced), replace the marker, delete the
sink's own records, delete the journal.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from ._journal import Journal
from ._mixins import JournalHome, Retirable, StagedEpochs, TargetMarker
from .errors import SinkError

log = logging.getLogger("eosink")

__all__ = ["Retirement", "retire", "survey"]


@dataclass
class Retirement:
    """What a retirement removes (or, from :func:`survey`, would remove)."""

    sink_id: str
    high: int
    """The retired sink's highest epoch: later runs' epochs are above it."""
    removed: list[str] = field(default_factory=list)
    """One line per kind of thing removed, what and how many."""
    kept: list[str] = field(default_factory=list)
    """What stays, and why."""


def _journal(coordinator: Any, caps: Any, sink_id: str) -> Journal | None:
    from ._checkpoint import CheckpointDir

    if not caps.journal_home:
        return None
    location = cast(JournalHome, coordinator).journal_location()
    if not location:
        return None
    return Journal(CheckpointDir(None, location), sink_id, prefix="")


def _high(store: Any, sink_id: str, marker: dict[str, Any] | None) -> int:
    high = store.max_epoch(sink_id)
    if marker:
        high = max(high, int(marker.get("last_epoch", -1)))
        retired = marker.get("retired")
        if isinstance(retired, dict) and isinstance(retired.get("high"), int):
            high = max(high, int(retired["high"]))
    return int(high)


def _store_lines(store: Any, sink_id: str) -> list[str]:
    counts = Counter(r.status for r in store.epochs(sink_id))
    losses = len(store.losses(sink_id))
    what = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"
    return [
        f"meta store {store.url_redacted}: the sink's epoch records ({what}) and its "
        f"{losses} known loss record(s)"
    ]


def survey(setup: Any) -> Retirement:
    """``eosink retire --dry-run``: what a retirement of ``setup``'s sink would remove. Changes
    nothing of the sink's records (its coordinator's ``init`` runs, as at every start)."""
    from ._metastore import MetaStore
    from ._mixins import capabilities_of

    store = MetaStore(setup.metastore_url, retry_s=setup.metastore_retry_s, create=False)
    coordinator = setup.plugin.coordinator_factory(setup.options, setup.sink_id)
    try:
        caps = capabilities_of(setup.plugin, coordinator)
        coordinator.init()
        marker = cast(TargetMarker, coordinator).read_marker() if caps.target_marker else None
        out = Retirement(setup.sink_id, _high(store, setup.sink_id, marker))
        out.removed += _store_lines(store, setup.sink_id)
        journal = _journal(coordinator, caps, setup.sink_id)
        if journal is not None:
            n = len(journal.files())
            if n:
                out.removed.append(f"{n} file(s) of the batch journal in {journal.ckpt.location}")
        if caps.staged_epochs:
            staged = sorted(cast(StagedEpochs, coordinator).staged_epochs())
            if staged:
                out.removed.append(f"staged data of epoch(s) {staged} that no commit published")
        if caps.rolling:
            out.removed.append("open rolling files: published first (their rows are committed)")
        if caps.retirable:
            out.removed += cast(Retirable, coordinator).retire_records(dry_run=True)
        _what_stays(out, caps, setup)
        return out
    finally:
        try:
            coordinator.close()
        finally:
            store.close()


def _what_stays(out: Retirement, caps: Any, setup: Any) -> None:
    if caps.target_marker:
        out.removed.append(
            "the sink's marker in the target: replaced by the record of the retirement"
        )
    out.kept.append(
        f"the target's data, and the sink's row in meta store (the record of the retirement: "
        f"a later run under sink_id {setup.sink_id!r} writes epochs above {out.high})"
    )
    out.kept.append(
        "streaming checkpoints (delete them yourself; a query restarted on one writes its "
        f"next micro-batches above epoch {out.high})"
    )


def retire(setup: Any, by: str) -> Retirement:
    """Retire ``setup``'s sink (the caller checked that no job of it runs).

    Raises:
        SinkError: an epoch is still PENDING after the stopped sink was finished (it cannot
            be committed: see ``eosink recover`` / ``eosink abandon``), or an open file
            cannot be published; nothing was retired.
    """
    from ._batch import finish_stopped
    from ._metastore import ABORTED, PENDING
    from ._setup import open_runtime

    rt = open_runtime(setup)  # fences every other coordinator; the sink's init runs
    try:
        caps, coordinator = rt.caps, rt.coordinator
        staged = (
            sorted(cast(StagedEpochs, coordinator).staged_epochs()) if caps.staged_epochs else []
        )
        done = finish_stopped(rt)  # recovery: staged data without a committable deleted
        if done.failure is not None:
            raise SinkError(
                f"sink {setup.sink_id}: {done.failure}; nothing was retired (see `eosink status`)"
            )
        left = rt.store.epochs(setup.sink_id, (PENDING, ABORTED))
        if left:
            raise SinkError(
                f"sink {setup.sink_id}: epoch(s) {[r.epoch for r in left]} are still "
                "PENDING or ABORTED; publish them with `eosink recover`, or give them up with "
                "`eosink abandon`; nothing was retired"
            )
        marker = cast(TargetMarker, coordinator).read_marker() if caps.target_marker else None
        out = Retirement(setup.sink_id, _high(rt.store, setup.sink_id, marker))
        out.removed += _store_lines(rt.store, setup.sink_id)
        if staged:
            out.removed.append(f"staged data of epoch(s) {staged} that no commit published")
        if done.rolled:
            out.removed.append(f"{done.rolled} open rolling file(s): published")
        # 1. The meta store records the retirement (every coordinator fenced).
        rec = rt.store.retire(setup.sink_id, rt.generation, high=out.high, by=by)
        # 2. The target's marker: the retirement, so that any meta store learns it.
        if caps.target_marker:
            cast(TargetMarker, coordinator).write_marker(
                {
                    "sink_id": setup.sink_id,
                    "plugin": setup.plugin.name,
                    "target": rec.target,
                    "lineage": None,
                    "epoch_base": 0,
                    "retired": rec.retirement(),
                }
            )
        # 3. What only the sink knows.
        if caps.retirable:
            out.removed += cast(Retirable, coordinator).retire_records(dry_run=False)
        # 4. The batch journal beside the target (and the target journal of its streams).
        journal = _journal(coordinator, caps, setup.sink_id)
        if journal is not None:
            n = journal.remove()
            if n:
                out.removed.append(f"{n} file(s) of the batch journal in {journal.ckpt.location}")
        if caps.staged_epochs:
            still = sorted(cast(StagedEpochs, coordinator).staged_epochs())
            if still:
                out.kept.append(
                    f"staged data under epoch(s) {still}, which are committed (it is never "
                    "offered to an abort)"
                )
        _what_stays(out, caps, setup)
        log.warning(
            "sink %s retired by %s with epochs up to %d: %s",
            setup.sink_id,
            by,
            out.high,
            "; ".join(out.removed),
        )
        return out
    finally:
        rt.close()
        rt.store.close()
