"""The kafka sink's marker in its control topic: each slot's record ``<sink key>/<n>``
(committed in the chunk's own transaction) and the sink's own ``<sink key>/sink``; what
``eosink retire`` tombstones."""

from __future__ import annotations

from typing import Any

from .pool import SlotPool

__all__ = ["Markers"]


class Markers(SlotPool):
    """The coordinator's part that reads and writes the markers."""

    def _last_epoch(self) -> int:
        from .control import marker_top

        last = int((self.sink_marker or {}).get("last_epoch", -1))
        for slot in self.slots.values():
            last = max(last, marker_top(slot.marker))
        return last

    def read_marker(self) -> dict[str, Any] | None:
        last = self._last_epoch()
        if self.sink_marker is None and last < 0:
            return None
        out = dict(self.sink_marker or {})
        out["last_epoch"] = last
        return out

    def write_marker(self, marker: dict[str, Any]) -> None:
        value = {**marker, "last_epoch": self._last_epoch()}
        slot = self._slot(0)
        self._ready([0])
        slot.write_marker(f"{self.key}/sink", value)
        self.sink_marker = value

    def retire_records(self, dry_run: bool) -> list[str]:
        """``eosink retire``: tombstones for the markers of the sink's transactional ids in
        the control topic (the sink's own marker, the retirement's, stays)."""
        from .control import read_markers

        prefix = f"{self.key}/"
        numbers = sorted(
            int(k[len(prefix) :])
            for k in read_markers(self.opts, self.control_topic, prefix)
            if k[len(prefix) :].isdigit()
        )
        if not numbers:
            return []
        if not dry_run:
            self._ready(numbers)
            for n in numbers:
                self._slot(n).delete_marker()
        return [
            f"{len(numbers)} marker record(s) of transactional ids eosink-{self.key}-<n> in "
            f"control topic {self.control_topic} (tombstones)"
        ]
