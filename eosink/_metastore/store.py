"""The meta store: the two-phase state machine persisted with SQLAlchemy.

Every state change runs in one transaction that first checks the caller's fencing
generation (``UPDATE eosink_sink ... WHERE generation = :g``): once a newer coordinator has
acquired the sink, a zombie's change fails with :class:`~eosink.errors.FencedError`.

Transitions (anything else raises :class:`~eosink.errors.InvalidTransitionError`)::

    (none) -> PENDING -> COMMITTED
              PENDING -> ABORTED -> (row deleted)
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DatabaseError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)

from .._transient import classify_error
from ..errors import (
    ConfigError,
    FencedError,
    InvalidTransitionError,
    MetaStoreError,
    MetaStoreUnavailableError,
    MissingExtraError,
)
from .migrations import ensure_schema
from .models import ABORTED, COMMITTED, PENDING, EpochRow, LossRow, SinkRow

log = logging.getLogger("eosink.metastore")

__all__ = [
    "AUTO_ORIGINS",
    "BATCH",
    "BATCH_AUTO",
    "BATCH_AUTO_UNREPORTED",
    "BATCH_ORIGINS",
    "DROPPED_OPEN_FILE",
    "HEARTBEAT_SECONDS",
    "HEARTBEAT_STALE_SECONDS",
    "EpochRecord",
    "MetaStore",
    "SinkRecord",
    "default_url",
    "eosink_home",
    "redact_url",
]

BATCH = "batch"
"""``origin`` of an epoch written by a batch run with an explicit ``epoch=`` (a stream's
epochs carry its lineage)."""
BATCH_AUTO = "batch-auto"
"""``origin`` of an epoch a batch run without ``epoch=`` got (the next free one)."""
BATCH_AUTO_UNREPORTED = "batch-auto-unreported"
"""``origin`` of a crashed run's epoch without ``epoch=`` that another run committed (or is
committing): the next run without ``epoch=`` must still report it (``UnfinishedRunError``)."""
AUTO_ORIGINS = (BATCH_AUTO, BATCH_AUTO_UNREPORTED)
"""The ``origin`` values of the epochs of batch runs without ``epoch=``."""
BATCH_ORIGINS = (BATCH, *AUTO_ORIGINS)
"""The ``origin`` values of batch runs' epochs."""
DROPPED_OPEN_FILE = "dropped-open-file"
"""``origin`` of a loss recorded by ``eosink recover --drop-lost-open-files``: rows of
committed epochs whose open rolling file was destroyed outside eosink."""

T = TypeVar("T")

HEARTBEAT_SECONDS = 30.0
"""How often a running coordinator records its heartbeat in its sink's row."""
HEARTBEAT_STALE_SECONDS = 3 * HEARTBEAT_SECONDS
"""A heartbeat older than this: its owner stopped (killed, or its host lost)."""
FORMAT_STREAM_OWNER = "format stream"
"""The note of an owner that is one micro-batch's coordinator of a ``format("eosink")``
stream (``host:pid (format stream)``): its process ends with the micro-batch, its query runs
on; it counts as running while its heartbeat is fresh, on any host."""


def split_owner(owner: str) -> tuple[str, str, str | None]:
    """The host, the pid and the note of an owner as :meth:`MetaStore.acquire` records it
    (``host:pid``, or ``host:pid (note)``); the note is None without one. An owner that is not
    a process (``user@host (eosink abandon)``) gives no host."""
    base, sep, note = owner.partition(" (")
    host, _, pid = base.rpartition(":")
    return host, pid, note.removesuffix(")") if sep else None


@dataclass(frozen=True)
class SinkRecord:
    sink_id: str
    plugin: str
    generation: int
    owner: str
    lineage: str | None
    epoch_base: int
    high_water: int
    committed_epochs: int
    arrow_schema: bytes | None
    updated_at: float
    target: str | None = None
    gc_floor: int = -1
    created_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    heartbeat_at: float | None = None
    """When the owner last said it runs (every :data:`HEARTBEAT_SECONDS`); None once it
    stopped cleanly, or for an owner older than the heartbeat."""
    last_roll: dict[str, Any] | None = None
    """The last roll between epochs of a rolling sink: ``{"at", "files", "everything"}``."""


