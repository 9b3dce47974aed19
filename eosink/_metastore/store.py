"""The meta store: the two-phase state machine persisted with SQLAlchemy.

Every state change runs in one transaction that first checks the caller's fencing
generation (``UPDATE eosink_sink ... WHERE generation = :g``): once a newer coordinator has
acquired the sink, a zombie's change fails with :class:`~eosink.errors.FencedError`.

Transitions (anything else raises :class:`~eosink.errors.InvalidTransitionError`)::

    (none) -> PENDING -> COMMITTED
              PENDING -> ABORTED -> (row deleted)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from sqlalchemy.exc import IntegrityError, NoSuchModuleError, OperationalError, SQLAlchemyError

from ..errors import (
    FencedError,
    InvalidTransitionError,
    MetaStoreError,
    MetaStoreUnavailableError,
    MissingExtraError,
)
from .migrations import ensure_schema
from .models import ABORTED, COMMITTED, PENDING, EpochRow, SinkRow

log = logging.getLogger("eosink.metastore")

__all__ = ["EpochRecord", "MetaStore", "SinkRecord", "default_url", "redact_url"]


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


def redact_url(url: str) -> str:
    """The URL with its password hidden, for logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable meta store URL>"


def default_url(checkpoint_location: str | None = None) -> str:
    """The meta store URL used when none is given.

    ``EOSINK_METASTORE_URL`` if set; otherwise a SQLite file inside a local checkpoint
    location (streaming) or ``$EOSINK_HOME/metastore.db`` (``~/.eosink`` by default).
    """
    env = os.environ.get("EOSINK_METASTORE_URL")
    if env:
        return env
    if checkpoint_location and "://" not in checkpoint_location.removeprefix("file://"):
        base = Path(checkpoint_location.removeprefix("file://")) / "eosink"
    else:
        base = Path(os.environ.get("EOSINK_HOME", Path.home() / ".eosink"))
    base.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(base / 'metastore.db').resolve()}"


