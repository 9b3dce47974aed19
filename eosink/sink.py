"""The interfaces a sink plugin implements.

A sink is a :class:`SinkPlugin` bundle: a pydantic options model, a factory of
:class:`CoordinatedSinkWriter` (one per Spark task, on executors), a factory of
:class:`SinkCommitCoordinator` (one per sink_id, on the driver) and the versioned
:class:`Codec` of its write results and committables.

The core owns every state transition of the two-phase protocol (PENDING, COMMITTED,
ABORTED) and calls the plugin's phase methods in this order::

    executors: writer.begin_epoch(e); writer.write_batch(b)*; writer.finish_write(e) -> result
    driver:    coordinator.pre_commit(e, [result...], add_columns) -> committable
               (core persists PENDING, Spark checkpoints the epoch)
               coordinator.commit(e, committable)          (core marks COMMITTED)
    recovery:  coordinator.commit(e, committable) again, or coordinator.abort(e, committable|None)

A plugin never touches the meta store.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import pyarrow as pa
from pydantic import BaseModel

__all__ = [
    "Codec",
    "CoordinatedSinkWriter",
    "JsonCodec",
    "SinkCommitCoordinator",
    "SinkPlugin",
    "StagedEpochs",
    "TargetMarker",
    "WriterContext",
]

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")
OptionsT = TypeVar("OptionsT", bound=BaseModel)


@runtime_checkable
class Codec(Protocol[T]):
    """Serializes a write result or a committable to bytes, with a version.

    Contract:
        Versioning: ``version`` is stored beside every encoded value. ``decode`` must accept
        every version it ever wrote, so that a committable persisted by an older eosink can
        still be committed after an upgrade.
    """

    @property
    def version(self) -> int:
        """The version ``encode`` writes (stored beside every encoded value)."""
        ...

    def encode(self, value: T) -> bytes:
        """Return the bytes of ``value``."""
        ...

    def decode(self, data: bytes, version: int) -> T:
        """Rebuild a value from bytes written by ``encode`` at ``version``."""
        ...


@dataclass(frozen=True)
class JsonCodec(Generic[T]):
    """A codec for JSON-serializable values (dicts, lists, strings, numbers)."""

    version: int = 1

    def encode(self, value: T) -> bytes:
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    def decode(self, data: bytes, version: int) -> T:
        if version > self.version:
            raise ValueError(
                f"cannot decode version {version}: this codec reads up to {self.version}"
            )
        return json.loads(data)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class WriterContext:
    """Where a writer runs. Picklable; built by the core inside each Spark task.

    Attributes:
        sink_id: the stable name of the sink.
        epoch: the epoch being written.
        partition_id: the Spark partition the task writes.
        attempt_id: unique per task attempt (a retried task gets a new one); use it in staged
            file names so that two attempts never overwrite each other.
        setup: what the coordinator's ``writer_setup`` returned for this epoch (or None).
    """

    sink_id: str
    epoch: int
    partition_id: int
    attempt_id: str
    setup: Any = None


class CoordinatedSinkWriter(ABC, Generic[R]):
    """Writes the rows of one Spark partition for one epoch. Runs on executors.

    Contract:
        Serialization: a writer is built on the executor by the plugin's writer factory from
            picklable options; it never holds a connection opened on the driver.
        Durability: when ``finish_write`` returns, everything the result refers to is
            durable (e.g. staged files are flushed and fsync'd) but invisible to readers.
        Thread safety: one writer is used by one thread.
    """

    @abstractmethod
    def begin_epoch(self, epoch: int) -> None:
        """Start writing ``epoch``. Called once before the first batch."""

    @abstractmethod
    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Stage the rows of ``batch``. Must not make anything visible to readers."""

    @abstractmethod
    def finish_write(self, epoch: int) -> R:
        """Flush and return the write result: small metadata, never row data."""

    def abort_write(self) -> None:
        """Called when the task fails; delete what this writer staged. Must not raise."""


class SinkCommitCoordinator(ABC, Generic[R, C]):
    """Turns the write results of an epoch into one visible commit. Runs on the driver.

    Contract:
        Idempotency: ``commit(e, c)`` may be called again after it succeeded (a crash between
            the target's commit and the COMMITTED mark). It detects "already committed" from
            the target itself and then does nothing.
        Abort: ``abort(e, c)`` never raises and leaves no orphaned data behind. ``c`` is None
            when the epoch crashed before its committable was persisted: delete whatever was
            staged for ``e``.
        Serialization: committables are encoded by the plugin's committable codec and must be
            enough, alone, to finish the epoch in a new process.
        Thread safety: the core calls one method at a time.
    """

    def init(self) -> None:
        """Called once when the coordinator starts, before recovery."""

    def writer_setup(self, schema: pa.Schema) -> Any:
        """Called on the driver before the writers of an epoch start.

        Validate ``schema`` against the target (raise
        :class:`~eosink.errors.SchemaMismatchError` naming the column), prepare the target,
        and return a small picklable value that every writer receives as ``ctx.setup``
        (e.g. the target's metadata, so executors need not ask a catalog). Default: None.
        """
        return None

    @abstractmethod
    def pre_commit(self, epoch: int, results: Sequence[R], add_columns: Sequence[pa.Field]) -> C:
        """Aggregate all write results of ``epoch`` (N results -> 1 committable).

        Args:
            epoch: the epoch.
            results: the write results of every successful task of the epoch.
            add_columns: columns the DataFrame gained since the previous epoch.

        Returns:
            The committable. Nothing may become visible yet.
        """

    @abstractmethod
    def commit(self, epoch: int, committable: C) -> None:
        """Make the epoch visible. Idempotent (see the class contract).

        Raises:
            CommitFailedError: nothing became visible; the core retries.
            CommitStateUnknownError: unknown outcome; the core calls ``commit`` again.
        """

    @abstractmethod
    def abort(self, epoch: int, committable: C | None) -> None:
        """Discard the epoch's staged data. Never raises."""

    def target_id(self) -> str | None:
        """A stable name of the place this sink writes to (resolved path, table uuid...).

        Called after :meth:`init`. The core binds the sink_id to it in the meta store at the
        first start; a later run of the same sink_id against another target is refused
        (:class:`~eosink.errors.SinkIdentityError`). Default: None (no check).
        """
        return None

    def close(self) -> None:
        """Release resources. Called when the run ends."""


class StagedEpochs(ABC):
    """Optional mixin for a coordinator: lists the epochs with staged data.

    At recovery the core calls ``abort(e, None)`` for every listed epoch that is neither
    PENDING, COMMITTED nor being written, so data staged by a crashed run before its
    committable was persisted, or by failed task attempts, is never left behind.
    """

    @abstractmethod
    def staged_epochs(self) -> Iterable[int]:
        """Return the epochs for which anything is staged."""


class TargetMarker(ABC):
    """Optional mixin for a coordinator: the target itself remembers the sink.

    The meta store can be lost, replaced or not shared (a new machine, another
    ``EOSINK_HOME``); the target cannot. The core writes a small marker into the target at
    every start and reads it back at the next one, so that a fresh checkpoint, a lost meta
    store or a meta store that is behind the target is detected from the target alone.

    The marker is a JSON-able dict written by the core with the keys ``sink_id``, ``plugin``,
    ``target``, ``lineage`` (the current streaming lineage or None) and ``epoch_base``.

    Contract:
        Isolation: markers are per sink_id (several sinks may write to one target); a
            coordinator reads and writes only its own sink's marker.
        Durability: :meth:`write_marker` returns once the marker is durable.
        last_epoch: :meth:`read_marker` adds ``last_epoch``: the newest epoch whose commit
            reached the target, or -1. ``commit`` maintains it itself, at the latest
            atomically with making the epoch visible (a table property in the same
            snapshot, a marker rewritten before the files are published), and never lowers
            it (a backfill of an older epoch keeps the maximum).
    """

    @abstractmethod
    def read_marker(self) -> dict[str, Any] | None:
        """This sink's marker in the target (with ``last_epoch``), or None if there is none."""

    @abstractmethod
    def write_marker(self, marker: dict[str, Any]) -> None:
        """Store ``marker`` durably in the target, keeping the current ``last_epoch``."""


@dataclass(frozen=True)
class SinkPlugin(Generic[OptionsT, R, C]):
    """What a plugin registers for one sink name.

    Attributes:
        name: the name users pass as ``sink=``.
        options_model: pydantic model validating the sink's options before any job starts.
        writer_factory: builds a writer on an executor from (options, context). Must be a
            module-level function (it is pickled by reference).
        coordinator_factory: builds the coordinator on the driver from (options, sink_id).
        write_result_codec: codec of the writers' results.
        committable_codec: codec of the committables persisted in the meta store.
        default_sink_id: derives a stable sink_id from the options (e.g. ``file:/data/out``).
        validate_schema: raises :class:`~eosink.errors.SchemaMismatchError` naming the column
            when the sink cannot write a DataFrame of this Arrow schema.
        description: one line for ``eosink plugins``.
    """

    name: str
    options_model: type[OptionsT]
    writer_factory: Callable[[OptionsT, WriterContext], CoordinatedSinkWriter[R]]
    coordinator_factory: Callable[[OptionsT, str], SinkCommitCoordinator[R, C]]
    write_result_codec: Codec[R]
    committable_codec: Codec[C]
    default_sink_id: Callable[[OptionsT], str]
    validate_schema: Callable[[OptionsT, pa.Schema], None] | None = None
    description: str = ""

    def parse_options(self, options: dict[str, Any]) -> OptionsT:
        """Validate raw options with the options model.

        Raises:
            ConfigError: naming the sink and every invalid field.
        """
        from pydantic import ValidationError

        from .errors import ConfigError

        try:
            return self.options_model.model_validate(options)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(options)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(f"invalid options for sink {self.name!r}: {problems}") from None
