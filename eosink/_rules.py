"""The protocol's recovery decisions as pure functions: records in, a plan out.

Each function is named after what it decides, and docs/concepts.md's numbered recovery rules
name the function that decides each of them (a test keeps that table and this module in
step). Nothing here reads or changes state: :meth:`eosink._protocol.SinkRuntime.recover`
reads the records, asks these functions for a plan and applies it, step by step and in the
plan's order. So a decision can be checked exhaustively, over every combination of records
up to a bound, without a meta store, a plugin or Spark (``tests/test_rules.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from typing import Literal

from ._metastore.models import ABORTED, COMMITTED, PENDING
from ._metastore.store import AUTO_ORIGINS, BATCH, BATCH_AUTO, BATCH_ORIGINS

__all__ = [
    "KnownEpoch",
    "PendingEpoch",
    "Refusal",
    "Step",
    "abort_uncheckpointed",
    "commit_checkpointed",
    "commit_other_runs",
    "decide_batch_epoch",
    "decide_stream_epoch",
    "is_own_epoch",
    "plan_pending",
    "report_crashed_auto_run",
    "sweep_staged",
]

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


@dataclass(frozen=True)
class KnownEpoch:
    """An epoch's record in the meta store, as a decision sees it."""

    epoch: int
    status: str
    origin: str | None


@dataclass(frozen=True)
class Refusal:
    """A run refused before anything is written: which rule, and the facts its error names."""

    reason: Literal[
        "auto-epoch",
        "auto-epoch-at-target",
        "stream-epoch",
        "unknown-below-stream-high",
        "other-run-epoch",
        "other-run-gc-epoch",
    ]


BatchDecision = tuple[Literal["skip", "finish", "write"], int] | Refusal


def decide_batch_epoch(
    epoch: int,
    rec: KnownEpoch | None,
    committed_at_target: str | None,
    stream_high: int,
) -> BatchDecision:
    """Rule 5 for a batch run with ``epoch=`` (what it does with that epoch), from the
    epoch's record, else from the target's batch journal (``committed_at_target``: the
    origin of the run that committed it there, ``batch`` or ``batch-auto``), else from the
    highest epoch any stream of the sink used.

    An epoch is skipped only when a batch run with that explicit epoch committed it; one
    never written is written, also below the newest (a backfill). An epoch given to a run
    without ``epoch=`` or written by a stream is refused (the run cannot tell whether it
    repeats it), and so is one eosink has no record of at or below ``stream_high`` (it may be
    a stream's, garbage-collected). A PENDING one is finished; an ABORTED one written again.

    ``committed_at_target`` is read only when ``rec`` is None (``stream_high`` when both
    are): a caller may pass anything otherwise.
    """
    if rec is not None:
        if rec.origin in AUTO_ORIGINS and rec.status in (COMMITTED, PENDING):
            return Refusal("auto-epoch")
        if rec.origin not in (None, *BATCH_ORIGINS):
            return Refusal("stream-epoch")
        if rec.status == COMMITTED:
            return ("skip", epoch)
        return ("finish" if rec.status == PENDING else "write", epoch)
    if committed_at_target == BATCH:
        return ("skip", epoch)  # committed by a batch run the meta store does not know
    if committed_at_target == BATCH_AUTO:
        return Refusal("auto-epoch-at-target")
    if epoch <= stream_high:
        return Refusal("unknown-below-stream-high")
    return ("write", epoch)


StreamDecision = tuple[Literal["skip", "finish", "write", "abort-then-write"], int] | Refusal


def decide_stream_epoch(
    epoch: int,
    lineage: str,
    rec: KnownEpoch | None,
    gc_floor: int | None,
    journal_origin: str | None,
    *,
    has_journal: bool,
) -> StreamDecision:
    """Rule 5 for a stream's epoch (``base + batchId``): a replay of a committed epoch is
    skipped, a PENDING one finished, an ABORTED one's staged data aborted and the epoch
    written again, a new one written. An epoch another run wrote (a batch job, another
    checkpoint) while this query ran is refused: restarting the query moves its epochs
    above every used one (rule 8).

    ``gc_floor``: epochs up to it are committed with their rows garbage-collected (or known
    from the target's marker); None without a sink row. Such an epoch is this stream's replay
    only if its journal (``has_journal``) keeps its entry with this lineage
    (``journal_origin``: the entry's origin, None without one); without a journal it is
    skipped. ``journal_origin`` is read only for an epoch without a record at or below
    ``gc_floor``."""
    if rec is not None and rec.origin not in (None, lineage):
        return Refusal("other-run-epoch")
    if rec is None:
        if gc_floor is None or epoch > gc_floor:
            return ("write", epoch)
        if has_journal and journal_origin != lineage:
            return Refusal("other-run-gc-epoch")
        return ("skip", epoch)
    if rec.status == ABORTED:
        return ("abort-then-write", epoch)
    return ("skip" if rec.status == COMMITTED else "finish", epoch)
