"""eosink: exactly-once sinks for PySpark pipelines.

import eosink
eosink.run(df, sink="file", path="/data/out", epoch=1)              # batch
h = eosink.run(sdf, sink="file", path="/data/out",
               checkpoint_location="/chk/out")                      # streaming
h.await_termination()
"""

from __future__ import annotations

from ._datasource import register as register_datasource
from ._protocol import EpochFigures
from ._spark import BatchResult, StreamingHandle, run, spark_session
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
    Codec,
    CoordinatedSinkWriter,
    JsonCodec,
    SinkCommitCoordinator,
    SinkPlugin,
    StagedEpochs,
    TargetMarker,
    WriterContext,
)

__version__ = "0.1.0"
"""The version of this eosink release."""

__all__ = [
    "BatchResult",
    "Codec",
    "CommitFailedError",
    "CommitStateUnknownError",
    "ConfigError",
    "CoordinatedSinkWriter",
    "EosinkError",
    "EpochFigures",
    "FencedError",
    "InvalidTransitionError",
    "JsonCodec",
    "MetaStoreError",
    "MetaStoreUnavailableError",
    "MissingExtraError",
    "NewCheckpointError",
    "SchemaMismatchError",
    "SchemaOutdatedError",
    "SinkCommitCoordinator",
    "SinkError",
    "SinkIdentityError",
    "SinkInfo",
    "SinkPlugin",
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
