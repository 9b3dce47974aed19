"""The recovery rules as pure functions (eosink/_rules.py), checked exhaustively.

Every combination of PENDING epochs up to a bound (4 epochs, each of 6 origins or absent),
every first epoch and both kinds of start, for a batch run with ``epoch=``, one without and
a stream, is planned, and each plan is checked against what docs/concepts.md promises,
stated here independently of the code (no rule is re-derived from the function it checks).
No meta store, plugin or Spark: the whole check takes seconds. The plans are the ones
``SinkRuntime.recover`` applies, so the crash tests and the model checker (test_model.py)
check the same decisions with real state.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from eosink import _rules
from eosink._metastore import BATCH, BATCH_AUTO, BATCH_AUTO_UNREPORTED
from eosink._rules import PendingEpoch, Step, plan_pending, sweep_staged

STREAM, OTHER_STREAM = "lineage-a", "lineage-b"
LINEAGES = (BATCH, BATCH_AUTO, STREAM)
ORIGINS = (None, BATCH, BATCH_AUTO, BATCH_AUTO_UNREPORTED, STREAM, OTHER_STREAM)
EPOCHS = range(4)


def _pending_sets() -> list[list[PendingEpoch]]:
    out = []
    for chosen in itertools.product((False, *ORIGINS), repeat=len(EPOCHS)):
        out.append(
            [PendingEpoch(e, o) for e, o in zip(EPOCHS, chosen, strict=True) if o is not False]
        )
    return out


def test_plan_pending_keeps_every_promise_over_every_state() -> None:
    checked = 0
    for pending in _pending_sets():
        for lineage, first, hold in itertools.product(LINEAGES, range(6), (False, True)):
            plan = plan_pending(lineage, pending, first, hold=hold)
            _check_plan(lineage, pending, first, hold, plan)
            checked += 1
    assert checked == 7**4 * 3 * 6 * 2


def _check_plan(
    lineage: str, pending: list[PendingEpoch], first: int, hold: bool, plan: tuple[Step, ...]
) -> None:
    ctx = (lineage, pending, first, hold, plan)
    stream = lineage not in (BATCH, BATCH_AUTO)
    decisions = [s for s in plan if s.kind != "retag"]
    # Each PENDING epoch is decided exactly once, in the store's order, and nothing else.
    assert [s.epoch for s in decisions] == [p.epoch for p in pending], ctx
    for p, step in zip(pending, decisions, strict=True):
        written_by_this_stream = stream and p.origin in (None, lineage)
        checkpointed = written_by_this_stream and p.epoch < first
        if step.kind == "abort":
            # A checkpointed epoch is never aborted; neither is another run's complete one
            # (rule 7), nor anything a batch run finds; nor anything a holding start finds.
            assert written_by_this_stream and not checkpointed and not hold, ctx
        if not written_by_this_stream or checkpointed:
            assert step.kind == "commit", ctx  # rules 1 and 7: complete data is committed
        else:
            # This stream's epoch Spark writes again: aborted now, or at the first
            # micro-batch when the start holds it (rule 2).
            assert step.kind == ("defer" if hold else "abort"), ctx
    # A crashed run without epoch= is re-tagged right before another run commits its epoch,
    # so that the next run without epoch= still reports it; never otherwise.
    for i, step in enumerate(plan):
        if step.kind == "retag":
            assert lineage != BATCH_AUTO, ctx
            assert plan[i + 1] == Step("commit", step.epoch), ctx
    retagged = {s.epoch for s in plan if s.kind == "retag"}
    expected = {p.epoch for p in pending if p.origin == BATCH_AUTO and lineage != BATCH_AUTO}
    assert retagged == expected, ctx


def test_sweep_keeps_what_has_a_committable_or_is_visible_or_held() -> None:
    """Rule 4 over every staged, live and committed set of 4 epochs: staged data survives
    exactly when its epoch is live (PENDING, or being written), visible, or held for a
    stream's first micro-batch; the visible ones are asked about, nothing else is."""
    sets = [frozenset(c) for n in range(len(EPOCHS) + 1) for c in itertools.combinations(EPOCHS, n)]
    for staged, live, committed in itertools.product(sets, repeat=3):
        for first, hold in itertools.product(range(5), (False, True)):
            asked: list[int] = []

            def is_committed(
                e: int, committed: frozenset[int] = committed, asked: list[int] = asked
            ) -> bool:
                asked.append(e)
                return e in committed

            swept = sweep_staged(staged, live, is_committed, first, hold=hold)
            ctx = (staged, live, committed, first, hold, swept)
            assert list(swept) == sorted(swept), ctx
            for e in staged:
                survives = e in live or e in committed or (hold and e >= first)
                assert (e not in swept) == survives, ctx
            assert set(asked) <= staged - live, ctx
            assert not set(swept) - staged, ctx


