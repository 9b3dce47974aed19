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
               coordinator.commit(e, committable)          (core marks COMMITTED)
    recovery:  coordinator.commit(e, committable) again, or coordinator.abort(e, committable|None)

A plugin never touches the meta store.
"""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import pyarrow as pa
from pydantic import BaseModel

from .errors import ConfigError, MissingExtraError
from .util import is_secret_name, redact

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "Capabilities",
    "Codec",
    "CoordinatedSinkWriter",
    "JournalHome",
    "JsonCodec",
    "Prepared",
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


@runtime_checkable
class Codec(Protocol[T]):
    """Serializes a write result or a committable to bytes, with a version.

    Contract:
        * Versioning: ``version`` is stored beside every encoded value. ``decode`` must accept
            every version it ever wrote, so that a committable persisted by an older eosink
            can still be committed after an upgrade.
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
    """A codec for JSON-serializable values (dicts, lists, strings, numbers).

    Give it the type it encodes, so that mypy checks the plugin against it::

        committable_codec=JsonCodec[dict[str, Any]](version=1)

    (``JsonCodec(version=1)`` alone is a ``JsonCodec[Never]`` for a strict type checker.)
    """

    version: int = 1

    def encode(self, value: T) -> bytes:
        """Compact JSON with sorted keys (the same value always gives the same bytes)."""
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    def decode(self, data: bytes, version: int) -> T:
        """Parse JSON written at any version up to :attr:`version`.

        Raises:
            ValueError: ``version`` is newer than this codec (written by a newer release).
        """
        if version > self.version:
            raise ValueError(
                f"cannot decode version {version}: this codec reads up to {self.version}"
            )
        return json.loads(data)  # type: ignore[no-any-return]


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


class SparkWriter(ABC, Generic[R]):
    """Optional mixin for a coordinator: stages an epoch with Spark's own writers.

    The *native path*. Moving every row from the JVM into Python workers costs as much as
    Spark's whole Parquet write; where Spark can write the target's files itself, a sink
    lets it: the core calls :meth:`write_with_spark` on the driver instead of running
    :class:`CoordinatedSinkWriter` tasks, and the rest of the protocol (``pre_commit``,
    PENDING, checkpoint, ``commit``, recovery) is the same.

    Contract:
        * Invisibility: everything is written under a staging location of the sink, derived
            from ``(epoch, attempt)``, that readers never see; ``abort(epoch, None)`` deletes
            everything staged for ``epoch`` (the core calls it when the write fails, and at
            recovery for every epoch :meth:`StagedEpochs.staged_epochs` lists).
        * Failed attempts: Spark's commit protocol (``DataFrameWriter``) keeps the files of
            failed or speculative task attempts out of the written directory; the results
            list only files of the committed job.
        * Same results: :meth:`write_with_spark` returns results of the shape the sink's
            Python writers return (``write_result_codec`` encodes them), so ``pre_commit``
            and every later phase are shared by both paths.
    """

    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        """Why :meth:`write_with_spark` cannot write DataFrames of ``schema``, or None.

        Called on the driver before each epoch; when it returns a reason, the core runs the
        Python writers for the epoch (and logs the reason once). Default: None.
        """
        return None

    @abstractmethod
    def write_with_spark(self, df: DataFrame, epoch: int, attempt: str, setup: Any) -> list[R]:
        """Stage the rows of ``df`` for ``epoch`` with Spark's writers; return the results.

        Args:
            df: the epoch's (batch) DataFrame.
            epoch: the epoch.
            attempt: unique per call; part of the staging location, so that a retried write
                never meets an earlier attempt's files.
            setup: what :meth:`SinkCommitCoordinator.writer_setup` returned for the epoch.

        Returns:
            The write results ``pre_commit`` aggregates. Nothing may be visible to readers.
        """

    def check_spark_write(self, epoch: int, results: Sequence[R], rows: int) -> None:
        """Check the results of :meth:`write_with_spark` against the rows Spark counted.

        Called on the driver right after :meth:`write_with_spark`, before ``pre_commit``
        (so before anything is persisted), with the rows the write itself counted
        (``df.observe`` on the DataFrame it was given). Spark's job commit runs on the
        driver and sees the staging location as the driver sees it: a location that is not
        the same for every node (a local path that is not a shared mount) loses, without any
        error from Spark, the files of the tasks that ran elsewhere. A sink that can count
        the rows its results hold (e.g. from file footers) raises here when they do not add
        up; the core then discards the epoch (``abort(epoch, None)``) and the run fails.
        Default: no check.

        Raises:
            SinkError: the results do not hold the ``rows`` rows Spark wrote.
        """


