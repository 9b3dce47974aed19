"""The meta store (private): model, migrations and the state machine."""

from .models import ABORTED, COMMITTED, PENDING
from .store import (
    AUTO_ORIGINS,
    BATCH,
    BATCH_AUTO,
    BATCH_AUTO_UNREPORTED,
    BATCH_ORIGINS,
    DROPPED_OPEN_FILE,
    HEARTBEAT_SECONDS,
    HEARTBEAT_STALE_SECONDS,
    EpochRecord,
    LossRecord,
    MetaStore,
    SinkRecord,
    default_url,
    eosink_home,
    redact_url,
)

__all__ = [
    "ABORTED",
    "AUTO_ORIGINS",
    "BATCH",
    "BATCH_AUTO",
    "BATCH_AUTO_UNREPORTED",
    "BATCH_ORIGINS",
    "COMMITTED",
    "DROPPED_OPEN_FILE",
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
]
