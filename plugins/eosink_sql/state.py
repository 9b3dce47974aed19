"""The attributes the sql coordinator's parts share (one class, no logic)."""

from __future__ import annotations

from typing import Any

from .db import Db
from .options import SqlSinkOptions

__all__ = ["CoordinatorState"]


class CoordinatorState:
    """What the parts of :class:`~eosink_sql.coordinator.SqlCoordinator` share: its
    attributes, set by its ``__init__``."""

    opts: SqlSinkOptions
    sink_id: str
    key: str  # the sink's eosink.util.sink_key
    db: Db
    # The target's columns the DataFrame writes (fixed by writer_setup, or read back from a
    # staging table by phase 1 in another process).
    _data_columns: list[str]
    _held: dict[int, tuple[Any, Any]]  # epoch -> (connection, transaction) held since phase 1