class Rolling(ABC):
    """Optional mixin for a coordinator whose files span epochs (they *roll*).

    Such a sink commits an epoch's rows into open files that become visible later, when a
    rolling condition is met (size, rows, age, inactivity). Some conditions are met between
    epochs, and a run's end must not leave rows waiting: the core calls :meth:`roll` at the
    end of a batch run (``everything=True``), when a stream stops or ends
    (``everything=True``) and, while a stream runs, whenever :meth:`next_roll_in` says a
    file is due (from a timer thread on the driver).

    Contract:
        * Only committed data: a roll publishes rows of committed epochs only; it never runs
            while an epoch the coordinator prepared is neither committed nor aborted (it
            returns 0 then), so it cannot race a PENDING epoch's commit or its recovery.
        * Crash safety from the target: a roll changes no meta store state, so a crash in it
            is repaired from the target at the next ``init`` (a rolled file found published
            while its open file is still recorded is not published again).
        * Thread-safe against ``pre_commit``/``commit``/``abort`` on other threads.
    """

    @abstractmethod
    def roll(self, everything: bool) -> int:
        """Publish the open files that are due (every one with ``everything``).

        Returns:
            The number of files published.
        """

    @abstractmethod
    def next_roll_in(self) -> float | None:
        """Seconds until an open file is due by time, or None when none can be."""


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
        * Isolation: markers are per sink_id (several sinks may write to one target); a
            coordinator reads and writes only its own sink's marker.
        * Durability: :meth:`write_marker` returns once the marker is durable.
        * last_epoch: :meth:`read_marker` adds ``last_epoch``: the newest epoch whose commit
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


class JournalHome(ABC):
    """Optional mixin for a coordinator: a directory beside the target for the batch journal.

    A batch run has no checkpoint, and on a cluster its driver may be restarted on another
    machine, with a new (default, local) meta store. The core keeps a journal of the sink's
    batch epochs in this directory: each epoch's committable before its PENDING row, and a
    record once it is COMMITTED. A batch job re-run with the same ``epoch=`` on another
    machine then finishes a crashed run's epoch, or skips a committed one, exactly as with
    the original meta store. (Streams keep their journal in their checkpoint.)

    Contract:
        * The directory is reached by every driver of the sink: it lives with the target
          (the file sink: ``<path>/_eosink/journal``), never on a driver's local disk.
        * It is a local path (or a mount); return None where the target has none (an object
          store): the core then relies on the meta store alone.
        * The sink never reads, lists as data, or deletes what the core writes there.
    """

    @abstractmethod
    def journal_location(self) -> str | None:
        """The batch journal's directory, or None."""


@dataclass(frozen=True)
class Capabilities:
    """What a sink offers beyond the mandatory contract (:class:`SinkCommitCoordinator`),
    declared on its :class:`SinkPlugin` so that the core knows it before any connection is
    made. The core reads this record and nothing else to decide what to call.

    Each flag promises that the sink's coordinator implements the matching class; the core
    checks the promise when it builds the coordinator (a broken promise is a
    :class:`~eosink.errors.ConfigError` naming the plugin and the class).

    Attributes:
        target_marker: :class:`TargetMarker`: the target remembers the sink.
        staged_epochs: :class:`StagedEpochs`: the epochs with staged data can be listed.
        journal_home: :class:`JournalHome`: a directory beside the target for the batch
            journal.
        spark_writer: :class:`SparkWriter`: Spark's own writers can stage an epoch.
        rolling: :class:`Rolling`: files span epochs and are published by ``roll``.
    """

    target_marker: bool = False
    staged_epochs: bool = False
    journal_home: bool = False
    spark_writer: bool = False
    rolling: bool = False

    @staticmethod
    def implemented_by(coordinator: object) -> Capabilities:
        """The capabilities ``coordinator``'s classes implement (the record of a plugin that
        declares none, which eosink reads this way for one more minor release)."""
        return Capabilities(**{f: isinstance(coordinator, c) for f, c in _MIXINS.items()})

    def check(self, coordinator: object, plugin: str) -> None:
        """Raise unless ``coordinator`` implements every capability declared here.

        Raises:
            ConfigError: naming the plugin, the flag and the class to implement.
        """
        for flag, cls in _MIXINS.items():
            if getattr(self, flag) and not isinstance(coordinator, cls):
                raise ConfigError(
                    f"sink plugin {plugin!r} declares capabilities {flag}=True, but its "
                    f"coordinator ({type(coordinator).__name__}) does not implement "
                    f"eosink.{cls.__name__}: implement it, or declare {flag}=False"
                )


_MIXINS: dict[str, type] = {
    "target_marker": TargetMarker,
    "staged_epochs": StagedEpochs,
    "journal_home": JournalHome,
    "spark_writer": SparkWriter,
    "rolling": Rolling,
}
_undeclared_told: set[str] = set()


