"""Rules 3 and 9 of docs/concepts.md and the rest: the journal entries a start takes, the aborts it
finishes, the epoch of a run without ``epoch=``, and what a commit attempt's outcome means."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Literal

from .._metastore.models import ABORTED, PENDING
from .._metastore.records import (
    BATCH_AUTO,
    BATCH_AUTO_UNREPORTED,
    BATCH_ORIGINS,
)
from .outcomes import WRITE
from .runs import KnownEpoch


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
    return tuple(
        e
        for e in sorted(entries)
        if (retired_high is None or e > retired_high)
        and e <= upto
        and e not in have
        and entries[e] == lineage
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