@dataclass(frozen=True)
class LossRecord:
    """An epoch abandoned as a known loss (``eosink abandon --accept-data-loss``)."""

    sink_id: str
    epoch: int
    rows: int
    files: int
    bytes: int
    origin: str | None
    reason: str
    recorded_by: str
    recorded_at: float


@dataclass(frozen=True)
class EpochRecord:
    sink_id: str
    epoch: int
    status: str
    committable: bytes | None
    codec_version: int
    generation: int
    rows: int
    files: int
    bytes: int
    batch_end_at: float | None
    pre_commit_ms: float | None
    commit_ms: float | None
    committed_at: float | None
    origin: str | None = None
    created_at: float | None = None
    """When the row was created: the epoch's PENDING time."""


def redact_url(url: str) -> str:
    """The URL with its password hidden, for logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable meta store URL>"


def _permanent(exc: BaseException) -> str | None:
    """Why an operational error of the meta store is permanent (eosink's one rule,
    :func:`eosink.util.classify_error`), or None (transient)."""
    verdict = classify_error(exc)
    return None if verdict.transient else verdict.why


def default_url(checkpoint_location: str | None = None) -> str:
    """The meta store URL used when none is given.

    ``EOSINK_METASTORE_URL`` if set; otherwise ``$EOSINK_HOME/metastore.db`` (``~/.eosink``
    by default): one store for the batch and the streaming runs of every sink on this
    machine, so that they share state and fencing, and so that deleting a checkpoint never
    deletes a sink's history. A checkpoint written by a pre-release eosink keeps the store it holds
    (``<checkpoint>/eosink/metastore.db``), with a warning.
    """
    env = os.environ.get("EOSINK_METASTORE_URL")
    if env:
        return env
    if checkpoint_location and "://" not in checkpoint_location.removeprefix("file://"):
        legacy = Path(checkpoint_location.removeprefix("file://")) / "eosink" / "metastore.db"
        if legacy.is_file():
            log.warning(
                "using the meta store inside the checkpoint (%s), as pre-release eosink did; "
                "batch runs of this sink do not see it. Pass metastore_url= to choose one store "
                "for all runs",
                legacy,
            )
            return f"sqlite:///{legacy.resolve()}"
    # Not created here: a read-only command (eosink status) must create nothing.
    return f"sqlite:///{(eosink_home() / 'metastore.db').resolve()}"


def eosink_home() -> Path:
    """eosink's directory on this machine: ``$EOSINK_HOME``, by default ``~/.eosink``."""
    return Path(os.environ.get("EOSINK_HOME", Path.home() / ".eosink")).expanduser()


def _greatest(dialect: str, column: Any, value: int) -> Any:
    """SQL ``max(column, value)`` of two values (SQLite's scalar max, elsewhere greatest)."""
    return func.max(column, value) if dialect == "sqlite" else func.greatest(column, value)


def _make_engine(url: str, create: bool = True) -> Engine:
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"invalid meta store URL {redact_url(url)!r}: {exc}. Expected a SQLAlchemy URL "
            "such as sqlite:////abs/path/metastore.db or postgresql://user@host/db"
        ) from None
    if u.get_backend_name() == "postgresql" and u.get_driver_name() in ("", "psycopg2"):
        # psycopg 3 is the driver that the `postgres` extra installs.
        u = u.set(drivername="postgresql+psycopg")
    if u.get_backend_name() == "sqlite":
        memory = (
            not u.database
            or u.database == ":memory:"
            or u.query.get("mode") == "memory"
            or u.database.startswith("file::memory:")
        )
        if memory:
            raise ConfigError(
                f"meta store {url!r} is an in-memory SQLite database: it forgets every "
                "committed epoch when the process ends, so a re-run would write them again. "
                "Use a file (sqlite:////abs/path/metastore.db) or leave metastore_url unset "
                "for the default ($EOSINK_HOME/metastore.db)"
            )
        assert u.database is not None
        try:
            if not create and not Path(u.database).is_file():
                raise MetaStoreError(f"there is no eosink meta store at {u.database}")
            if create:
                Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot use {u.database!r} as a SQLite meta store: {exc}") from None
    try:
        if u.get_backend_name() == "sqlite":
            engine = create_engine(u, connect_args={"timeout": 60})

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                if create:  # never change a file a read-only open may not own
                    _wal(cur)
                cur.execute("PRAGMA synchronous=FULL")
                cur.close()

            return engine
        return create_engine(
            u, pool_pre_ping=True, pool_size=2, connect_args={"connect_timeout": 10}
        )
    except (ModuleNotFoundError, NoSuchModuleError) as exc:
        if u.get_backend_name() == "postgresql":
            raise MissingExtraError("psycopg", "postgres", "a PostgreSQL meta store") from exc
        raise MetaStoreError(f"no driver for meta store {redact_url(url)}: {exc}") from exc


