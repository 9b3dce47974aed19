"""SQLAlchemy 2 model of the meta store. The Alembic migrations in ``alembic/`` create it."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer, LargeBinary, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PENDING = "PENDING"
COMMITTED = "COMMITTED"
ABORTED = "ABORTED"


class Base(DeclarativeBase):
    metadata = MetaData()


class SinkRow(Base):
    """One row per sink_id: fencing generation, epoch lineage, high-water mark."""

    __tablename__ = "eosink_sink"

    sink_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    plugin: Mapped[str] = mapped_column(String(128))
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    owner: Mapped[str] = mapped_column(String(256), default="")
    lineage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    epoch_base: Mapped[int] = mapped_column(BigInteger, default=0)
    high_water: Mapped[int] = mapped_column(BigInteger, default=-1)
    committed_epochs: Mapped[int] = mapped_column(BigInteger, default=0)
    arrow_schema: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    options_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    target: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    gc_floor: Mapped[int] = mapped_column(BigInteger, default=-1)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_error_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_roll: Mapped[str | None] = mapped_column(Text, nullable=True)
    retired_high: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """``eosink retire``: the retired sink's highest epoch (None: never retired)."""
    retired_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    retired_by: Mapped[str | None] = mapped_column(String(256), nullable=True)


class EpochRow(Base):
    """The two-phase state of one epoch of one sink (the ``pending_sink_state`` table)."""

    __tablename__ = "pending_sink_state"

    sink_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(String(16), index=True)
    committable: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    codec_version: Mapped[int] = mapped_column(Integer, default=1)
    generation: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(BigInteger, default=0)
    files: Mapped[int] = mapped_column(Integer, default=0)
    nbytes: Mapped[int] = mapped_column("bytes", BigInteger, default=0)
    batch_end_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    pre_commit_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    commit_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    committed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    origin: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    spec: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The :class:`~eosink.EpochSpec` the epoch was staged with (its JSON), or NULL."""


class LossRow(Base):
    """An epoch abandoned by an operator (``eosink abandon --accept-data-loss``): never
    published, kept as a known loss forever."""

    __tablename__ = "eosink_loss"

    sink_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    rows: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer)
    nbytes: Mapped[int] = mapped_column("bytes", BigInteger)
    origin: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    recorded_by: Mapped[str] = mapped_column(String(256))
    recorded_at: Mapped[float] = mapped_column(Float)