def capabilities_of(plugin: SinkPlugin[Any, Any, Any], coordinator: object) -> Capabilities:
    """The capabilities the core uses for ``plugin``'s ``coordinator``: the declared record,
    checked against the coordinator; for a plugin that declares none, what its coordinator
    implements, with a ``DeprecationWarning`` (once per plugin).

    Raises:
        ConfigError: the coordinator does not implement a declared capability.
    """
    if plugin.capabilities is not None:
        plugin.capabilities.check(coordinator, plugin.name)
        return plugin.capabilities
    found = Capabilities.implemented_by(coordinator)
    if plugin.name not in _undeclared_told:
        _undeclared_told.add(plugin.name)
        flags = ", ".join(f"{f}=True" for f in _MIXINS if getattr(found, f))
        warnings.warn(
            f"sink plugin {plugin.name!r} declares no capabilities; eosink reads them from its "
            "coordinator's classes for now. Declare them: SinkPlugin(..., "
            f"capabilities=eosink.Capabilities({flags})); a later minor release requires it",
            DeprecationWarning,
            stacklevel=2,
        )
    return found


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
_HIDDEN = "*** (hidden)"
_PREFIXES = ("Value error, ", "Assertion failed, ")


def _is_secret_type(annotation: Any) -> bool:
    from pydantic import SecretBytes, SecretStr

    if annotation in (SecretStr, SecretBytes):
        return True
    return any(_is_secret_type(a) for a in getattr(annotation, "__args__", ()) or ())


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in getattr(annotation, "__args__", ()) or ():
        found = _nested_model(a)
        if found is not None:
            return found
    return None


def _field_named(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias, info.validation_alias):
            return info
    return None


def _is_secret(model: type[BaseModel], loc: Sequence[Any]) -> bool:
    """Whether the value at ``loc`` may be a secret: a SecretStr/SecretBytes field, a field
    declared with ``repr=False``, or a field or key named like a credential."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, str) and is_secret_name(part):
            return True
        info = _field_named(current, str(part)) if current is not None else None
        if info is not None:
            if not info.repr or _is_secret_type(info.annotation):
                return True
            current = _nested_model(info.annotation)
    return False


def _mask(value: Any) -> Any:
    """``value`` with credential-named keys of mappings hidden and URL passwords removed."""
    if isinstance(value, Mapping):
        return {
            k: _HIDDEN if isinstance(k, str) and is_secret_name(k) else _mask(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(_mask(v) for v in value)
    if isinstance(value, str):
        return redact(value)
    return value


def _shown(value: Any, limit: int = 120) -> str:
    text = repr(_mask(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_option_errors(model: type[BaseModel], exc: Any) -> str:
    """One line for a pydantic ``ValidationError`` of a sink's options model.

    Per problem: the field, what is wrong or allowed (pydantic's message without its
    ``Value error,`` boilerplate, or the validator's own message) and the value given,
    unless the message already shows it. A value that may be a secret (a ``SecretStr`` or
    ``SecretBytes`` field, a field with ``repr=False``, a field or key named like a password,
    token, key or credential) is never shown; credential-named keys inside a dict and the
    password of a URL are masked in any value. Unknown options list the sink's options and
    never show their value (a misspelt credential key is still a credential).
    """
    problems: list[str] = []
    unknown = False
    for e in exc.errors():
        loc = tuple(e.get("loc", ()))
        where = ".".join(str(p) for p in loc)
        kind = e.get("type", "")
        msg = str(e.get("ctx", {}).get("error", "")) if kind == "value_error" else ""
        msg = msg or str(e.get("msg", ""))
        for prefix in _PREFIXES:
            msg = msg.removeprefix(prefix)
        secret = _is_secret(model, loc)
        value = e.get("input")
        if secret and isinstance(value, (str, bytes)) and len(value) >= 4:
            msg = msg.replace(repr(value), _HIDDEN).replace(str(value), _HIDDEN)
        if kind == "missing":
            problems.append(f"{where}: required, not given")
            continue
        if not loc:  # a model validator: its message says what is wrong
            problems.append(msg)
            continue
        if kind == "extra_forbidden":
            # Never its value: a misspelt key (``pasword=``) is as secret as the right one.
            unknown = True
            problems.append(f"{where}: unknown option")
            continue
        if msg[:1].isupper() and msg[1:2].islower():
            msg = msg[0].lower() + msg[1:]
        shown = _HIDDEN if secret else _shown(value)
        if secret or shown not in msg:
            msg = f"{msg} (given: {shown})"
        problems.append(f"{where}: {msg}")
    if unknown:
        known = [info.alias or name for name, info in model.model_fields.items()]
        problems.append(f"the options are: {', '.join(known)}")
    return "; ".join(problems)
