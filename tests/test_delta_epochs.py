"""The Delta sink's record of its committed epochs (``eosink_delta.epochs``), checked against
a plain set over every sequence of commits up to a bound.

The table keeps one version per app id, the latest; the sink's frontier, gaps and backfills
must answer "is epoch e in the table?" for every e after any order of commits (a stream's
consecutive epochs, batch runs that jump, backfills below the newest, commits replayed after
a lost answer). A wrong answer is a silent loss (a new epoch taken for committed) or a
duplicate (a committed one taken for new).
"""

from __future__ import annotations

import itertools

import pytest
from eosink_delta.epochs import AppIds, is_committed, last_epoch, txns_for

IDS = AppIds.of("delta:/t")
EPOCHS = range(6)


def _apply(table: dict[str, int], committed: set[int], epoch: int) -> None:
    """One commit of ``epoch`` as the sink makes it: read, then write its txns (or nothing,
    when the table says it is in)."""
    look = table.get
    assert is_committed(IDS, epoch, look) == (epoch in committed), (
        f"before committing {epoch}: table says {is_committed(IDS, epoch, look)}, "
        f"committed={sorted(committed)} txns={table}"
    )
    if epoch in committed:
        return
    for app, version in txns_for(IDS, epoch, look).items():
        assert table.get(app) is None or version >= table[app], f"{app} lowered"
        table[app] = version
    committed.add(epoch)


def _check_all(table: dict[str, int], committed: set[int]) -> None:
    for e in range(-1, max(EPOCHS) + 3):
        if e < 0:
            continue
        assert is_committed(IDS, e, table.get) == (e in committed), (
            f"epoch {e}: table says {is_committed(IDS, e, table.get)}, "
            f"committed={sorted(committed)} txns={table}"
        )
    assert last_epoch(IDS, table.get) == max(committed, default=-1)


def test_every_order_of_commits_is_recorded_exactly() -> None:
    """Every sequence of up to 5 commits (repeats included: a commit replayed after a lost
    answer) over epochs 0-5: after each commit, every epoch is reported in the table exactly
    when it was committed, and no app id's version ever goes down."""
    n = 0
    for length in range(1, 6):
        for seq in itertools.product(EPOCHS, repeat=length):
            table: dict[str, int] = {}
            committed: set[int] = set()
            for e in seq:
                _apply(table, committed, e)
                _check_all(table, committed)
            n += 1
    assert n == sum(6**k for k in range(1, 6))


def test_space_grows_with_gaps_not_epochs() -> None:
    """A stream's 10,000 consecutive epochs keep one app id; a jump adds its gap (two, or
    three once a gap is below it), a backfill one."""
    table: dict[str, int] = {}
    committed: set[int] = set()
    for e in range(10_000):
        _apply(table, committed, e)
    assert len(table) == 1
    _apply(table, committed, 20_000)  # a batch run jumps
    _apply(table, committed, 15_000)  # a backfill inside the gap
    assert len(table) == 1 + 2 + 1
    _apply(table, committed, 30_000)
    assert len(table) == 1 + 2 + 1 + 2  # the second gap points at the first
    assert is_committed(IDS, 9_999, table.get) and not is_committed(IDS, 10_000, table.get)
    assert is_committed(IDS, 15_000, table.get) and not is_committed(IDS, 15_001, table.get)


def test_other_sinks_app_ids_are_not_ours() -> None:
    assert IDS.owns("eosink:delta:/t") and IDS.owns("eosink:delta:/t#gap:3")
    assert not IDS.owns("eosink:delta:/t2") and not IDS.owns("eosink:delta:/t2#gaps")


def test_a_torn_record_is_an_error_not_an_answer() -> None:
    table: dict[str, int] = {}
    committed: set[int] = set()
    _apply(table, committed, 3)
    del table[IDS.gap(3)]
    with pytest.raises(ValueError, match="torn"):
        is_committed(IDS, 1, table.get)
