"""The optional parts of a coordinator (native path, rolling files, staged epochs, a marker
in the target, a journal home) and the :class:`Capabilities` record that declares them
(part of the plugin contract; public as ``eosink.SparkWriter``... and
``eosink.Capabilities``)."""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pyarrow as pa

from .errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

R = TypeVar("R")


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

    def drop_lost_open_files(self) -> list[dict[str, Any]]:
        """``eosink recover --drop-lost-open-files``: drop the open files whose committed rows
        can no longer be published (destroyed outside eosink), so that the sink goes on.
        Called only when no epoch is PENDING. Returns one record per dropped file:
        ``final`` (its name), ``start`` and ``end`` (its epochs), ``rows``, ``bytes`` and
        ``why``; the core records each as a known loss of epoch ``end``. Default: nothing
        is ever lost (returns [])."""
        return []


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


class Retirable(ABC):
    """Optional mixin for a coordinator that keeps records of its sink in the target besides
    its marker and its staged data: ``eosink retire`` asks it to delete them.

    ``eosink retire`` removes everything a decommissioned sink keeps outside its data. The
    core deletes its own records (meta-store rows, the batch journal beside the target),
    aborts staged data (rule 4), publishes open rolling files and replaces the marker with
    the retirement's. What only the sink knows, it deletes here: a SQL sink's rows in
    ``sql_epochs``, a Kafka sink's markers in its control topic.

    Contract:
        * Called on the driver after ``init``, once the sink is stopped, no epoch is PENDING
            and the meta store records the retirement; the retirement marker is written
            before (:class:`TargetMarker`), so the target still knows the retired sink's
            highest epoch once these records are gone.
        * Never deletes committed data (rows, files, snapshots, messages).
        * Idempotent: a retirement cut short is run again.
    """

    @abstractmethod
    def retire_records(self, dry_run: bool) -> list[str]:
        """Delete this sink's own records (``dry_run``: only find them); return one line per
        kind of record, what and how many (``"3 rows of sql_epochs"``); [] when none."""


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
        retirable: :class:`Retirable`: ``eosink retire`` deletes records only the sink
            knows.
        epoch_spec: the coordinator's ``commit`` and ``abort`` take a keyword argument
            ``spec``: the :class:`~eosink.EpochSpec` the epoch was staged with (its schema
            and options, without secrets), or None for an epoch persisted without one (by an
            eosink of schema revision 0005 or older) and in ``abort(epoch, None)`` (nothing
            was persisted). A sink that must apply
            a PENDING epoch the way it was staged, whatever options its recovery run is
            given, reads them there instead of copying its options into each committable.
    """

    target_marker: bool = False
    staged_epochs: bool = False
    journal_home: bool = False
    spark_writer: bool = False
    rolling: bool = False
    retirable: bool = False
    epoch_spec: bool = False

    @staticmethod
    def implemented_by(coordinator: object) -> Capabilities:
        """The capabilities ``coordinator``'s classes implement (the record of a plugin that
        declares none, which eosink reads this way for one more minor release); ``epoch_spec``
        when its ``commit`` and ``abort`` both take a parameter named ``spec``."""
        found = {f: isinstance(coordinator, c) for f, c in _MIXINS.items()}
        methods = (getattr(coordinator, m, None) for m in ("commit", "abort"))
        spec = all(m is not None and _takes_spec(m, named=True) for m in methods)
        return Capabilities(**found, epoch_spec=spec)

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
        if self.epoch_spec:
            for method in ("commit", "abort"):
                if not _takes_spec(getattr(coordinator, method)):
                    raise ConfigError(
                        f"sink plugin {plugin!r} declares capabilities epoch_spec=True, but "
                        f"its coordinator's {method} ({type(coordinator).__name__}) takes no "
                        f"keyword argument spec: define {method}(self, epoch, committable, "
                        "spec=None), or declare epoch_spec=False"
                    )


def _takes_spec(method: Any, named: bool = False) -> bool:
    """Whether ``method`` takes a keyword argument ``spec`` (``named``: by that name, not
    only through ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    if "spec" in params:
        return params["spec"].kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
    return not named and any(p.kind is p.VAR_KEYWORD for p in params.values())


_MIXINS: dict[str, type] = {
    "target_marker": TargetMarker,
    "staged_epochs": StagedEpochs,
    "journal_home": JournalHome,
    "spark_writer": SparkWriter,
    "rolling": Rolling,
    "retirable": Retirable,
}


_undeclared_told: set[str] = set()


class _Declaring(Protocol):
    """What :func:`capabilities_of` reads of a :class:`~eosink.sink.SinkPlugin` (typed so, not
    by the class, so that this module does not import ``eosink.sink``, which imports it)."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities | None: ...


def capabilities_of(plugin: _Declaring, coordinator: object) -> Capabilities:
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
