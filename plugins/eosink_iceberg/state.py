"""The attributes the iceberg coordinator's parts share (one class, no logic)."""

from __future__ import annotations

from typing import Any

from .options import IcebergSinkOptions

__all__ = ["CoordinatorState"]


class CoordinatorState:
    """What the parts of :class:`~eosink_iceberg.coordinator.IcebergCoordinator` share: its
    attributes (set by its ``__init__``) and the table it loads."""

    opts: IcebergSinkOptions
    sink_id: str
    prop: str  # the newest committed epoch (last_epoch)
    epochs_prop: str  # every committed epoch, as ranges
    marker_prop: str
    catalog: Any
    commits: int  # commits this coordinator made
    # A marker written before the table exists (stored with the table's first commit).
    _pending_marker: str | None
    # The table metadata the last writer_setup gave the writers (after evolution).
    _metadata: Any

    def _table(self) -> Any:
        """The table, or None when it does not exist."""
        raise NotImplementedError
