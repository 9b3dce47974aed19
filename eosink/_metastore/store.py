"""The meta store: the two-phase state machine persisted with SQLAlchemy.

Every state change runs in one transaction that first checks the caller's fencing
generation (``UPDATE eosink_sink ... WHERE generation = :g``): once a newer coordinator has
acquired the sink, a zombie's change fails with :class:`~eosink.errors.FencedError`.

Transitions (anything else raises :class:`~eosink.errors.InvalidTransitionError`)::

    (none) -> PENDING -> COMMITTED
              PENDING -> ABORTED -> (row deleted)

The operations live by job: ``base`` (connection, transactions, retry, fencing), ``sinks``,
``epochs`` and ``losses``; ``records`` and ``engine`` hold what they share.
"""

from __future__ import annotations

from . import statements
from .epochs import EpochOps
from .losses import LossOps
from .records import EpochRecord, SinkRecord
from .sinks import SinkOps

__all__ = ["MetaStore"]


class MetaStore(SinkOps, EpochOps, LossOps):
    """Persisted state of every sink: fencing, epochs, high-water marks.

    Args:
        url: SQLAlchemy URL (``sqlite:///path.db``, ``postgresql://user@host/db``).
        create: upgrade an *empty* database to the current schema. A database whose schema
            is older than this eosink raises :class:`~eosink.errors.SchemaOutdatedError`
            and must be upgraded with ``eosink db upgrade``.

    Raises:
        MetaStoreUnavailableError: the database cannot be reached.
        MissingExtraError: the database driver is not installed.
    """

    def epoch_and_sink(
        self, sink_id: str, epoch: int
    ) -> tuple[EpochRecord | None, SinkRecord | None]:
        """``epoch``'s row, then the sink's row, in one transaction (what a micro-batch's
        decision reads: one round trip of the meta store's, not three). The sink's row is
        read second: a check of its generation then stands for a fencing check made after
        the epoch was read."""

        def run(_: int) -> tuple[EpochRecord | None, SinkRecord | None]:
            with self._tx() as conn:
                row = conn.execute(
                    statements.EPOCH, {"b_sid": sink_id, "b_epoch": epoch}
                ).one_or_none()
                return (None if row is None else self._record(row)), self._sink(conn, sink_id)

        return self._retry("a read", run)
