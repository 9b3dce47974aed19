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

from .epochs import EpochOps
from .losses import LossOps
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
