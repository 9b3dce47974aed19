"""The two-phase protocol on the driver: recovery, phase 1, phase 2 (the template method).

The plugin implements only phase methods; every state transition happens here, through the
fenced :class:`~eosink._metastore.MetaStore`.
"""

from __future__ import annotations

from .._spec import schema_bytes, schema_from_bytes
from .epoch import Epoch
from .figures import FIGURES_KEPT, EpochFigures
from .runtime import SinkRuntime
from .threads import AsyncCommitter, Heartbeat

__all__ = [
    "FIGURES_KEPT",
    "AsyncCommitter",
    "Epoch",
    "EpochFigures",
    "Heartbeat",
    "SinkRuntime",
    "schema_bytes",
    "schema_from_bytes",
]
