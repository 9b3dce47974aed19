"""The protocol's recovery decisions as pure functions: records in, a plan out.

Each function is named after what it decides, and docs/concepts.md's numbered recovery rules
name the function that decides each of them (a test keeps that table and this module in
step). Nothing here reads or changes state: :meth:`eosink._protocol.SinkRuntime.recover`
reads the records, asks these functions for a plan and applies it, step by step and in the
plan's order. So a decision can be checked exhaustively, over every combination of records
up to a bound, without a meta store, a plugin or Spark (``tests/test_rules.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Final, Literal

from ._metastore.models import ABORTED, COMMITTED, PENDING
from ._metastore.records import (
    AUTO_ORIGINS,
    BATCH,
    BATCH_AUTO,
    BATCH_AUTO_UNREPORTED,
    BATCH_ORIGINS,
)

__all__ = [
    "FINISH",
    "SKIP",
    "WRITE",
    "KnownEpoch",
    "PendingEpoch",
    "Rebase",
    "Refusal",
    "Step",
    "abort_uncheckpointed",
    "aborts_to_finish",
    "after_commit_attempt",
    "base_of_fresh_checkpoint",
    "commit_checkpointed",
    "commit_other_runs",
    "decide_auto_epoch",
    "decide_batch_epoch",
    "decide_stream_epoch",
    "discard_failed_micro_batch",
    "discard_refused_micro_batch",
    "is_own_epoch",
    "journal_entries_to_take",
    "move_base_above_other_runs",
    "plan_pending",
    "report_crashed_auto_run",
    "sweep_staged",
    "target_entries_to_take",
    "unrecorded_checkpointed",
]

StepKind = Literal["retag", "commit", "abort", "defer"]

SKIP: Final = "skip"
"""A decision: the epoch is committed already; the run's output for it is discarded."""
FINISH: Final = "finish"
"""A decision: the epoch is PENDING from a crashed run; it is committed from its record."""
WRITE: Final = "write"
"""A decision: the epoch is written (new, or ABORTED and written again)."""


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
        "fresh-checkpoint",
        "retired-epoch",
    ]


BatchDecision = tuple[Literal["skip", "finish", "write"], int] | Refusal


