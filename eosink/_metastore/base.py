"""The meta store's connection, transactions, retry and fencing, shared by its operations."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DatabaseError, OperationalError, SQLAlchemyError

from ..errors import (
    FencedError,
    InvalidTransitionError,
    MetaStoreError,
    MetaStoreUnavailableError,
)
from . import statements
from .engine import _make_engine, _permanent, redact_url
from .migrations import ensure_schema

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
        """The fencing check of a write, in the write's transaction: the sink row stays
        locked until the write commits, so a newer coordinator's acquire is ordered after
        it (and this write then fails)."""
        res = conn.execute(
            statements.FENCE, {"b_sid": sink_id, "b_gen": generation, "b_now": time.time()}
        )
        if res.rowcount != 1:
            raise _fenced(sink_id, generation)

    def assert_live(self, sink_id: str, generation: int) -> None:
        """Raise :class:`FencedError` if a newer coordinator acquired ``sink_id``.

        Called right before a plugin's commit or abort, so a fenced zombie never touches the
        target.
        """

        def run(_: int) -> None:
            # A read: a check outside a write is as good as the moment it reads (a newer
            # coordinator may acquire the sink right after it, whatever it locked), and a
            # write transaction would cost the meta store a sync to disk.
            with self._tx() as conn:
                current = conn.execute(statements.GENERATION, {"b_sid": sink_id}).scalar()
            if current != generation:
                raise _fenced(sink_id, generation)

        self._retry("a fencing check", run)


def _fenced(sink_id: str, generation: int) -> FencedError:
    return FencedError(
        f"sink {sink_id!r}: this coordinator (generation {generation}) was fenced by a "
        "newer one; it stops without changing any state"
    )
