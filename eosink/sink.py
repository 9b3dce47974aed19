"""The interfaces a sink plugin implements.

A sink is a :class:`SinkPlugin` bundle: a pydantic options model, a factory of
:class:`CoordinatedSinkWriter` (one per Spark task, on executors), a factory of
:class:`SinkCommitCoordinator` (one per sink_id, on the driver) and the versioned
:class:`Codec` of its write results and committables.

The core owns every state transition of the two-phase protocol (PENDING, COMMITTED,
ABORTED) and calls the plugin's phase methods in this order::

    driver:    coordinator.writer_setup(schema) -> setup   (validate, evolve the target's schema)
    executors: writer.begin_epoch(e); writer.write_batch(b)*; writer.finish_write(e) -> result
      or, on the native path (a :class:`SparkWriter` coordinator), on the driver:
               coordinator.write_with_spark(df, e, attempt, setup) -> [result...]
    driver:    coordinator.pre_commit(e, [result...]) -> Prepared(committable, files, bytes)
               (core persists PENDING, Spark checkpoints the epoch)
               coordinator.commit(e, committable) -> CommitOutcome | None  (core marks COMMITTED)
    recovery:  coordinator.commit(e, committable) again, or coordinator.abort(e, committable|None)

(A sink that declares ``Capabilities(epoch_spec=True)`` gets ``spec=``, the
:class:`EpochSpec` the epoch was staged with, in every ``commit`` and ``abort``.)

A plugin never touches the meta store.
"""

from __future__ import annotations

import importlib.util
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import pyarrow as pa
from pydantic import BaseModel

from ._codecs import Codec, JsonCodec
from ._mixins import (
    Capabilities,
    JournalHome,
    Retirable,
    Rolling,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
)
from ._option_errors import describe_option_errors
from ._spec import EpochSpec
from .errors import ConfigError, MissingExtraError

__all__ = [
    "Capabilities",
    "Codec",
    "CommitOutcome",
    "CoordinatedSinkWriter",
    "EpochSpec",
    "JournalHome",
    "JsonCodec",
    "Prepared",
    "Retirable",
    "Rolling",
    "SinkCommitCoordinator",
    "SinkPlugin",
    "SparkWriter",
    "StagedEpochs",
    "TargetMarker",
    "WriterContext",
    "describe_option_errors",
]

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")
OptionsT = TypeVar("OptionsT", bound=BaseModel)


