"""eosink: exactly-once sinks for PySpark pipelines.

import eosink
eosink.run(df, sink="file", path="/data/out", epoch=1)              # batch
h = eosink.run(sdf, sink="file", path="/data/out",
               checkpoint_location="/chk/out")                      # streaming
h.await_termination()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    CommitFailedError,
    CommitStateUnknownError,
    ConfigError,
    EosinkError,
    FencedError,
    InvalidTransitionError,
    MetaStoreError,
    MetaStoreUnavailableError,
    MissingExtraError,
    NewCheckpointError,
    SchemaMismatchError,
    SchemaOutdatedError,
    SinkError,
    SinkIdentityError,
    UnfinishedRunError,
    UnknownSinkError,
)
from .faults import fault_point
from .hookspecs import hookimpl
from .registry import SinkInfo, get_sink, list_sinks
from .sink import (
    Capabilities,
    Codec,
    CommitOutcome,
    CoordinatedSinkWriter,
    EpochSpec,
    JournalHome,
    JsonCodec,
    Prepared,
    Retirable,
    Rolling,
    SinkCommitCoordinator,
    SinkPlugin,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    WriterContext,
)

if TYPE_CHECKING:
    from ._handles import BatchResult, StreamingHandle
    from ._protocol import EpochFigures
    from ._restart import RestartPolicy
    from ._run import run
    from ._session import register_datasource, spark_session

# The driver-side API is imported on first use: Spark's Python workers import eosink to
# unpickle a writer, and need neither pyspark's data source API nor the meta store
# (SQLAlchemy, Alembic), about a second of imports per worker.
_LAZY = {
    "register_datasource": ("._session", "register_datasource"),
    "EpochFigures": ("._protocol", "EpochFigures"),
    "BatchResult": ("._handles", "BatchResult"),
    "StreamingHandle": ("._handles", "StreamingHandle"),
    "run": ("._run", "run"),
    "RestartPolicy": ("._restart", "RestartPolicy"),
    "spark_session": ("._session", "spark_session"),
}


def __getattr__(name: str) -> Any:
    """The driver-side names of the API, imported when first used."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'eosink' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


__version__ = "0.1.0"
"""The version of this eosink release."""

__all__ = [
    "BatchResult",
    "Capabilities",
    "Codec",
    "CommitFailedError",
    "CommitOutcome",
    "CommitStateUnknownError",
    "ConfigError",
    "CoordinatedSinkWriter",
    "EosinkError",
    "EpochFigures",
    "EpochSpec",
    "FencedError",
    "InvalidTransitionError",
    "JournalHome",
    "JsonCodec",
    "MetaStoreError",
    "MetaStoreUnavailableError",
    "MissingExtraError",
    "NewCheckpointError",
    "Prepared",
    "RestartPolicy",
    "Retirable",
    "Rolling",
    "SchemaMismatchError",
    "SchemaOutdatedError",
    "SinkCommitCoordinator",
    "SinkError",
    "SinkIdentityError",
    "SinkInfo",
    "SinkPlugin",
    "SparkWriter",
    "StagedEpochs",
    "StreamingHandle",
    "TargetMarker",
    "UnfinishedRunError",
    "UnknownSinkError",
    "WriterContext",
    "__version__",
    "fault_point",
    "get_sink",
    "hookimpl",
    "list_sinks",
    "register_datasource",
    "run",
    "spark_session",
]