def _make_engine(url: str) -> Engine:
    u = make_url(url)
    if u.get_backend_name() == "postgresql" and u.get_driver_name() in ("", "psycopg2"):
        # psycopg 3 is the driver that the `postgres` extra installs.
        u = u.set(drivername="postgresql+psycopg")
    try:
        if u.get_backend_name() == "sqlite":
            if u.database and u.database != ":memory:":
                Path(u.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(u, connect_args={"timeout": 60})

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
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

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = url
        self.engine = _make_engine(url)
        try:
            with self.engine.connect() as conn:
                ensure_schema(conn, create=create)
                conn.commit()
        except OperationalError as exc:
            self.engine.dispose()
            raise MetaStoreUnavailableError(
                f"meta store {redact_url(url)} is unreachable: {exc.orig}"
            ) from None

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
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)

    # -- sinks ---------------------------------------------------------------------------
    def acquire(self, sink_id: str, plugin: str, options_json: str | None = None) -> SinkRecord:
        """Become the live coordinator of ``sink_id``: bump its generation (fencing any other)."""
        now = time.time()
        owner = f"{socket.gethostname()}:{os.getpid()}"
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
                            )
                        )
                except IntegrityError:  # raced with another driver creating it
                    conn.execute(
                        update(SinkRow)
                        .where(SinkRow.sink_id == sink_id)
                        .values(generation=SinkRow.generation + 1, owner=owner, updated_at=now)
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
        )

    def sink(self, sink_id: str) -> SinkRecord | None:
        with self._tx() as conn:
            return self._sink(conn, sink_id)

    def sinks(self) -> list[SinkRecord]:
        with self._tx() as conn:
            ids = conn.execute(select(SinkRow.sink_id).order_by(SinkRow.sink_id)).scalars().all()
            return [r for r in (self._sink(conn, i) for i in ids) if r is not None]

    def set_lineage(self, sink_id: str, generation: int, lineage: str, epoch_base: int) -> None:
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)
            conn.execute(
                update(SinkRow)
                .where(SinkRow.sink_id == sink_id)
                .values(lineage=lineage, epoch_base=epoch_base)
            )

    def set_schema(self, sink_id: str, generation: int, arrow_schema: bytes) -> None:
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)
            conn.execute(
                update(SinkRow).where(SinkRow.sink_id == sink_id).values(arrow_schema=arrow_schema)
            )

    def max_epoch(self, sink_id: str) -> int:
        """The largest epoch this sink ever used (-1 if none)."""
        with self._tx() as conn:
            hw = conn.execute(
                select(SinkRow.high_water).where(SinkRow.sink_id == sink_id)
            ).scalar_one_or_none()
            mx = conn.execute(
                select(func.max(EpochRow.epoch)).where(EpochRow.sink_id == sink_id)
            ).scalar_one_or_none()
        return max(-1 if hw is None else hw, -1 if mx is None else mx)

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
        )

    def epoch(self, sink_id: str, epoch: int) -> EpochRecord | None:
        with self._tx() as conn:
            row = conn.execute(
                select(EpochRow.__table__).where(
                    EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                )
            ).one_or_none()
            return None if row is None else self._record(row)

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
        with self._tx() as conn:
            rows = [self._record(r) for r in conn.execute(q).all()]
        return sorted(rows, key=lambda r: r.epoch)

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
    ) -> None:
        """(none) -> PENDING. Once this returns, the epoch can be finished from the row alone."""
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
                            created_at=now,
                            updated_at=now,
                        )
                    )
            except IntegrityError:
                status = conn.execute(
                    select(EpochRow.status).where(
                        EpochRow.sink_id == sink_id, EpochRow.epoch == epoch
                    )
                ).scalar_one_or_none()
                raise InvalidTransitionError(
                    f"sink {sink_id!r} epoch {epoch}: {status} -> {PENDING} is not allowed"
                ) from None

    def _transition(
        self, conn: Connection, sink_id: str, epoch: int, src: str, dst: str, **values: Any
    ) -> None:
        res = conn.execute(
            update(EpochRow)
            .where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch, EpochRow.status == src)
            .values(status=dst, updated_at=time.time(), **values)
        )
        if res.rowcount != 1:
            cur = conn.execute(
                select(EpochRow.status).where(EpochRow.sink_id == sink_id, EpochRow.epoch == epoch)
            ).scalar_one_or_none()
            raise InvalidTransitionError(
                f"sink {sink_id!r} epoch {epoch}: {cur or '(none)'} -> {dst} is not allowed"
            )

    def mark_committed(
        self, sink_id: str, generation: int, epoch: int, *, commit_ms: float
    ) -> None:
        """PENDING -> COMMITTED, and raise the sink's high-water mark."""
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)
            self._transition(
                conn,
                sink_id,
                epoch,
                PENDING,
                COMMITTED,
                commit_ms=commit_ms,
                committed_at=time.time(),
            )
            conn.execute(
                update(SinkRow)
                .where(SinkRow.sink_id == sink_id)
                .values(
                    high_water=func.max(SinkRow.high_water, epoch)
                    if conn.dialect.name == "sqlite"
                    else func.greatest(SinkRow.high_water, epoch),
                    committed_epochs=SinkRow.committed_epochs + 1,
                )
            )

    def mark_aborted(self, sink_id: str, generation: int, epoch: int) -> None:
        """PENDING -> ABORTED."""
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)
            self._transition(conn, sink_id, epoch, PENDING, ABORTED)

    def finish_abort(self, sink_id: str, generation: int, epoch: int) -> None:
        """ABORTED -> (row deleted), once the plugin's abort cleaned up."""
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)
            res = conn.execute(
                delete(EpochRow).where(
                    EpochRow.sink_id == sink_id, EpochRow.epoch == epoch, EpochRow.status == ABORTED
                )
            )
            if res.rowcount != 1:
                raise InvalidTransitionError(
                    f"sink {sink_id!r} epoch {epoch}: only an ABORTED epoch can be finished"
                )

    def gc(self, sink_id: str, generation: int, keep_last: int) -> int:
        """Delete COMMITTED rows older than the newest ``keep_last`` epochs. Returns how many.

        The sink's high-water mark keeps what replay detection needs.
        """
        with self._tx() as conn:
            self._fence(conn, sink_id, generation)
            hw = conn.execute(
                select(SinkRow.high_water).where(SinkRow.sink_id == sink_id)
            ).scalar_one()
            res = conn.execute(
                delete(EpochRow).where(
                    EpochRow.sink_id == sink_id,
                    EpochRow.status == COMMITTED,
                    EpochRow.epoch <= hw - keep_last,
                )
            )
            return int(res.rowcount or 0)

    def count_rows(self, sink_id: str) -> int:
        with self._tx() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(EpochRow).where(EpochRow.sink_id == sink_id)
                ).scalar_one()
            )
