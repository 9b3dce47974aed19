"""The meta store's connection, transactions, retry and fencing, shared by its operations."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection, update
from sqlalchemy.exc import DatabaseError, OperationalError, SQLAlchemyError

from ..errors import (
    FencedError,
    InvalidTransitionError,
    MetaStoreError,
    MetaStoreUnavailableError,
)
from .engine import _make_engine, _permanent, redact_url
from .migrations import ensure_schema
from .models import SinkRow

log = logging.getLogger("eosink.metastore")

T = TypeVar("T")


class StoreBase:
    """The connection to the meta store and what every operation shares: the retry while it
    is unreachable, one transaction per state change, and the fencing check."""

    def __init__(self, url: str, *, create: bool = True, retry_s: float = 60.0) -> None:
        self.url = url
        self.retry_s = retry_s
        self.engine = _make_engine(url, create)
        try:
            with self.engine.connect() as conn:
                ensure_schema(conn, create=create)
                conn.commit()
        except OperationalError as exc:
            self.engine.dispose()
            why = _permanent(exc)
            if why:
                raise MetaStoreError(
                    f"meta store {redact_url(url)} refused eosink ({why}): {exc.orig}. Give "
                    "eosink a meta store it may write (metastore_url=)"
                ) from None
            raise MetaStoreUnavailableError(
                f"meta store {redact_url(url)} is unreachable: {exc.orig}"
            ) from None
        except DatabaseError as exc:
            self.engine.dispose()
            raise MetaStoreError(
                f"{redact_url(url)} is not an eosink meta store: {exc.orig}"
            ) from None

    def _retry(self, what: str, fn: Callable[[int], T]) -> T:
        """Run ``fn(attempt)``, retrying while the meta store is unreachable.

        Backoff from 0.1 s to 5 s, for at most ``retry_s`` seconds; then the last
        :class:`MetaStoreUnavailableError` propagates. ``attempt`` > 0 tells a write that an
        earlier attempt may have committed before its answer was lost.
        """
        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        attempt = 0
        while True:
            try:
                return fn(attempt)
            except MetaStoreUnavailableError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "meta store %s unavailable during %s (%s); retrying in %.1fs",
                    redact_url(self.url),
                    what,
                    exc,
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                attempt += 1

    @property
    def url_redacted(self) -> str:
        return redact_url(self.url)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (FencedError, InvalidTransitionError):
            raise
        except OperationalError as exc:
            why = _permanent(exc)
            if why:
                raise MetaStoreError(
                    f"meta store {redact_url(self.url)} refused the operation ({why}): "
                    f"{exc.orig}. This is not retried: give eosink a meta store it may write "
                    "(metastore_url=)"
                ) from None
            raise MetaStoreUnavailableError(
                f"meta store {redact_url(self.url)} failed: {exc.orig}"
            ) from None
        except SQLAlchemyError as exc:
            raise MetaStoreError(f"meta store {redact_url(self.url)} failed: {exc}") from exc

    @staticmethod
    def _fence(conn: Connection, sink_id: str, generation: int) -> None:
        res = conn.execute(
            update(SinkRow)
            .where(SinkRow.sink_id == sink_id, SinkRow.generation == generation)
            .values(updated_at=time.time())
        )
        if res.rowcount != 1:
            raise FencedError(
                f"sink {sink_id!r}: this coordinator (generation {generation}) was fenced by a "
                "newer one; it stops without changing any state"
            )

    def assert_live(self, sink_id: str, generation: int) -> None:
        """Raise :class:`FencedError` if a newer coordinator acquired ``sink_id``.

        Called right before a plugin's commit or abort, so a fenced zombie never touches the
        target.
        """

        def run(_: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)

        self._retry("a fencing check", run)
