"""The protocol's recovery decisions as pure functions: records in, a plan out.

The rules live in four modules: :mod:`.outcomes` (the answers), :mod:`.recovery`
(rules 1, 2, 4 and 7), :mod:`.runs` (rules 5, 6 and 8) and :mod:`.journals` (rules 3 and 9,
the run without ``epoch=`` and a commit's outcome); this package re-exports them.
Each function is named after what it decides, and docs/concepts.md's numbered recovery rules
name the function that decides each of them (a test keeps that table and this module in
step). Nothing here reads or changes state: :meth:`eosink._protocol.SinkRuntime.recover`
reads the records, asks these functions for a plan and applies it, step by step and in the
plan's order. So a decision can be checked exhaustively, over every combination of records
up to a bound, without a meta store, a plugin or Spark (``tests/test_rules.py``).
"""

from __future__ import annotations

from .journals import (
    UnfinishedRun,
    aborts_to_finish,
    after_commit_attempt,
    decide_auto_epoch,
    journal_entries_to_take,
    target_entries_to_take,
    unrecorded_checkpointed,
)
from .outcomes import (
    FINISH,
    SKIP,
    WRITE,
)
from .recovery import (
    PendingEpoch,
    Step,
    abort_uncheckpointed,
    commit_checkpointed,
    commit_other_runs,
    discard_failed_micro_batch,
    discard_refused_micro_batch,
    is_own_epoch,
    plan_pending,
    report_crashed_auto_run,
    sweep_staged,
)
from .runs import (
    KnownEpoch,
    Rebase,
    Refusal,
    base_of_fresh_checkpoint,
    decide_batch_epoch,
    decide_stream_epoch,
    move_base_above_other_runs,
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
    "UnfinishedRun",
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
