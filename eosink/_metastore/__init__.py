"""The meta store (private): model, migrations and the state machine."""

from .engine import default_url, eosink_home, redact_url
from .models import ABORTED, COMMITTED, PENDING
from .records import (
    AUTO_ORIGINS,
    BATCH,
    BATCH_AUTO,
    BATCH_AUTO_UNREPORTED,
    BATCH_ORIGINS,
    DROPPED_OPEN_FILE,
    FORMAT_STREAM_OWNER,
    HEARTBEAT_SECONDS,
    HEARTBEAT_STALE_SECONDS,
    EpochRecord,
    LossRecord,
    SinkRecord,
    split_owner,
)
from .store import MetaStore

__all__ = [
    "ABORTED",
    "AUTO_ORIGINS",
    "BATCH",
    "BATCH_AUTO",
    "BATCH_AUTO_UNREPORTED",
    "BATCH_ORIGINS",
    "COMMITTED",
    "DROPPED_OPEN_FILE",
    "FORMAT_STREAM_OWNER",
    "HEARTBEAT_SECONDS",
    "HEARTBEAT_STALE_SECONDS",
    "PENDING",
    "EpochRecord",
    "LossRecord",
    "MetaStore",
    "SinkRecord",
    "default_url",
    "eosink_home",
    "redact_url",
    "split_owner",
]
