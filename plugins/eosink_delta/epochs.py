"""Which epochs of a sink a Delta table holds, kept in the table's own app transactions.

Delta's protocol gives a writer *app transactions* (``txn`` actions): an ``appId`` and a
``version``, committed atomically with the data and kept in every checkpoint, **one version
per app id, the latest**. That is how Delta's own streaming sink knows a micro-batch is in.
It holds for epochs committed in increasing order only: ``version(app) >= epoch`` cannot say
whether an epoch *below* the newest was committed (a batch ``epoch=`` backfill) or not (a
number never written).

So the sink keeps, in app transactions of its own and in the same commit as each epoch's
data, enough to answer "is epoch ``e`` in the table?" for every ``e``, forever, in space that
grows with the *gaps* in its epoch sequence, not with the epochs (a stream writes
consecutive epochs; one checkpoint entry per app id would grow by one entry a micro-batch):

* ``F = <app>``: the frontier, the newest epoch committed in increasing order. Every epoch
  above it is not in the table (:attr:`AppIds.frontier`).
* A **gap** ``[lo, top)``: epochs an in-order commit jumped over (the first commit of the sink
  jumps over ``[0, first)``). ``<app>#gaps`` is the newest gap's ``top``; ``<app>#gap:<top>``
  its ``lo``, ``<app>#gap:<top>#next`` the ``top`` of the gap below it (absent for the lowest).
  Every epoch at or below ``F`` and outside every gap was committed in order.
* A **backfill** ``<app>#e:<epoch>``: an epoch committed below ``F`` (it fills part of a gap).

A commit reads these first (:func:`is_committed`), then writes :func:`txns_for` with its data.
The functions are pure (``lookup`` is the table's ``transaction_version``), so that every
sequence of commits is checked exhaustively against a plain set in ``tests/test_delta_epochs.py``.
Nothing here ever lowers an app id's version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AppIds", "is_committed", "last_epoch", "txns_for"]

Lookup = Callable[[str], "int | None"]
"""The table's ``transaction_version``: an app id's version, None when it has none."""


@dataclass(frozen=True)
class AppIds:
    """The app ids of one sink in a table (``base`` = ``eosink:<sink_id>``)."""

    base: str

    @classmethod
    def of(cls, sink_id: str) -> AppIds:
        return cls(f"eosink:{sink_id}")

    @property
    def frontier(self) -> str:
        return self.base

    @property
    def gaps(self) -> str:
        return f"{self.base}#gaps"

    def gap(self, top: int) -> str:
        return f"{self.base}#gap:{top}"

    def gap_next(self, top: int) -> str:
        return f"{self.base}#gap:{top}#next"

    def backfill(self, epoch: int) -> str:
        return f"{self.base}#e:{epoch}"

    def owns(self, app_id: str) -> bool:
        """Whether ``app_id`` is one of this sink's (and not another sink's whose id starts
        with this one's)."""
        return app_id == self.base or app_id.startswith(self.base + "#")


def last_epoch(ids: AppIds, lookup: Lookup) -> int:
    """The newest epoch of the sink in the table, -1 when there is none (a backfill is
    always below it)."""
    f = lookup(ids.frontier)
    return -1 if f is None else f


def _in_gap(ids: AppIds, epoch: int, lookup: Lookup) -> bool:
    """Whether ``epoch`` (at or below the frontier) lies in a gap an in-order commit jumped."""
    top = lookup(ids.gaps)
    while top is not None:
        if epoch >= top:
            return False  # above this gap, and every lower gap is lower still
        lo = lookup(ids.gap(top))
        if lo is None:
            raise ValueError(
                f"app transaction {ids.gap(top)!r} is missing: the table's record is torn"
            )
        if epoch >= lo:
            return True
        top = lookup(ids.gap_next(top))
    return False


def is_committed(ids: AppIds, epoch: int, lookup: Lookup) -> bool:
    """Whether exactly ``epoch`` of the sink is in the table."""
    f = lookup(ids.frontier)
    if f is None or epoch > f:
        return False
    if epoch == f or lookup(ids.backfill(epoch)) is not None:
        return True
    return not _in_gap(ids, epoch, lookup)


def txns_for(ids: AppIds, epoch: int, lookup: Lookup) -> dict[str, int]:
    """The app transactions the commit of ``epoch`` writes (``epoch`` not in the table yet:
    :func:`is_committed` said so): the new frontier and the gap it jumps, or a backfill."""
    if epoch < 0:
        raise ValueError(f"epoch {epoch} is negative")
    f = lookup(ids.frontier)
    if f is not None and epoch < f:
        return {ids.backfill(epoch): epoch}
    if f is not None and epoch == f:
        raise ValueError(f"epoch {epoch} is the table's newest epoch already")
    lo = 0 if f is None else f + 1
    out = {ids.frontier: epoch}
    if epoch > lo:  # [lo, epoch) was never committed in order
        out[ids.gaps] = epoch
        out[ids.gap(epoch)] = lo
        below = lookup(ids.gaps)
        if below is not None:
            out[ids.gap_next(epoch)] = below
    return out
