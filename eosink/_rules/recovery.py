"""Rules 1, 2, 4 and 7 of docs/concepts.md: what a start does with the PENDING epochs
it finds, and with staged data that no committable holds; and the two discards of
``format("eosink")``'s micro-batches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from typing import Literal

from .._metastore.models import COMMITTED
from .._metastore.records import (
    BATCH_AUTO,
    BATCH_ORIGINS,
)

StepKind = Literal["retag", "commit", "abort", "defer"]


@dataclass(frozen=True)
class PendingEpoch:
    """A PENDING epoch's record as a decision sees it."""

    epoch: int
    origin: str | None
    """The run that wrote it: a stream's lineage, ``batch``, ``batch-auto``... (None: a
    store older than origins, taken as the stream's own)."""


@dataclass(frozen=True)
class Step:
    """One step of a plan: ``retag`` (a crashed run's ``batch-auto`` epoch becomes
    ``batch-auto-unreported`` before another run commits it), ``commit`` (phase 2, then
    COMMITTED), ``abort`` (marked ABORTED; its staged data is deleted by rule 3) or ``defer``
    (left PENDING: a stream's start decides it at its first micro-batch)."""

    kind: StepKind
    epoch: int


def is_own_epoch(lineage: str, origin: str | None) -> bool:
    """Whether an epoch was written by this run's stream (its lineage), so that Spark's
    checkpoint says whether it will be written again. A batch run owns none: each of its
    PENDING epochs is a crashed run's complete one."""
    return lineage not in BATCH_ORIGINS and origin in (None, lineage)


def report_crashed_auto_run(lineage: str, origin: str | None) -> bool:
    """Whether a PENDING epoch of a crashed run without ``epoch=`` must be re-tagged before
    this run commits it: unless this run is itself one without ``epoch=`` (whose decision
    reports it), the next such run must still refuse with ``UnfinishedRunError``, since only
    it can tell the user that a re-run of the crashed job would repeat it."""
    return origin == BATCH_AUTO and lineage != BATCH_AUTO


def commit_checkpointed(lineage: str, rec: PendingEpoch, first_epoch: int) -> bool:
    """Rule 1: this stream's PENDING epoch below the run's first epoch is checkpointed by
    Spark (it re-runs only the last batch that was not): it is committed."""
    return is_own_epoch(lineage, rec.origin) and rec.epoch < first_epoch


def commit_other_runs(lineage: str, rec: PendingEpoch) -> bool:
    """Rule 7: a PENDING epoch of another run (a crashed batch job, another checkpoint) holds
    complete data: it is committed, never aborted (a replay of it is then skipped, rule 5)."""
    return not is_own_epoch(lineage, rec.origin)


def abort_uncheckpointed(lineage: str, rec: PendingEpoch, first_epoch: int, hold: bool) -> bool:
    """Rule 2: this stream's PENDING epoch at or above the run's first epoch will be written
    again: it is aborted, unless the stream's start holds it (``hold``: Spark has not fixed
    yet which batch it runs first, and an older driver, fenced but alive, may still get it
    checkpointed; it is decided at the first micro-batch)."""
    return is_own_epoch(lineage, rec.origin) and rec.epoch >= first_epoch and not hold


def plan_pending(
    lineage: str, pending: Iterable[PendingEpoch], first_epoch: int, *, hold: bool = False
) -> tuple[Step, ...]:
    """Rules 1, 2 and 7 over the sink's PENDING epochs, in the order given (the store's:
    by epoch), before ``first_epoch`` is pre-committed. Each epoch gets exactly one of
    commit, abort or defer, a re-tag first where :func:`report_crashed_auto_run` says so."""
    steps: list[Step] = []
    for rec in pending:
        if report_crashed_auto_run(lineage, rec.origin):
            steps.append(Step("retag", rec.epoch))
        if commit_checkpointed(lineage, rec, first_epoch) or commit_other_runs(lineage, rec):
            steps.append(Step("commit", rec.epoch))
        elif abort_uncheckpointed(lineage, rec, first_epoch, hold):
            steps.append(Step("abort", rec.epoch))
        else:
            steps.append(Step("defer", rec.epoch))
    return tuple(steps)


def sweep_staged(
    staged: Iterable[int],
    live: Set[int],
    is_committed: Callable[[int], bool],
    first_epoch: int,
    *,
    hold: bool = False,
) -> tuple[int, ...]:
    """Rule 4: the epochs whose staged data is deleted, in epoch order: staged data of an
    epoch that has no committable (a crash before phase 1 was durable, failed task attempts).

    ``live``: epochs still PENDING after rules 1-3, and those being written right now;
    ``is_committed`` (a read, asked only of the candidates): whether an epoch is visible; its
    data is never offered to an abort. Under ``hold`` (a stream's start) epochs at or above
    ``first_epoch`` wait for its first micro-batch, as in :func:`abort_uncheckpointed`."""
    return tuple(
        e
        for e in sorted(set(staged) - set(live))
        if not (hold and e >= first_epoch) and not is_committed(e)
    )


def discard_failed_micro_batch(status: str | None) -> bool:
    """Rule 4 for a ``format("eosink")`` micro-batch that Spark aborted (a task failed for
    good): whether an epoch its tasks wrote is discarded now, from its record's ``status``
    (None: no record). An epoch without a record, or COMMITTED (the micro-batch was a replay
    of a committed epoch): its output has no committable, and no later start deletes staged
    data under a committed epoch (``abort(e, None)`` deletes only what no commit published,
    as for a replay's output discarded at its commit). A PENDING epoch's staged data is its
    committable's (rule 1 or 2 decides it), an ABORTED one's is deleted by rule 3."""
    return status in (None, COMMITTED)


def discard_refused_micro_batch(status: str | None) -> bool:
    """Rule 4 for a ``format("eosink")`` micro-batch refused at its commit (rule 8: another
    run took its epoch; this front end's tasks write before the decision): whether the
    epoch's staged output is discarded now, from its record's ``status`` (None: no record,
    or collected). Without a record, or COMMITTED by that other run: the output has no
    committable, and no later start deletes staged data under a committed epoch (rule 4
    never touches a visible epoch). A PENDING epoch's staged data is its run's."""
    return status in (None, COMMITTED)