def test_concepts_names_the_function_of_each_rule() -> None:
    """docs/concepts.md's table of rule -> function names functions of eosink/_rules.py
    that exist, and every decision function there is in the table."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "concepts.md").read_text()
    table = text[text.index("| rule | decided by |") :].split("\n\n", 1)[0]
    named = set(re.findall(r"`_rules\.(\w+)`", table))
    assert named, table
    missing = {n for n in named if not callable(getattr(_rules, n, None))}
    assert not missing, f"docs/concepts.md names functions _rules lacks: {missing}"
    deciders = {
        n
        for n in _rules.__all__
        if callable(getattr(_rules, n)) and n[0].islower() and n != "is_own_epoch"
    }
    assert deciders <= named, f"not in docs/concepts.md's rule table: {deciders - named}"


def test_decide_batch_epoch_over_every_record() -> None:
    """Rule 5 for a batch run with ``epoch=``, over every record of the epoch (none, or each
    status with each origin), every answer of the target's batch journal and every highest
    stream epoch: a committed epoch is never written again, only an explicit batch run's is
    skipped, another kind of run's is refused, and an unknown epoch is written only above
    every stream's."""
    from eosink._metastore import ABORTED, COMMITTED, PENDING
    from eosink._rules import KnownEpoch, Refusal, decide_batch_epoch

    n = 0
    for epoch, high, at_target in itertools.product(range(4), range(-1, 5), (None, *ORIGINS[1:3])):
        records: list[KnownEpoch | None] = [None]
        records += [KnownEpoch(epoch, s, o) for s in (PENDING, COMMITTED, ABORTED) for o in ORIGINS]
        for rec in records:
            d = decide_batch_epoch(epoch, rec, at_target, high)
            ctx = (epoch, rec, at_target, high, d)
            n += 1
            if isinstance(d, Refusal):
                kind = "refuse"
            else:
                kind, got = d
                assert got == epoch, ctx
            if rec is None:
                if at_target == BATCH:
                    assert kind == "skip", ctx  # the target knows an explicit run did it
                elif at_target == BATCH_AUTO:
                    assert kind == "refuse", ctx  # a run without epoch= had it
                else:
                    assert kind == ("write" if epoch > high else "refuse"), ctx
                continue
            auto = rec.origin in (BATCH_AUTO, BATCH_AUTO_UNREPORTED)
            streams = rec.origin in (STREAM, OTHER_STREAM)
            if streams or (auto and rec.status != ABORTED):
                assert kind == "refuse", ctx  # cannot tell whether this run repeats it
            elif rec.status == COMMITTED:
                assert kind == "skip", ctx  # never written twice
            elif rec.status == PENDING:
                assert kind == "finish", ctx  # a crashed run's complete data
            else:
                assert kind == "write", ctx  # aborted: written again
    assert n == 4 * 6 * 3 * 19


def test_decide_stream_epoch_over_every_record() -> None:
    """Rule 5 for a stream's epoch over every record (none, or each status with each
    origin), every garbage-collection floor and every answer of the stream's journal: a
    committed epoch is never written again, another run's epoch is never touched, an
    aborted one is aborted before it is written again."""
    from eosink._metastore import ABORTED, COMMITTED, PENDING
    from eosink._rules import KnownEpoch, Refusal, decide_stream_epoch

    n = 0
    for epoch, floor, has_journal, entry in itertools.product(
        range(4), (None, -1, 0, 1, 2, 3, 4), (False, True), ORIGINS
    ):
        records: list[KnownEpoch | None] = [None]
        records += [KnownEpoch(epoch, s, o) for s in (PENDING, COMMITTED, ABORTED) for o in ORIGINS]
        for rec in records:
            d = decide_stream_epoch(epoch, STREAM, rec, floor, entry, has_journal=has_journal)
            ctx = (epoch, rec, floor, has_journal, entry, d)
            n += 1
            kind = "refuse" if isinstance(d, Refusal) else d[0]
            if not isinstance(d, Refusal):
                assert d[1] == epoch, ctx
            if rec is None:
                if floor is None or epoch > floor:
                    assert kind == "write", ctx  # never used
                elif has_journal and entry != STREAM:
                    assert kind == "refuse", ctx  # committed, and not by this stream
                else:
                    assert kind == "skip", ctx  # this stream's committed epoch, replayed
            elif rec.origin not in (None, STREAM):
                assert kind == "refuse", ctx  # another run's: never skipped or rewritten
            elif rec.status == COMMITTED:
                assert kind == "skip", ctx
            elif rec.status == PENDING:
                assert kind == "finish", ctx
            else:
                assert kind == "abort-then-write", ctx
    assert n == 4 * 7 * 2 * 6 * 19
