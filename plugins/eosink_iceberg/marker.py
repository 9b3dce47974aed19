"""The iceberg sink's records in the table's properties: its marker and its committed epochs.

* The marker (:class:`eosink.TargetMarker`) is the table property ``eosink.<sink key>.marker``;
  a marker written before the table exists is stored with the table's first commit.
* The committed epochs are ranges (``"0-11,14,20-25"``) in ``eosink.<sink key>.epochs``, at
  most :data:`_MAX_RANGES` of them (for older epochs the snapshot ancestry is the record).
"""

from __future__ import annotations

import logging
from typing import Any

from eosink import SinkError
from eosink.util import marker_from_property, marker_property

from . import _compat
from .state import CoordinatorState

__all__ = ["MarkerProperty", "add_to_ranges", "in_ranges", "parse_ranges"]

log = logging.getLogger("eosink.iceberg")


# -- committed epochs as ranges: "0-11,14,20-25" ----------------------------------------
_MAX_RANGES = 1000


def parse_ranges(text: str | None) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def in_ranges(ranges: list[tuple[int, int]], epoch: int) -> bool:
    return any(lo <= epoch <= hi for lo, hi in ranges)


def add_to_ranges(ranges: list[tuple[int, int]], epoch: int) -> str:
    """The ranges with ``epoch`` added, merged; the oldest ranges beyond the cap are dropped
    (for those, the snapshot ancestry is the only record)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted([*ranges, (epoch, epoch)]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    merged = merged[-_MAX_RANGES:]
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged)


class MarkerProperty(CoordinatorState):
    """The sink's marker (:class:`eosink.TargetMarker`): the table property
    ``eosink.<sink key>.marker``, with the newest committed epoch ``eosink.epoch.<sink
    key>`` as its ``last_epoch``."""

    def read_marker(self) -> dict[str, Any] | None:
        table = self._table()
        if table is None:
            return None
        raw = table.properties.get(self.marker_prop)
        last = table.properties.get(self.prop)
        if raw is None and last is None:
            return None
        return marker_from_property(
            raw,
            int(last) if last is not None else -1,
            f"Iceberg table {self.opts.table!r}: table property {self.marker_prop!r}",
        )

    def write_marker(self, marker: dict[str, Any]) -> None:
        raw = marker_property(marker)
        table = self._table()
        if table is None:
            self._pending_marker = raw
            log.info(
                "iceberg: table %s does not exist yet; the marker of %s is stored when it is "
                "created",
                self.opts.table,
                self.sink_id,
            )
            return
        self._store_marker(table, raw)

    def _store_marker(self, table: Any, raw: str) -> None:
        """Set the marker property in one metadata commit (retried on a concurrent commit)."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(10):
            if table.properties.get(self.marker_prop) == raw:
                break
            try:
                with _compat.transaction(table) as tx:
                    tx.set_properties({self.marker_prop: raw})
                break
            except CommitFailedException:
                if attempt == 9:
                    raise SinkError(
                        f"Iceberg table {self.opts.table!r}: cannot store the eosink marker "
                        "(every attempt conflicted with another commit)"
                    ) from None
                table = self._table()
                if table is None:
                    raise SinkError(f"Iceberg table {self.opts.table!r} disappeared") from None
        self._pending_marker = None

    def _last_epoch(self, table: Any) -> int:
        return int(table.properties.get(self.prop, "-1"))

    def _committed(self, table: Any, epoch: int) -> bool:
        """Whether exactly ``epoch`` of this sink is committed in ``table``.

        Epochs may be committed out of order (a backfill of an older epoch), so the newest
        committed epoch alone only answers for itself and for newer epochs.
        """
        last = self._last_epoch(table)
        if epoch == last:
            return True
        if epoch > last:
            return False
        if in_ranges(parse_ranges(table.properties.get(self.epochs_prop)), epoch):
            return True
        for snap in _compat.snapshot_ancestors(table):
            extra = snap.summary.additional_properties if snap.summary else {}
            if extra.get("eosink.sink-id") == self.sink_id and extra.get("eosink.epoch") == str(
                epoch
            ):
                return True
        return False

    def _epoch_props(self, table: Any, epoch: int) -> dict[str, str]:
        """The table properties an epoch's commit sets (newest epoch, committed ranges, a
        marker waiting for the table)."""
        props = {
            self.prop: str(max(self._last_epoch(table), epoch)),
            self.epochs_prop: add_to_ranges(
                parse_ranges(table.properties.get(self.epochs_prop)), epoch
            ),
        }
        if self._pending_marker is not None:
            props[self.marker_prop] = self._pending_marker
        return props
