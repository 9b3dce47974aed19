"""The one error hierarchy of eosink.

Every error eosink raises derives from :class:`EosinkError`. Each class says whether retrying
the same operation can succeed (:attr:`EosinkError.transient`). Errors are picklable so they
can cross from Spark executors to the driver.

"commit failed" (:class:`CommitFailedError`: nothing became visible) is distinct from
"commit state unknown" (:class:`CommitStateUnknownError`: the target may or may not hold the
epoch; the coordinator resolves it through the plugin's idempotent ``commit``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CommitFailedError",
    "CommitStateUnknownError",
    "ConfigError",
    "EosinkError",
    "FencedError",
    "InvalidTransitionError",
    "MetaStoreError",
    "MetaStoreUnavailableError",
    "MissingExtraError",
    "NewCheckpointError",
    "SchemaMismatchError",
    "SchemaOutdatedError",
    "SinkError",
    "SinkIdentityError",
    "UnfinishedRunError",
    "UnknownSinkError",
]


class EosinkError(Exception):
    """Root of every error raised by eosink.

    Attributes:
        transient: True when retrying the same operation later may succeed.
    """

    transient: bool = False

    def __str__(self) -> str:
        """The message, ending with where docs/errors.md says what to do about it (the entry
        of the nearest class of ``eosink.errors``: a plugin's own subclass points to its
        base's)."""
        text = super().__str__()
        ref = f"see docs/errors.md#{errors_md_entry(type(self))}"
        return text if ref in text else f"{text} ({ref})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable even when subclasses take keyword-only arguments.
        return (_rebuild, (type(self), self.args, self.__dict__.copy()))


def errors_md_entry(cls: type[EosinkError]) -> str:
    """The anchor of docs/errors.md's entry for ``cls``: its nearest class of this module."""
    for base in cls.__mro__:
        if base.__module__ == __name__:
            return base.__name__.lower()
    return "eosinkerror"


def _rebuild(cls: type[EosinkError], args: tuple[Any, ...], state: dict[str, Any]) -> EosinkError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ConfigError(EosinkError, ValueError):
    """Invalid options or arguments; raised before any Spark job starts."""


class UnknownSinkError(ConfigError):
    """No installed plugin provides the requested sink name."""

    def __init__(self, name: str, known: list[str], broken: list[str] | None = None) -> None:
        listed = ", ".join(sorted(known)) or "(none)"
        failed = (
            " Installed plugins that failed to load (the sink may be one of theirs): "
            + "; ".join(broken)
            + "."
            if broken
            else ""
        )
        super().__init__(
            f"unknown sink {name!r}; installed sinks: {listed}. "
            f"Run `eosink plugins` to see them with their packages.{failed}"
        )
        self.name = name
        self.known = sorted(known)


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency is missing; the message names the pip install that adds it.

    A :class:`ConfigError` (the environment lacks what the requested sink or meta store needs,
    found before any Spark job starts) and an ``ImportError``.

    Args:
        module: the Python module that cannot be imported (``pyiceberg``).
        extra: the eosink extra that installs it (``iceberg``: ``pip install 'eosink[iceberg]'``).
        what: what needs it (``the iceberg sink``).
        install: what to ``pip install`` instead of ``eosink[<extra>]``, e.g. the extra of a
            third-party plugin's package (``my-sink[s3]``).

    Attributes:
        install: the argument of ``pip install`` that fixes it (``eosink[iceberg]``).
        pip: the whole command, ``pip install 'eosink[iceberg]'``.
    """

    def __init__(self, module: str, extra: str, what: str = "", *, install: str = "") -> None:
        purpose = f" (needed for {what})" if what else ""
        install = install or f"eosink[{extra}]"
        pip = f"pip install '{install}'"
        super().__init__(
            f"Python module {module!r} is not installed{purpose}. Install it with: {pip}"
        )
        self.name = module
        self.extra = extra
        self.install = install
        self.pip = pip


class SchemaMismatchError(ConfigError):
    """The DataFrame's schema cannot be written by the sink (names the column)."""


class NewCheckpointError(ConfigError):
    """A streaming query started from a fresh checkpoint for a sink that already has history."""


class SinkIdentityError(ConfigError):
    """The sink_id, its target and the meta store disagree about which sink this is.

    Raised at start, before anything is written: a sink_id reused for another target, a meta
    store that is behind the target's marker, an explicit batch epoch that would collide
    with another run's epochs. The message says what to do.
    """


class UnfinishedRunError(ConfigError):
    """A batch run without ``epoch=`` found an earlier such run that crashed with its data
    complete (PENDING).

    eosink commits the crashed run's epoch (its rows become visible) and writes nothing for
    this run, because it cannot tell whether this run repeats the crashed one (writing it
    would then duplicate every row) or brings new data (skipping it would lose them). The
    message names the epoch and its rows: if this run repeats it, nothing more is needed;
    else run it again. Passing ``epoch=`` makes re-runs safe without asking.
    """


class MetaStoreError(EosinkError):
    """The meta store rejected or failed an operation."""


class MetaStoreUnavailableError(MetaStoreError):
    """The meta store cannot be reached. Nothing was published."""

    transient = True


class SchemaOutdatedError(MetaStoreError):
    """State written by another version of eosink than this one: a meta store of an older
    schema revision (``eosink db upgrade``) or a newer one, or a PENDING epoch whose
    committable a newer eosink or sink plugin wrote (after a downgrade). Nothing was changed."""


class InvalidTransitionError(MetaStoreError):
    """A state change that the two-phase state machine does not allow."""


class FencedError(MetaStoreError):
    """Another coordinator for the same sink_id took over; this one may change nothing."""


class SinkError(EosinkError):
    """An error raised by a sink plugin's phase method."""


class CommitFailedError(SinkError):
    """The commit did not happen: nothing of the epoch is visible in the target."""

    transient = True


class CommitStateUnknownError(SinkError):
    """The commit may or may not have happened (e.g. the target's answer was lost).

    The coordinator resolves it by calling the plugin's idempotent ``commit`` again.
    """

    transient = True
