"""What the meta store holds, as the rest of eosink reads it: the origins of epochs, the
owner and heartbeat conventions, and the records of sinks, epochs and losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    retired_high: int | None = None
    """``eosink retire`` retired the sink with epochs up to this one (None: never): every
    later run's epochs are above it."""
    retired_at: float | None = None
    retired_by: str | None = None

    def retirement(self) -> dict[str, Any] | None:
        """The retirement as the target's marker keeps it (``high``, ``at``, ``by``), or None."""
        if self.retired_high is None:
            return None
        return {"high": self.retired_high, "at": self.retired_at, "by": self.retired_by}


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
    spec: str | None = None
    """The stored :class:`~eosink.EpochSpec` (JSON) the epoch was staged with, or None."""
