"""Rules 5, 6 and 8 of docs/concepts.md: the epoch a batch run or a micro-batch writes,
skips or finishes, and the epoch base of a stream's checkpoint."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from .._metastore.models import ABORTED, COMMITTED, PENDING
from .._metastore.records import (
    AUTO_ORIGINS,
    BATCH,
    BATCH_AUTO,
    BATCH_ORIGINS,
)
from .outcomes import FINISH, SKIP, WRITE


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
