"""The attributes the kafka coordinator's parts share (one class, no logic)."""

from __future__ import annotations

from typing import Any

from .options import KafkaSinkOptions
from .stage import Stage

__all__ = ["CoordinatorState"]


class CoordinatorState:
    """What the parts of :class:`~eosink_kafka.coordinator.KafkaCoordinator` share: its
    attributes, set by its ``__init__``."""

    opts: KafkaSinkOptions
    sink_id: str
    key: str  # the sink's sink_key
    stage: Stage  # this run's staging location
    control_topic: str
    admin: Any  # transactions.Admin
    slots: dict[int, Any]  # slot number -> transactions.Slot
    sink_marker: dict[str, Any] | None  # the <sink key>/sink record of the control topic
    cluster: str

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        """Delete the epoch's staged files (the coordinator's)."""
        raise NotImplementedError