def decide_batch_epoch(
    epoch: int,
    rec: KnownEpoch | None,
    committed_at_target: str | None,
    stream_high: int,
    retired_high: int | None = None,
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

    An epoch without a record at or below ``retired_high`` (``eosink retire`` retired the
    sink with epochs up to it; None: never retired) is refused: it was the retired sink's,
    and its target may still hold it (an Iceberg snapshot summary cannot be deleted).

    ``committed_at_target`` is read only when ``rec`` is None (``stream_high`` when both
    are): a caller may pass anything otherwise.
    """
    if rec is not None:
        if rec.origin in AUTO_ORIGINS and rec.status in (COMMITTED, PENDING):
            return Refusal("auto-epoch")
        if rec.origin not in (None, *BATCH_ORIGINS):
            return Refusal("stream-epoch")
        if rec.status == COMMITTED:
            return (SKIP, epoch)
        return (FINISH if rec.status == PENDING else WRITE, epoch)
    if retired_high is not None and epoch <= retired_high:
        return Refusal("retired-epoch")
    if committed_at_target == BATCH:
        return (SKIP, epoch)  # committed by a batch run the meta store does not know
    if committed_at_target == BATCH_AUTO:
        return Refusal("auto-epoch-at-target")
    if epoch <= stream_high:
        return Refusal("unknown-below-stream-high")
    return (WRITE, epoch)


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
            return (WRITE, epoch)
        if has_journal and journal_origin != lineage:
            return Refusal("other-run-gc-epoch")
        return (SKIP, epoch)
    if rec.status == ABORTED:
        return ("abort-then-write", epoch)
    return (SKIP if rec.status == COMMITTED else FINISH, epoch)


def base_of_fresh_checkpoint(
    last_epoch: int, next_batch: int, new_checkpoint: str
) -> int | Refusal:
    """Rule 6: the epoch base of a checkpoint new to the sink (its lineage unknown), whose
    next batch id is ``next_batch``. A sink without epochs (``last_epoch`` -1) maps batch 0 to
    epoch 0. A sink with history refuses (a fresh checkpoint re-reads the source from its
    starting offsets), unless ``new_checkpoint == "continue"``: the query's epochs then
    start right after ``last_epoch``. A retired sink (``eosink retire``) has history: its
    retired epochs count (its target still holds their rows)."""
    if last_epoch < 0:
        return -next_batch
    if new_checkpoint != "continue":
        return Refusal("fresh-checkpoint")
    return last_epoch + 1 - next_batch


@dataclass(frozen=True)
class Rebase:
    """Rule 8's plan: the stream's epoch base, and whether the PENDING epochs the start held
    at or above its first epoch are aborted first (the base moved: below the new base they
    would count as checkpointed)."""

    base: int
    abort_held: bool = False


def move_base_above_other_runs(
    lineage: str,
    base: int,
    next_batch: int,
    records: Iterable[KnownEpoch],
    journal: Mapping[int, str | None] | None,
    adopted_last: int | None,
    gc_floor: int | None,
    *,
    held: bool,
) -> Rebase:
    """Rule 8: a resumed stream (first epoch ``base + next_batch``) whose next epochs were
    taken meanwhile by other runs moves its base so that its first epoch is right above
    every used one: other runs' records, the epoch the store knows only from the target's
    marker (``adopted_last``) and the GC floor (``gc_floor``: committed epochs whose rows are
    gone, not this query's since those would be below its checkpoint or in its journal).

    The base stays when this query's own epochs lie ahead (an ``inline`` commit before
    Spark's checkpoint), as records or, garbage-collected, as entries of its ``journal``
    (epoch -> origin; None without one). PENDING ones the start ``held`` do not count: they
    are aborted if the base moves."""
    records = list(records)
    first = base + next_batch
    own_ahead = [r for r in records if r.origin in (None, lineage) and r.epoch >= first]
    held_ahead = [r for r in own_ahead if held and r.status == PENDING]
    if len(own_ahead) > len(held_ahead):
        return Rebase(base)
    have = {r.epoch for r in records}
    if journal is not None and any(
        e >= first and e not in have and o == lineage for e, o in journal.items()
    ):
        return Rebase(base)
    used = [r.epoch for r in records if r.origin not in (None, lineage)]
    used += [e for e in (adopted_last, gc_floor) if e is not None]
    if not used or max(used) < first:
        return Rebase(base)
    return Rebase(max(used) + 1 - next_batch, abort_held=bool(held_ahead))


def journal_entries_to_take(
    entries: Mapping[int, str | None],
    have: Set[int],
    lineage: str,
    upto: int,
    retired_high: int | None = None,
) -> tuple[int, ...]:
    """Rule 9: the epochs of the stream's journal (epoch -> origin) that the meta store lacks
    (``have``: its records and the epochs an operator abandoned) up to ``upto`` (what Spark
    checkpointed; every epoch in ``inline`` mode), in epoch order: they are persisted PENDING
    and rule 1 commits them. Entries at or below ``retired_high`` are not: they are epochs of
    a retired sink (``eosink retire`` finds none PENDING), committed, and the target's record
    of them may be gone (a SQL sink's ``sql_epochs`` rows), so a commit would apply them
    again."""
    floor = -1 if retired_high is None else retired_high
    return tuple(
        e for e in sorted(entries) if floor < e <= upto and e not in have and entries[e] == lineage
    )


def unrecorded_checkpointed(
    checkpointed: int,
    have: Set[int],
    gc_floor: int,
    journal_oldest: int | None,
    first_of_base: int,
) -> tuple[int, ...]:
    """Rule 9's refusal: the epochs Spark checkpointed (up to ``checkpointed``) that no
    record holds, after the journal was taken. Epochs up to the store's ``gc_floor`` (-1
    when nothing was collected) are committed, so are those below the journal's oldest entry
    (an entry is deleted only once a later epoch is committed) and those below
    ``first_of_base`` (the query's batches before its base moved, other runs' epochs now,
    checked then). Any other missing epoch refuses the start: its data may be lost, and only
    the user can accept that."""
    floor = max(gc_floor, first_of_base - 1)
    if journal_oldest is not None:
        floor = max(floor, journal_oldest - 1)
    return tuple(e for e in range(floor + 1, checkpointed + 1) if e not in have)


def target_entries_to_take(
    entries: Mapping[int, str | None],
    have: Set[int],
    committed_at_target: Callable[[int], str | None],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rule 9 for the target's own journal (the file sink on local paths: every run's PENDING
    epochs, batch runs' and streams'): ``(take, forget)`` in epoch order. An entry the meta
    store lacks (``have``: its records and abandoned epochs) is a crashed run's PENDING
    epoch: taken (persisted PENDING; rule 7 commits it), unless it is a batch run's that the
    target's batch journal already shows committed (``committed_at_target``, asked only of
    such entries): then its deletion was cut short, and it is forgotten."""
    take: list[int] = []
    forget: list[int] = []
    for e in sorted(entries):
        if e in have:
            continue
        if entries[e] in BATCH_ORIGINS and committed_at_target(e) is not None:
            forget.append(e)
        else:
            take.append(e)
    return tuple(take), tuple(forget)


def aborts_to_finish(records: Iterable[KnownEpoch]) -> tuple[int, ...]:
    """Rule 3: every ABORTED epoch, in epoch order, has its staged data aborted (again: an
    abort cut short by a crash, or one whose plugin raised, is retried at every start)."""
    return tuple(sorted(r.epoch for r in records if r.status == ABORTED))


@dataclass(frozen=True)
class UnfinishedRun:
    """Rule 5 for a run without ``epoch=``: earlier such runs crashed with their data
    complete. Their epochs are committed and reported, and this run is refused
    (:class:`~eosink.errors.UnfinishedRunError`): it cannot tell whether it repeats them."""

    in_store: tuple[int, ...]
    """Their epochs the meta store knows (PENDING, or committed by another run's recovery)."""
    elsewhere: tuple[int, ...]
    """Those only the target's batch journal knows (the store that knew them is lost)."""


def decide_auto_epoch(
    records: Iterable[KnownEpoch], unreported_at_target: Iterable[int], max_epoch: int
) -> tuple[Literal["write"], int] | UnfinishedRun:
    """Rule 5 for a batch run without ``epoch=``: the next free epoch (above ``max_epoch``,
    the highest the sink used), unless an earlier run without ``epoch=`` crashed after its
    data was complete: a ``batch-auto`` epoch still PENDING, one another run's recovery
    committed since (``batch-auto-unreported``), or one the target's batch journal lists as
    unreported (``unreported_at_target``)."""
    crashed = {
        r.epoch
        for r in records
        if r.origin == BATCH_AUTO_UNREPORTED or (r.origin == BATCH_AUTO and r.status == PENDING)
    }
    elsewhere = {e for e in unreported_at_target if e not in crashed}
    if crashed or elsewhere:
        return UnfinishedRun(tuple(sorted(crashed)), tuple(sorted(elsewhere)))
    return (WRITE, max_epoch + 1)


CommitKind = Literal["done", "already_committed", "retry_later", "failed"]


def after_commit_attempt(
    kind: CommitKind, first_failure_at: float | None, now: float, retry_max_s: float
) -> Literal["committed", "retry", "fail"]:
    """What phase 2 does after one call of the plugin's ``commit`` returned ``kind`` (an
    error raised is ``retry_later`` when transient, else ``failed``): ``committed`` (mark
    the epoch COMMITTED: this call made it visible, or the target had it), ``retry`` (call
    ``commit`` again after a backoff) or ``fail`` (the epoch stays PENDING; the run stops
    with the reason). A ``retry_later`` is retried while the retry window lasts:
    ``retry_max_s`` from the epoch's first failed attempt (``first_failure_at``, this one's
    when None), so an attempt that itself blocked long (a call waiting through a broker
    outage) is still retried."""
    if kind in ("done", "already_committed"):
        return "committed"
    if kind == "failed":
        return "fail"
    start = now if first_failure_at is None else first_failure_at
    return "retry" if now - start <= retry_max_s else "fail"
