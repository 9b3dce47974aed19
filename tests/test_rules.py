"""The recovery rules as pure functions (eosink/_rules/), checked exhaustively.

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
            if not hold:  # a recovery holds nothing unless asked to
                assert plan_pending(lineage, pending, first) == plan
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
            if not hold:
                assert sweep_staged(staged, live, committed.__contains__, first) == swept
            ctx = (staged, live, committed, first, hold, swept)
            assert list(swept) == sorted(swept), ctx
            for e in staged:
                survives = e in live or e in committed or (hold and e >= first)
                assert (e not in swept) == survives, ctx
            assert set(asked) <= staged - live, ctx
            assert not set(swept) - staged, ctx


def test_concepts_names_the_function_of_each_rule() -> None:
    """docs/concepts.md's table of rule -> function names functions of eosink/_rules/
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
    every stream's and above a retired sink's (``eosink retire``)."""
    from eosink._metastore import ABORTED, COMMITTED, PENDING
    from eosink._rules import KnownEpoch, Refusal, decide_batch_epoch

    n = 0
    for epoch, high, at_target, retired in itertools.product(
        range(4), range(-1, 5), (None, *ORIGINS[1:3]), (None, 1)
    ):
        records: list[KnownEpoch | None] = [None]
        records += [KnownEpoch(epoch, s, o) for s in (PENDING, COMMITTED, ABORTED) for o in ORIGINS]
        for rec in records:
            d = decide_batch_epoch(epoch, rec, at_target, high, retired)
            ctx = (epoch, rec, at_target, high, retired, d)
            n += 1
            if isinstance(d, Refusal):
                kind = "refuse"
            else:
                kind, got = d
                assert got == epoch, ctx
            reason = d.reason if isinstance(d, Refusal) else None
            if rec is None:
                if retired is not None and epoch <= retired:
                    assert reason == "retired-epoch", ctx  # its target may still hold it
                elif at_target == BATCH:
                    assert kind == "skip", ctx  # the target knows an explicit run did it
                elif at_target == BATCH_AUTO:
                    assert reason == "auto-epoch-at-target", ctx  # a run without epoch= had it
                elif epoch > high:
                    assert kind == "write", ctx
                else:
                    assert reason == "unknown-below-stream-high", ctx  # maybe a stream's
                continue
            auto = rec.origin in (BATCH_AUTO, BATCH_AUTO_UNREPORTED)
            streams = rec.origin in (STREAM, OTHER_STREAM)
            # A refusal names why (each reason has its own error text: what to do differs).
            if streams:
                assert reason == "stream-epoch", ctx  # cannot tell whether this run repeats it
            elif auto and rec.status != ABORTED:
                assert reason == "auto-epoch", ctx
            elif rec.status == COMMITTED:
                assert kind == "skip", ctx  # never written twice
            elif rec.status == PENDING:
                assert kind == "finish", ctx  # a crashed run's complete data
            else:
                assert kind == "write", ctx  # aborted: written again
    assert n == 4 * 6 * 3 * 2 * 19


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
            reason = d.reason if isinstance(d, Refusal) else None
            if rec is None:
                if floor is None or epoch > floor:
                    assert kind == "write", ctx  # never used
                elif has_journal and entry != STREAM:
                    # committed, and not by this stream
                    assert reason == "other-run-gc-epoch", ctx
                else:
                    assert kind == "skip", ctx  # this stream's committed epoch, replayed
            elif rec.origin not in (None, STREAM):
                assert reason == "other-run-epoch", ctx  # another run's: never skipped or rewritten
            elif rec.status == COMMITTED:
                assert kind == "skip", ctx
            elif rec.status == PENDING:
                assert kind == "finish", ctx
            else:
                assert kind == "abort-then-write", ctx
    assert n == 4 * 7 * 2 * 6 * 19


def test_each_rule_alone_keeps_to_its_own_epochs() -> None:
    """Rules 1 and 2 decide only this stream's epochs, whatever else plan_pending asks
    first: another run's PENDING epoch is never 'checkpointed' by this stream, nor aborted by
    it (rule 7 commits it)."""
    from eosink._rules import abort_uncheckpointed, commit_checkpointed, commit_other_runs

    for lineage, origin, epoch, first, hold in itertools.product(
        LINEAGES, ORIGINS, EPOCHS, range(6), (False, True)
    ):
        rec = PendingEpoch(epoch, origin)
        ctx = (lineage, rec, first, hold)
        own = lineage not in (BATCH, BATCH_AUTO) and origin in (None, lineage)
        assert commit_checkpointed(lineage, rec, first) == (own and epoch < first), ctx
        assert abort_uncheckpointed(lineage, rec, first, hold) == (
            own and epoch >= first and not hold
        ), ctx
        assert commit_other_runs(lineage, rec) == (not own), ctx


def test_every_refusal_has_its_error() -> None:
    """Each reason a rule can refuse with has its own error text in the runtime, which
    builds the error from the reason."""
    import typing

    from eosink import _protocol
    from eosink._rules import Refusal

    reasons = typing.get_args(typing.get_type_hints(Refusal)["reason"])
    source = "".join(f.read_text() for f in Path(_protocol.__file__).parent.glob("*.py"))
    assert len(reasons) == 8
    assert not [r for r in reasons if f'"{r}"' not in source]


def test_fresh_checkpoint_refused_on_a_sink_with_history_or_continued_above_it() -> None:
    """Rule 6 for every last epoch, next batch id and choice: a sink without epochs maps the
    query's next batch to epoch 0; one with epochs refuses a fresh checkpoint unless told to
    continue, and then the query's next epoch is right after the sink's last."""
    from eosink._rules import Refusal, base_of_fresh_checkpoint

    for last, nxt, choice in itertools.product(range(-1, 6), range(5), ("refuse", "continue")):
        got = base_of_fresh_checkpoint(last, nxt, choice)
        ctx = (last, nxt, choice, got)
        if last < 0:
            assert got == -nxt, ctx
        elif choice == "refuse":
            assert got == Refusal("fresh-checkpoint"), ctx
        else:
            assert not isinstance(got, Refusal) and got + nxt == last + 1, ctx


_REBASE_STATES = (None, "P", "C", "A", "P-other", "C-other", "P-none")


def _rebase_records(chosen: tuple[str | None, ...]) -> list[_rules.KnownEpoch]:
    from eosink._metastore import ABORTED, COMMITTED, PENDING

    status = {"P": PENDING, "C": COMMITTED, "A": ABORTED}
    out = []
    for e, c in enumerate(chosen):
        if c is None:
            continue
        kind, _, who = c.partition("-")
        origin = {"": STREAM, "other": BATCH, "none": None}[who]
        out.append(_rules.KnownEpoch(e, status[kind], origin))
    return out


def test_rebase_moves_only_above_other_runs_and_never_past_its_own_epochs() -> None:
    """Rule 8 over every record set of 4 epochs (absent, or each status of this stream's,
    another run's, an origin-less one), bases, next batches, journals, marker and GC floor,
    with and without held epochs: the base never moves down; it stays when this stream's own
    epochs lie ahead (records not held, or journal entries without records); otherwise the
    first epoch lands right above the highest epoch used by others, and held PENDING epochs
    ahead are aborted exactly when it moves."""
    from eosink._metastore import PENDING
    from eosink._rules import move_base_above_other_runs

    n = 0
    journals: list[dict[int, str | None] | None] = [None, {4: STREAM}, {4: BATCH, 1: STREAM}]
    for chosen in itertools.product(_REBASE_STATES, repeat=len(EPOCHS)):
        records = _rebase_records(chosen)
        have = {r.epoch for r in records}
        for base, nxt, journal, adopted, floor, held in itertools.product(
            (0, 1), (0, 2), journals, (None, 3), (None, 2), (False, True)
        ):
            plan = move_base_above_other_runs(
                STREAM, base, nxt, records, journal, adopted, floor, held=held
            )
            ctx = (chosen, base, nxt, journal, adopted, floor, held, plan)
            n += 1
            first = base + nxt
            own = [r for r in records if r.origin in (None, STREAM) and r.epoch >= first]
            held_own = [r for r in own if held and r.status == PENDING]
            own_ahead = len(own) > len(held_own) or any(
                e >= first and e not in have and o == STREAM for e, o in (journal or {}).items()
            )
            used = [r.epoch for r in records if r.origin not in (None, STREAM)]
            used += [x for x in (adopted, floor) if x is not None]
            assert plan.base >= base, ctx
            if own_ahead:
                assert plan.base == base and not plan.abort_held, ctx
                continue
            new_first = plan.base + nxt
            assert all(u < new_first for u in used), ctx  # never onto another run's epoch
            moved = plan.base != base
            if moved:
                assert new_first - 1 == max(used), ctx  # right above, no gap
            assert plan.abort_held == (moved and bool(held_own)), ctx
    assert n == 7**4 * 2 * 2 * 3 * 2 * 2 * 2


def test_journal_entries_taken_are_exactly_the_missing_checkpointed_ones() -> None:
    """Rule 9 over every journal of 4 epochs (absent, this stream's, another's, origin-less),
    every set of epochs the store has and every checkpointed bound: an entry is taken when it
    is this stream's, checkpointed and unknown to the store; never a recorded or abandoned
    epoch, never another run's, never one Spark has not checkpointed, never one of a retired
    sink (its target's record of it may be gone)."""
    from eosink._rules import journal_entries_to_take

    sets = [frozenset(c) for n in range(len(EPOCHS) + 1) for c in itertools.combinations(EPOCHS, n)]
    for chosen in itertools.product((False, STREAM, OTHER_STREAM, None), repeat=len(EPOCHS)):
        entries = {e: o for e, o in zip(EPOCHS, chosen, strict=True) if o is not False}
        for have, upto, retired in itertools.product(sets, range(-1, 5), (None, 1)):
            got = journal_entries_to_take(entries, have, STREAM, upto, retired)
            ctx = (entries, have, upto, retired, got)
            assert list(got) == sorted(got), ctx
            for e in EPOCHS:
                wanted = e in entries and entries[e] == STREAM and e <= upto and e not in have
                wanted = wanted and (retired is None or e > retired)
                assert (e in got) == wanted, ctx


def test_a_checkpointed_epoch_without_a_record_is_reported() -> None:
    """Rule 9's refusal over every record set and bound: exactly the epochs Spark
    checkpointed that nothing accounts for are reported (not the GC floor's, not below the
    journal's oldest entry, not the batches before the base moved)."""
    from eosink._rules import unrecorded_checkpointed

    sets = [frozenset(c) for n in range(6) for c in itertools.combinations(range(5), n)]
    for have, ck, floor, oldest, first_of_base in itertools.product(
        sets, range(-1, 5), range(-1, 3), (None, 0, 2, 4), (0, 2)
    ):
        got = unrecorded_checkpointed(ck, have, floor, oldest, first_of_base)
        ctx = (have, ck, floor, oldest, first_of_base, got)
        assert list(got) == sorted(got), ctx
        for e in range(-1, 6):
            accounted = (
                e in have or e <= floor or (oldest is not None and e < oldest) or e < first_of_base
            )
            assert (e in got) == (0 <= e <= ck and not accounted), ctx


def test_target_journal_entries_are_taken_or_forgotten_never_lost() -> None:
    """Rule 9 for the target's journal over every journal of 4 epochs (absent, or each
    origin), every set the store has and every answer of the target's batch journal: each
    entry the store lacks is either taken (a crashed run's complete epoch) or, a batch run's
    committed at the target, forgotten; a stream's entry is always taken; the target's batch
    journal is asked only about batch runs' entries."""
    from eosink._metastore import BATCH_ORIGINS
    from eosink._rules import target_entries_to_take

    sets = [frozenset(c) for n in range(len(EPOCHS) + 1) for c in itertools.combinations(EPOCHS, n)]
    for chosen in itertools.product((False, *ORIGINS), repeat=len(EPOCHS)):
        entries = {e: o for e, o in zip(EPOCHS, chosen, strict=True) if o is not False}
        for have, committed in itertools.product(sets, sets[:: len(sets) // 4]):
            asked: list[int] = []

            def at_target(
                e: int, committed: frozenset[int] = committed, asked: list[int] = asked
            ) -> str | None:
                asked.append(e)
                return BATCH if e in committed else None

            take, forget = target_entries_to_take(entries, have, at_target)
            ctx = (entries, have, committed, take, forget)
            assert list(take) == sorted(take) and list(forget) == sorted(forget), ctx
            for e in EPOCHS:
                missing = e in entries and e not in have
                batch = entries.get(e, "") in BATCH_ORIGINS
                assert (e in forget) == (missing and batch and e in committed), ctx
                assert (e in take) == (missing and not (batch and e in committed)), ctx
            assert all(entries[e] in BATCH_ORIGINS and e not in have for e in asked), ctx


def test_every_aborted_epoch_is_aborted_again() -> None:
    """Rule 3 over every record set of 4 epochs (absent, or each status): exactly the
    ABORTED epochs, in epoch order, whatever order the records come in."""
    from eosink._metastore import ABORTED, COMMITTED, PENDING
    from eosink._rules import KnownEpoch, aborts_to_finish

    for chosen in itertools.product((None, PENDING, COMMITTED, ABORTED), repeat=len(EPOCHS)):
        records = [KnownEpoch(e, st, BATCH) for e, st in zip(EPOCHS, chosen, strict=True) if st]
        want = [e for e, st in zip(EPOCHS, chosen, strict=True) if st == ABORTED]
        assert list(aborts_to_finish(records)) == want, chosen
        assert list(aborts_to_finish(reversed(records))) == want, chosen


def test_a_run_without_epoch_refuses_after_a_crashed_one_or_takes_the_next_free() -> None:
    """Rule 5 for a run without ``epoch=`` over every record set of 3 epochs (absent, or each
    status with the origin of an explicit run, an automatic one, an unreported one or a
    stream), lists of the target's unreported epochs and highest epochs: refused exactly
    when an earlier run without ``epoch=`` crashed with its data complete (its epoch
    PENDING, or committed by another run and not reported, here or only at the target),
    naming each such epoch once; else the epoch is above every used one."""
    from eosink._metastore import ABORTED, COMMITTED, PENDING
    from eosink._rules import KnownEpoch, UnfinishedRun, decide_auto_epoch

    states = [None] + [
        (st, o)
        for st in (PENDING, COMMITTED, ABORTED)
        for o in (BATCH, BATCH_AUTO, BATCH_AUTO_UNREPORTED, STREAM)
    ]
    n = 0
    for chosen in itertools.product(states, repeat=3):
        records = [KnownEpoch(e, *c) for e, c in enumerate(chosen) if c is not None]
        for at_target, high in itertools.product(((), (1,), (2, 5)), (-1, 2, 6)):
            d = decide_auto_epoch(records, at_target, high)
            ctx = (records, at_target, high, d)
            n += 1
            crashed = {
                r.epoch
                for r in records
                if (r.origin == BATCH_AUTO and r.status == PENDING)
                or r.origin == BATCH_AUTO_UNREPORTED
            }
            if crashed or at_target:
                assert isinstance(d, UnfinishedRun), ctx
                assert set(d.in_store) == crashed, ctx
                assert set(d.elsewhere) == set(at_target) - crashed, ctx
                assert list(d.in_store) == sorted(d.in_store), ctx
                assert list(d.elsewhere) == sorted(d.elsewhere), ctx
            else:
                assert d == ("write", high + 1), ctx
    assert n == 13**3 * 9


def test_after_commit_attempt_over_every_outcome() -> None:
    """Phase 2 after one attempt, over every outcome, every time since the first failure
    (none yet, inside the retry window, at its end, past it) and window (none, 30 s): an
    epoch the target has (made visible now, or already) is marked COMMITTED, a known
    failure is never retried, and a retry is asked for exactly while the window lasts,
    the first failure always inside it."""
    from eosink._rules import after_commit_attempt

    now = 1000.0
    for kind in ("done", "already_committed", "retry_later", "failed"):
        for window in (0.0, 30.0):
            for since in (None, 0.0, window / 2, window, window + 0.001, 3 * window + 1):
                first = None if since is None else now - since
                step = after_commit_attempt(kind, first, now, window)  # type: ignore[arg-type]
                ctx = (kind, window, since, step)
                if kind in ("done", "already_committed"):
                    assert step == "committed", ctx
                elif kind == "failed":
                    assert step == "fail", ctx
                else:
                    inside = since is None or since <= window
                    assert step == ("retry" if inside else "fail"), ctx


def test_micro_batch_discards_over_every_status() -> None:
    """A ``format("eosink")`` micro-batch's staged output, over every status of its epoch's
    record: a PENDING epoch's data (its committable's) and an ABORTED one's (rule 3's) are
    never discarded by the front end; data without a record always is, and so is the output
    of a micro-batch whose epoch is COMMITTED (another run's, or a replay's: nothing else
    would ever delete it)."""
    from eosink._rules import discard_failed_micro_batch, discard_refused_micro_batch

    for status in (None, "PENDING", "COMMITTED", "ABORTED"):
        for decide in (discard_failed_micro_batch, discard_refused_micro_batch):
            got = decide(status)
            if status in ("PENDING", "ABORTED"):
                assert not got, (decide.__name__, status)
            if status is None:
                assert got, (decide.__name__, status)
        assert discard_refused_micro_batch("COMMITTED")
        assert discard_failed_micro_batch("COMMITTED")