def _wal(cur: Any) -> None:
    """``PRAGMA journal_mode=WAL``, waiting out other connections for up to 60 s.

    Switching a new database file to WAL takes an exclusive lock for which SQLite does not
    call the busy handler: six drivers opening one new store at once failed ~2 % of the
    time with "database is locked" (an error a driver should never see at start).
    """
    import sqlite3

    deadline = time.monotonic() + 60
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


class MetaStore:
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

    # -- transactions --------------------------------------------------------------------
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

    # -- sinks ---------------------------------------------------------------------------
    def acquire(
        self,
        sink_id: str,
        plugin: str,
        options_json: str | None = None,
        *,
        note: str | None = None,
    ) -> SinkRecord:
        """Become the live coordinator of ``sink_id``: bump its generation (fencing any other).

        The owner is recorded as ``host:pid``, followed by `` (note)`` when ``note`` is given
        (``format stream``: see :attr:`eosink._protocol.SinkRuntime.micro_batch`)."""
        owner = f"{socket.gethostname()}:{os.getpid()}" + (f" ({note})" if note else "")
        return self._retry("acquire", lambda _: self._acquire(sink_id, plugin, options_json, owner))

    def _acquire(
        self, sink_id: str, plugin: str, options_json: str | None, owner: str
    ) -> SinkRecord:
        now = time.time()
        with self._tx() as conn:
            res = conn.execute(
                update(SinkRow)
                .where(SinkRow.sink_id == sink_id)
                .values(
                    generation=SinkRow.generation + 1,
                    owner=owner,
                    plugin=plugin,
                    options_json=options_json,
                    updated_at=now,
                    heartbeat_at=now,
                )
            )
            if res.rowcount == 0:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(SinkRow).values(
                                sink_id=sink_id,
                                plugin=plugin,
                                generation=1,
                                owner=owner,
                                lineage=None,
                                epoch_base=0,
                                high_water=-1,
                                committed_epochs=0,
                                options_json=options_json,
                                created_at=now,
                                updated_at=now,
                                heartbeat_at=now,
                            )
                        )
                except IntegrityError:  # raced with another driver creating it
                    conn.execute(
                        update(SinkRow)
                        .where(SinkRow.sink_id == sink_id)
                        .values(
                            generation=SinkRow.generation + 1,
                            owner=owner,
                            updated_at=now,
                            heartbeat_at=now,
                        )
                    )
            rec = self._sink(conn, sink_id)
        assert rec is not None
        log.debug("sink %s acquired by %s, generation %d", sink_id, owner, rec.generation)
        return rec

    @staticmethod
    def _sink(conn: Connection, sink_id: str) -> SinkRecord | None:
        row = conn.execute(
            select(SinkRow.__table__).where(SinkRow.sink_id == sink_id)
        ).one_or_none()
        if row is None:
            return None
        return SinkRecord(
            sink_id=row.sink_id,
            plugin=row.plugin,
            generation=row.generation,
            owner=row.owner,
            lineage=row.lineage,
            epoch_base=row.epoch_base,
            high_water=row.high_water,
            committed_epochs=row.committed_epochs,
            arrow_schema=row.arrow_schema,
            updated_at=row.updated_at,
            target=row.target,
            gc_floor=row.gc_floor,
            created_at=row.created_at,
            last_error=row.last_error,
            last_error_at=row.last_error_at,
            heartbeat_at=row.heartbeat_at,
            last_roll=json.loads(row.last_roll) if row.last_roll else None,
        )

    def sink(self, sink_id: str) -> SinkRecord | None:
        def run(_: int) -> SinkRecord | None:
            with self._tx() as conn:
                return self._sink(conn, sink_id)

        return self._retry("a read", run)

    def sinks(self) -> list[SinkRecord]:
        with self._tx() as conn:
            ids = conn.execute(select(SinkRow.sink_id).order_by(SinkRow.sink_id)).scalars().all()
            return [r for r in (self._sink(conn, i) for i in ids) if r is not None]

    def _set(self, sink_id: str, generation: int, what: str, **values: Any) -> None:
        def run(_: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                conn.execute(update(SinkRow).where(SinkRow.sink_id == sink_id).values(**values))

        self._retry(what, run)

    def set_origin(self, sink_id: str, generation: int, epoch: int, origin: str) -> None:
        """Re-tag an epoch's ``origin`` (``batch-auto`` and ``batch-auto-unreported``)."""

        def run(_: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                conn.execute(
                    update(EpochRow)
                    .where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch)
                    .values(origin=origin)
                )

        self._retry(f"set epoch {epoch}'s origin", run)

    def set_lineage(self, sink_id: str, generation: int, lineage: str, epoch_base: int) -> None:
        self._set(sink_id, generation, "set_lineage", lineage=lineage, epoch_base=epoch_base)

    def set_schema(self, sink_id: str, generation: int, arrow_schema: bytes) -> None:
        self._set(sink_id, generation, "set_schema", arrow_schema=arrow_schema)

    def set_target(self, sink_id: str, generation: int, target: str) -> None:
        """Bind ``sink_id`` to its target (the core refuses another target later)."""
        self._set(sink_id, generation, "set_target", target=target)

    def adopt(self, sink_id: str, generation: int, *, last_epoch: int) -> None:
        """Take over a sink whose history this store lost: epochs <= ``last_epoch`` are known
        to the target only (treated like garbage-collected committed epochs)."""
        self._set(
            sink_id,
            generation,
            "adopt",
            gc_floor=last_epoch,
            high_water=_greatest(self.engine.dialect.name, SinkRow.high_water, last_epoch),
        )

    def stream_high(self, sink_id: str) -> int:
        """The largest epoch any streaming run of ``sink_id`` used (-1 if none)."""

        def run(_: int) -> int:
            with self._tx() as conn:
                mx = conn.execute(
                    select(func.max(EpochRow.epoch)).where(
                        EpochRow.sink_id == sink_id,
                        EpochRow.origin.not_in(BATCH_ORIGINS) | EpochRow.origin.is_(None),
                    )
                ).scalar_one_or_none()
                floor = conn.execute(
                    select(SinkRow.gc_floor).where(SinkRow.sink_id == sink_id)
                ).scalar_one_or_none()
            return max(-1 if mx is None else mx, -1 if floor is None else floor)

        return self._retry("a read", run)

    def max_epoch(self, sink_id: str) -> int:
        """The largest epoch this sink ever used (-1 if none)."""

        def run(_: int) -> int:
            with self._tx() as conn:
                hw = conn.execute(
                    select(SinkRow.high_water, SinkRow.gc_floor).where(SinkRow.sink_id == sink_id)
                ).one_or_none()
                mx = conn.execute(
                    select(func.max(EpochRow.epoch)).where(EpochRow.sink_id == sink_id)
                ).scalar_one_or_none()
            marks = [-1] if hw is None else [hw[0], hw[1]]
            return max(*marks, -1 if mx is None else mx)

        return self._retry("a read", run)

    # -- epochs --------------------------------------------------------------------------
    @staticmethod
    def _record(row: Any) -> EpochRecord:
        return EpochRecord(
            sink_id=row.sink_id,
            epoch=row.epoch,
            status=row.status,
            committable=row.committable,
            codec_version=row.codec_version,
            generation=row.generation,
            rows=row.rows,
            files=row.files,
            bytes=row.bytes,
            batch_end_at=row.batch_end_at,
            pre_commit_ms=row.pre_commit_ms,
            commit_ms=row.commit_ms,
            committed_at=row.committed_at,
            origin=row.origin,
            created_at=row.created_at,
        )

    def epoch(self, sink_id: str, epoch: int) -> EpochRecord | None:
        def run(_: int) -> EpochRecord | None:
            with self._tx() as conn:
                row = conn.execute(
                    select(EpochRow.__table__).where(
                        EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                    )
                ).one_or_none()
                return None if row is None else self._record(row)

        return self._retry("a read", run)

    def epochs(
        self,
        sink_id: str,
        statuses: Sequence[str] = (PENDING, COMMITTED, ABORTED),
        limit: int = 0,
    ) -> list[EpochRecord]:
        """Epochs of ``sink_id`` with one of ``statuses``, by epoch (the newest ``limit``)."""
        q = select(EpochRow.__table__).where(
            EpochRow.sink_id == sink_id, EpochRow.status.in_(statuses)
        )
        if limit:
            q = q.order_by(EpochRow.epoch.desc()).limit(limit)
        else:
            q = q.order_by(EpochRow.epoch)

        def run(_: int) -> list[EpochRecord]:
            with self._tx() as conn:
                return [self._record(r) for r in conn.execute(q).all()]

        return sorted(self._retry("a read", run), key=lambda r: r.epoch)

    def persist_pending(
        self,
        sink_id: str,
        generation: int,
        epoch: int,
        committable: bytes,
        codec_version: int,
        *,
        rows: int,
        files: int,
        nbytes: int,
        batch_end_at: float,
        pre_commit_ms: float,
        origin: str | None = None,
    ) -> None:
        """(none) -> PENDING. Once this returns, the epoch can be finished from the row alone.

        ``origin`` is ``"batch"`` or the streaming lineage writing the epoch.
        """

        def run(attempt: int) -> None:
            now = time.time()
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(EpochRow).values(
                                sink_id=sink_id,
                                epoch=epoch,
                                status=PENDING,
                                committable=committable,
                                codec_version=codec_version,
                                generation=generation,
                                rows=rows,
                                files=files,
                                nbytes=nbytes,
                                batch_end_at=batch_end_at,
                                pre_commit_ms=pre_commit_ms,
                                origin=origin,
                                created_at=now,
                                updated_at=now,
                            )
                        )
                except IntegrityError:
                    row = conn.execute(
                        select(EpochRow.status, EpochRow.generation, EpochRow.committable).where(
                            EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                        )
                    ).one_or_none()
                    if (
                        attempt
                        and row is not None
                        and row.status == PENDING
                        and row.generation == generation
                        and bytes(row.committable) == committable
                    ):
                        return  # our earlier attempt committed; its answer was lost
                    raise InvalidTransitionError(
                        f"sink {sink_id!r} epoch {epoch}: "
                        f"{None if row is None else row.status} -> {PENDING} is not allowed"
                    ) from None

        self._retry(f"persist PENDING of epoch {epoch}", run)

    def _transition(
        self,
        conn: Connection,
        sink_id: str,
        epoch: int,
        src: str,
        dst: str,
        attempt: int = 0,
        **values: Any,
    ) -> bool:
        """``src`` -> ``dst``; False when a retried attempt finds ``dst`` already reached."""
        res = conn.execute(
            update(EpochRow)
            .where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch, EpochRow.status == src)
            .values(status=dst, updated_at=time.time(), **values)
        )
        if res.rowcount != 1:
            cur = conn.execute(
                select(EpochRow.status).where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch)
            ).scalar_one_or_none()
            if attempt and cur == dst:
                return False
            raise InvalidTransitionError(
                f"sink {sink_id!r} epoch {epoch}: {cur or '(none)'} -> {dst} is not allowed"
            )
        return True

    def mark_committed(
        self, sink_id: str, generation: int, epoch: int, *, commit_ms: float
    ) -> None:
        """PENDING -> COMMITTED, and raise the sink's high-water mark."""

        def run(attempt: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                if not self._transition(
                    conn,
                    sink_id,
                    epoch,
                    PENDING,
                    COMMITTED,
                    attempt,
                    commit_ms=commit_ms,
                    committed_at=time.time(),
                ):
                    return
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id)
                    .values(
                        high_water=_greatest(conn.dialect.name, SinkRow.high_water, epoch),
                        committed_epochs=SinkRow.committed_epochs + 1,
                    )
                )

        self._retry(f"mark epoch {epoch} COMMITTED", run)

    def mark_aborted(self, sink_id: str, generation: int, epoch: int) -> None:
        """PENDING -> ABORTED."""

        def run(attempt: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                self._transition(conn, sink_id, epoch, PENDING, ABORTED, attempt)

        self._retry(f"mark epoch {epoch} ABORTED", run)

    def finish_abort(self, sink_id: str, generation: int, epoch: int) -> None:
        """ABORTED -> (row deleted), once the plugin's abort cleaned up."""

        def run(attempt: int) -> None:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                res = conn.execute(
                    delete(EpochRow).where(
                        EpochRow.sink_id == sink_id,
                        EpochRow.epoch == epoch,
                        EpochRow.status == ABORTED,
                    )
                )
                if res.rowcount != 1:
                    gone = (
                        conn.execute(
                            select(EpochRow.status).where(
                                EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                            )
                        ).scalar_one_or_none()
                        is None
                    )
                    if attempt and gone:
                        return
                    raise InvalidTransitionError(
                        f"sink {sink_id!r} epoch {epoch}: only an ABORTED epoch can be finished"
                    )

        self._retry(f"finish the abort of epoch {epoch}", run)

    def heartbeat(self, sink_id: str, generation: int, *, stopped: bool = False) -> bool:
        """Say that the owner of ``generation`` still runs (``stopped``: that it stopped
        cleanly: the heartbeat is cleared). One try, not retried, never raises: False when
        the store did not take it or another coordinator owns the sink now."""
        try:
            with self._tx() as conn:
                res = conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id, SinkRow.generation == generation)
                    .values(heartbeat_at=None if stopped else time.time())
                )
                return bool(res.rowcount)
        except Exception:
            log.debug("sink %s: heartbeat not recorded", sink_id, exc_info=True)
            return False

    def record_roll(self, sink_id: str, generation: int, *, files: int, everything: bool) -> None:
        """Note a roll between epochs (``files`` published; ``everything``: every open file).
        Informational, for ``eosink status``; one try, fenced by generation, never raises."""
        note = json.dumps({"at": time.time(), "files": files, "everything": everything})
        try:
            with self._tx() as conn:
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id, SinkRow.generation == generation)
                    .values(last_roll=note)
                )
        except Exception:
            log.debug("sink %s: roll not recorded", sink_id, exc_info=True)

    def record_error(self, sink_id: str, message: str) -> None:
        """Keep ``message`` as the sink's last error (shown by ``eosink status``). Best
        effort, not fenced: a store that cannot take it must not hide the error itself."""
        try:
            with self._tx() as conn:
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id)
                    .values(last_error=message[:4000], last_error_at=time.time())
                )
        except Exception:
            log.debug("sink %s: could not record the last error", sink_id, exc_info=True)

    def abandon(self, sink_id: str, epoch: int, reason: str, by: str) -> LossRecord:
        """Give up a PENDING (or ABORTED) epoch for good, as an operator's decision: in one
        transaction the sink's generation is bumped (every coordinator is fenced), the
        epoch is recorded as a known loss (:meth:`losses`) and marked ABORTED, so that the
        next run deletes its staged data and never publishes it.

        Raises:
            InvalidTransitionError: the epoch is COMMITTED or unknown to this store.
        """

        def run(_: int) -> LossRecord:
            now = time.time()
            with self._tx() as conn:
                row = conn.execute(
                    select(EpochRow.__table__).where(
                        EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                    )
                ).one_or_none()
                if row is None or row.status == COMMITTED:
                    raise InvalidTransitionError(
                        f"sink {sink_id!r} epoch {epoch}: "
                        + ("is COMMITTED" if row is not None else "unknown to this meta store")
                        + "; only a PENDING or ABORTED epoch can be abandoned"
                    )
                known = self._loss_row(conn, sink_id, epoch)
                if known is not None:  # abandoned before (or by a lost answer's attempt)
                    return self._loss(known)
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id)
                    .values(
                        generation=SinkRow.generation + 1,
                        owner=by,
                        updated_at=now,
                        heartbeat_at=None,
                    )
                )
                if row.status == PENDING:
                    conn.execute(
                        update(EpochRow)
                        .where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch)
                        .values(status=ABORTED, updated_at=now)
                    )
                loss = LossRecord(
                    sink_id, epoch, row.rows, row.files, row.bytes, row.origin, reason, by, now
                )
                conn.execute(
                    insert(LossRow).values(
                        sink_id=sink_id,
                        epoch=epoch,
                        rows=loss.rows,
                        files=loss.files,
                        nbytes=loss.bytes,
                        origin=loss.origin,
                        reason=reason,
                        recorded_by=by,
                        recorded_at=now,
                    )
                )
                return loss

        return self._retry(f"abandon epoch {epoch}", run)

    def record_loss(
        self,
        sink_id: str,
        epoch: int,
        *,
        rows: int,
        files: int,
        nbytes: int,
        origin: str,
        reason: str,
        by: str,
    ) -> LossRecord:
        """Record rows of a COMMITTED epoch that an operator gave up after the fact (an open
        rolling file whose staged data was destroyed outside eosink), shown by ``status``
        as a known loss like an abandoned epoch. A second loss of the same epoch is added to
        the first (rows, files and bytes summed, reasons joined)."""

        def run(_: int) -> LossRecord:
            now = time.time()
            with self._tx() as conn:
                known = self._loss_row(conn, sink_id, epoch)
                if known is None:
                    conn.execute(
                        insert(LossRow).values(
                            sink_id=sink_id,
                            epoch=epoch,
                            rows=rows,
                            files=files,
                            nbytes=nbytes,
                            origin=origin,
                            reason=reason,
                            recorded_by=by,
                            recorded_at=now,
                        )
                    )
                else:
                    conn.execute(
                        update(LossRow)
                        .where(LossRow.sink_id == sink_id, LossRow.epoch == epoch)
                        .values(
                            rows=LossRow.rows + rows,
                            files=LossRow.files + files,
                            nbytes=LossRow.nbytes + nbytes,
                            reason=(known.reason + "; " + reason)[:8000],
                            recorded_by=by,
                            recorded_at=now,
                        )
                    )
                row = self._loss_row(conn, sink_id, epoch)
                assert row is not None
                return self._loss(row)

        return self._retry(f"record a loss of epoch {epoch}", run)

    @staticmethod
    def _loss_row(conn: Connection, sink_id: str, epoch: int) -> Any:
        """The ``eosink_loss`` row of an epoch, or None."""
        return conn.execute(
            select(LossRow.__table__).where(LossRow.sink_id == sink_id, LossRow.epoch == epoch)
        ).one_or_none()

    @staticmethod
    def _loss(row: Any) -> LossRecord:
        return LossRecord(
            row.sink_id,
            row.epoch,
            row.rows,
            row.files,
            row.bytes,
            row.origin,
            row.reason,
            row.recorded_by,
            row.recorded_at,
        )

    def losses(self, sink_id: str) -> list[LossRecord]:
        """The epochs of ``sink_id`` abandoned as known losses, in epoch order."""

        def run(_: int) -> list[LossRecord]:
            with self._tx() as conn:
                rows = conn.execute(
                    select(LossRow.__table__)
                    .where(LossRow.sink_id == sink_id)
                    .order_by(LossRow.epoch)
                ).all()
            return [self._loss(r) for r in rows]

        return self._retry("a read", run)

    def gc(self, sink_id: str, generation: int, keep_last: int) -> int:
        """Delete COMMITTED rows of streaming epochs older than the newest ``keep_last``.

        Returns how many. The sink's GC floor (the largest deleted epoch) keeps what replay
        detection needs. Rows of batch epochs are never deleted (there is one per batch run,
        and an explicit batch epoch must stay exact).
        """

        def run(_: int) -> int:
            with self._tx() as conn:
                self._fence(conn, sink_id, generation)
                hw = conn.execute(
                    select(SinkRow.high_water).where(SinkRow.sink_id == sink_id)
                ).scalar_one()
                cond = (
                    (EpochRow.sink_id == sink_id)
                    & (EpochRow.status == COMMITTED)
                    & (EpochRow.epoch <= hw - keep_last)
                    & (EpochRow.origin.not_in(BATCH_ORIGINS) | EpochRow.origin.is_(None))
                )
                top = conn.execute(select(func.max(EpochRow.epoch)).where(cond)).scalar()
                if top is None:
                    return 0
                res = conn.execute(delete(EpochRow).where(cond))
                conn.execute(
                    update(SinkRow)
                    .where(SinkRow.sink_id == sink_id, SinkRow.gc_floor < top)
                    .values(gc_floor=top)
                )
                return int(res.rowcount or 0)

        return self._retry("garbage collection", run)

    def count_rows(self, sink_id: str) -> int:
        with self._tx() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(EpochRow).where(EpochRow.sink_id == sink_id)
                ).scalar_one()
            )