@dataclass(frozen=True)
class Prepared(Generic[C]):
    """What :meth:`SinkCommitCoordinator.pre_commit` returns.

    Attributes:
        committable: what ``commit`` and ``abort`` get; encoded by the committable codec and
            persisted (PENDING) before the epoch is checkpointed.
        files: the files (or other units: objects, messages) the commit will publish.
        bytes: their size in bytes.
        held_rows: rows of committed epochs (this one included) the sink holds back after
            this commit (open files that span epochs, :class:`Rolling`); 0 for most sinks.
        held_bytes: their size in bytes.
    """

    committable: C
    files: int = 0
    bytes: int = 0
    held_rows: int = 0
    held_bytes: int = 0


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
        * Serialization: a writer is built on the executor by the plugin's writer factory from
            picklable options; it never holds a connection opened on the driver.
        * Durability: when ``finish_write`` returns, everything the result refers to is
            durable (e.g. staged files are flushed and fsync'd) but invisible to readers.
        * Thread safety: one writer is used by one thread.
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


@dataclass(frozen=True)
class CommitOutcome:
    """What one call of :meth:`SinkCommitCoordinator.commit` did, said explicitly (as Flink's
    ``CommitRequest`` lets a committer say it). A ``commit`` that returns None did
    :meth:`done`; an error it raises is an outcome too: :meth:`retry_later` when eosink's
    transient-error rule calls it transient (a :class:`~eosink.errors.CommitFailedError`, a
    lost connection, a catalog's 503), else :meth:`failed`.

    Attributes:
        kind: ``done`` (visible now), ``already_committed`` (the target had the epoch: a
            commit replayed after a crash; nothing changed), ``retry_later`` (nothing
            became visible, or the outcome is unknown; the core calls ``commit`` again
            within its retry window) or ``failed`` (for good: the epoch stays PENDING, the
            run stops with the reason, ``eosink status`` shows it).
        reason: why, for the logs and ``eosink status`` (``retry_later``, ``failed``; an
            ``already_committed`` may say how the sink knew).
        error: the exception behind it (an error ``commit`` raised), or None.
    """

    kind: Literal["done", "already_committed", "retry_later", "failed"]
    reason: str = ""
    error: BaseException | None = field(default=None, compare=False)

    @classmethod
    def done(cls) -> CommitOutcome:
        """The epoch is visible now, made so by this call."""
        return cls("done")

    @classmethod
    def already_committed(cls, reason: str = "") -> CommitOutcome:
        """The target already had the epoch (a commit replayed); nothing was changed."""
        return cls("already_committed", reason)

    @classmethod
    def retry_later(cls, reason: str) -> CommitOutcome:
        """Nothing became visible (or it is unknown whether it did): call ``commit`` again."""
        return cls("retry_later", reason)

    @classmethod
    def failed(cls, reason: str) -> CommitOutcome:
        """The commit can never succeed as it is (a known reason, said to the operator)."""
        return cls("failed", reason)


class SinkCommitCoordinator(ABC, Generic[R, C]):
    """Turns the write results of an epoch into one visible commit. Runs on the driver.

    Contract:
        * Idempotency: ``commit(e, c)`` may be called again after it succeeded (a crash between
            the target's commit and the COMMITTED mark). It detects "already committed" from
            the target itself and then does nothing.
        * Abort: ``abort(e, c)`` never raises and leaves no orphaned data behind. ``c`` is None
            when the epoch crashed before its committable was persisted: delete whatever was
            staged for ``e``.
        * Serialization: committables are encoded by the plugin's committable codec and must be
            enough, alone, to finish the epoch in a new process.
        * Thread safety: the core calls one method at a time.
        * Staged as persisted: a PENDING epoch may be finished by a later run, given other
            options. A sink whose commit depends on its options (a mode, key columns, a
            table) declares ``Capabilities(epoch_spec=True)`` and defines ``commit(self,
            epoch, committable, spec=None)`` and ``abort(self, epoch, committable,
            spec=None)``: the core then passes the :class:`EpochSpec` it persisted with the
            committable (options without secrets, schema) in every call.
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
    def pre_commit(self, epoch: int, results: Sequence[R]) -> Prepared[C]:
        """Aggregate all write results of ``epoch`` (N results -> 1 committable).

        Schema changes are not handled here: :meth:`writer_setup` gets every epoch's schema
        first, on the driver, and is the one place where a sink evolves its target.

        Args:
            epoch: the epoch.
            results: the write results of every successful task of the epoch.

        Returns:
            :class:`Prepared`: the committable with the number of files (or other units)
                and bytes it will publish (shown in figures, ``eosink status`` and logs).
                Nothing may become visible yet.
        """

    @abstractmethod
    def commit(self, epoch: int, committable: C) -> CommitOutcome | None:
        """Make the epoch visible. Idempotent (see the class contract).

        Returns:
            None or :meth:`CommitOutcome.done` when this call made it visible;
            :meth:`CommitOutcome.already_committed` when the target had it (said in the
            logs: a replayed commit); :meth:`CommitOutcome.retry_later` or
            :meth:`CommitOutcome.failed` to say so without an exception.

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
        describe_open: what the sink holds open at its target, for ``eosink status`` (an open
            rolling file, a transaction an interrupted commit may have left open), or None.
            Called on an operator's machine with ``(sink_id, last_committed, pending)``: the
            decoded committable of the last COMMITTED epoch (None when there is none) and
            those of the PENDING epochs by epoch. Contract: read only these (status has no
            sink options and must not touch the target); return one JSON-able dict per open
            thing, with ``kind`` (``"open file"``, ``"transaction"``...) and ``what`` (one
            line for people, no secrets), anything else for ``--json``; ``[]`` when nothing
            is open. An exception is shown as "cannot describe", never fails ``status``.
        requires: the readiness declaration: Python modules the sink needs at run time, each
            with what to ``pip install`` to get it, usually an extra of the package that
            provides the sink: ``{"pyiceberg": "eosink[iceberg]"}``,
            ``{"boto3": "my-sink[s3]"}``. Checked without importing anything (so listing
            stays cheap): ``eosink plugins`` shows a sink whose module is missing as
            ``missing extra`` with the ``pip install`` that fixes it, and running it raises
            :class:`~eosink.errors.MissingExtraError` (a ``ConfigError``) with the same
            command before any Spark job (:meth:`check_ready`). Import such modules inside
            the factories, never at the top of the plugin module: a sink whose module
            cannot be imported cannot be listed either.
        capabilities: what the sink offers beyond the mandatory contract
            (:class:`Capabilities`); read by the core before any connection is made. None
            (a plugin written before the record existed): read from the coordinator's
            classes, with a ``DeprecationWarning``.
        path_options: the names of the sink's options whose values are locations: a path, a
            URI or a SQLAlchemy URL (whose SQLite database is a path), e.g.
            ``("warehouse",)``. ``path``, ``staging_path``, ``checkpointLocation`` and
            ``metastore_url`` are the core's and need not be listed. ``format("eosink")``
            over Spark Connect makes relative ones absolute on the client (the server's
            Python worker runs in a temporary folder) and refuses those that reach the
            server relative.
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
    requires: Mapping[str, str] = field(default_factory=dict, hash=False)
    describe_open: Callable[[str, C | None, Mapping[int, C]], list[dict[str, Any]]] | None = None
    path_options: tuple[str, ...] = ()
    capabilities: Capabilities | None = None

    def missing_requirements(self) -> dict[str, str]:
        """The declared modules (:attr:`requires`) that cannot be found: module -> install."""
        return {m: target for m, target in self.requires.items() if not _importable(m)}

    def check_ready(self) -> None:
        """Raise unless every module the sink declares (:attr:`requires`) is installed.

        Raises:
            MissingExtraError: a ``ConfigError`` naming the module and the
                ``pip install '...'`` that installs it.
        """
        missing = self.missing_requirements()
        if not missing:
            return
        install = next(iter(missing.values()))  # one pip install at a time
        modules = ", ".join(m for m, target in missing.items() if target == install)
        extra = re.fullmatch(r"[^\[\]]+\[([^\]]+)\]", install)
        raise MissingExtraError(
            modules,
            extra.group(1) if extra else install,
            f"the {self.name} sink",
            install=install,
        )

    def parse_options(self, options: dict[str, Any]) -> OptionsT:
        """Validate raw options with the options model.

        Raises:
            ConfigError: naming the sink and, for every invalid field, the field, the value
                given (secrets masked, see :func:`describe_option_errors`) and what is allowed.
        """
        from pydantic import ValidationError

        try:
            return self.options_model.model_validate(options)
        except ValidationError as exc:
            problems = describe_option_errors(self.options_model, exc)
            raise ConfigError(f"invalid options for sink {self.name!r}: {problems}") from None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package; a module without a spec
        return False


# -- option errors ---------------------------------------------------------------------------
