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

from ._journal import beside_target
from ._mixins import Retirable, StagedEpochs, TargetMarker
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
    already: str | None = None
    """``at <time> by <who>`` when the sink was retired before (a retirement run again)."""


def _high(store: Any, sink_id: str, marker: dict[str, Any] | None) -> int:
    """The retired sink's highest epoch: what the store, the known losses (an abandoned
    epoch's number is not reused) and the target's marker know."""
    high = max([store.max_epoch(sink_id), *(x.epoch for x in store.losses(sink_id))])
    if marker:
        high = max(high, int(marker.get("last_epoch", -1)))
        retired = marker.get("retired")
        if isinstance(retired, dict) and isinstance(retired.get("high"), int):
            high = max(high, int(retired["high"]))
    return int(high)


def _begin(store: Any, sink_id: str, marker: dict[str, Any] | None) -> Retirement:
    """The retirement's account, from the records as they are before anything changes."""
    from ._protocol.helpers import retired_by_whom

    out = Retirement(sink_id, _high(store, sink_id, marker))
    rec = store.sink(sink_id)
    if rec is not None and rec.retired_high is not None:
        out.already = retired_by_whom(rec)
    counts = Counter(r.status for r in store.epochs(sink_id))
    if counts:
        what = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        out.removed.append(f"meta store {store.url_redacted}: the sink's epoch records ({what})")
    losses = store.losses(sink_id)
    if losses:
        out.kept.append(
            f"the record of {len(losses)} known loss(es) (epochs {[x.epoch for x in losses]}): "
            "a loss is recorded for ever"
        )
    return out


def _staged(coordinator: Any, caps: Any) -> list[int]:
    return sorted(cast(StagedEpochs, coordinator).staged_epochs()) if caps.staged_epochs else []


def survey(setup: Any) -> Retirement:
    """``eosink retire --dry-run``: what a retirement of ``setup``'s sink would remove, after
    the identity checks a retirement's start makes. Changes nothing of the sink's records
    (its coordinator's ``init`` runs, as at every start).

    Raises:
        SinkIdentityError: the options name another target than the sink's, or another
            kind of sink, or the meta store is behind the target.
    """
    from ._metastore import MetaStore
    from ._mixins import capabilities_of
    from ._protocol.identity import check_identity

    store = MetaStore(setup.metastore_url, retry_s=setup.metastore_retry_s, create=False)
    coordinator = setup.plugin.coordinator_factory(setup.options, setup.sink_id)
    try:
        caps = capabilities_of(setup.plugin, coordinator)
        coordinator.init()
        marker = cast(TargetMarker, coordinator).read_marker() if caps.target_marker else None
        existing = store.sink(setup.sink_id)
        check_identity(
            store, setup.sink_id, existing, setup.plugin.name, coordinator.target_id(), marker
        )
        out = _begin(store, setup.sink_id, marker)
        staged = _staged(coordinator, caps)
        if staged:
            out.removed.append(f"staged data of epoch(s) {staged} that no commit published")
        if caps.retirable:
            out.removed += cast(Retirable, coordinator).retire_records(dry_run=True)
        journal = beside_target(coordinator, caps.journal_home, setup.sink_id)
        if journal is not None:
            n = len(journal.files())
            if n:
                out.removed.append(f"{n} file(s) of the batch journal in {journal.ckpt.location}")
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
        "the target's data, and what its readers find it by (the file sink's manifests under "
        "_eosink/commits)"
    )
    out.kept.append(
        f"the sink's row in the meta store, the record of the retirement: a later run under "
        f"sink_id {setup.sink_id!r} writes epochs above {out.high} (a new checkpoint needs "
        "new_checkpoint='continue', as on any sink with history)"
    )
    out.kept.append(
        "streaming checkpoints: delete them yourself (a query restarted on one goes on from "
        f"its offsets, with its next micro-batches above epoch {out.high})"
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

    rt = open_runtime(setup, retiring=True)  # fences every other coordinator; init runs
    try:
        caps, coordinator = rt.caps, rt.coordinator
        marker = cast(TargetMarker, coordinator).read_marker() if caps.target_marker else None
        out = _begin(rt.store, setup.sink_id, marker)
        staged = _staged(coordinator, caps)
        if staged:
            out.removed.append(f"staged data of epoch(s) {staged} that no commit published")
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
        journal = rt.target_journal()
        if journal is not None:
            n = journal.remove()
            if n:
                out.removed.append(f"{n} file(s) of the batch journal in {journal.ckpt.location}")
        still = _staged(coordinator, caps)
        if still:
            out.kept.append(
                f"staged data under epoch(s) {still}, which are committed (it is never offered "
                "to an abort)"
            )
        _what_stays(out, caps, setup)
        log.info(
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
