"""The file sink's records in the target: the layout record (``_eosink/layout.json``, what
every sink writing the path agrees on) and the sink's marker (``_eosink/<sink key>.json``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eosink import (
    SinkError,
)

from .layout import (
    COMMITS_DIR,
    LAYOUT_KEYS,
    LAYOUT_REL,
    MARKER_DIR,
    check_layout,
    layout_of,
)
from .state import CoordinatorState

__all__ = ["TargetRecords"]

log = logging.getLogger("eosink.file")


class TargetRecords(CoordinatorState):
    """The coordinator's part that reads and writes the layout record and the marker."""

    def _layout_where(self) -> str:
        if self.s3 is not None:
            return self.s3.url(LAYOUT_REL)
        if self.hadoop is not None:
            return self.hadoop.url(LAYOUT_REL)
        return str(self.root / LAYOUT_REL)

    def _init_layout(self) -> None:
        """Check this run's layout against the target's record (:func:`check_layout`).

        Without a record, a target that already holds committed epochs (written before
        eosink recorded layouts) adopts this run's layout now, once; an empty one records
        it with its first commit, so that a run that fails before committing anything does
        not fix a layout.
        """
        where = self._layout_where()
        try:
            raw = self._read_json(LAYOUT_REL)
        except ValueError as exc:
            raise SinkError(f"the file sink's layout record {where} is corrupt ({exc})") from None
        if raw is not None:
            check_layout(self.opts, raw, where)
            self._layout = {k: raw.get(k) for k in LAYOUT_KEYS}
            return
        self._layout = None
        if self._holds_commits():
            log.info(
                "file sink: the target %s has no layout record (written before eosink "
                "recorded one); adopting this run's format=%r, partition_by=%r in %s",
                self.opts.path,
                self.opts.format,
                list(self.opts.partition_by),
                where,
            )
            self._record_layout()

    def _holds_commits(self) -> bool:
        """Whether any sink committed an epoch to this target (a manifest exists)."""
        base = f"{MARKER_DIR}/{COMMITS_DIR}"
        if self.s3 is not None:
            return next(iter(self.s3.objects(base + "/")), None) is not None
        if self.hadoop is not None:
            return any(self.hadoop.names(f"{base}/{key}") for key in self.hadoop.names(base))
        return any(p.is_file() for p in (self.root / base).rglob("*.json"))

    def _record_layout(self, layout: Mapping[str, Any] | None = None) -> None:
        """Write the layout record (``layout``, default: this run's), unless the target has
        one already (then that one holds: :meth:`pre_commit` checks this run against it)."""
        have = self._read_json(LAYOUT_REL)
        if have is None:
            have = {k: (layout or layout_of(self.opts))[k] for k in LAYOUT_KEYS}
            self._write_json(LAYOUT_REL, {**have, "version": 1})
        self._layout = {k: have.get(k) for k in LAYOUT_KEYS}

    def read_marker(self) -> dict[str, Any] | None:
        try:
            data = self._read_json(self.marker_rel)
        except ValueError as exc:
            raise SinkError(
                f"the eosink marker {self.marker_rel} under {self.opts.path} is corrupt "
                f"({exc}); it records which epochs this directory holds. Restore it, or move "
                "the directory aside"
            ) from None
        if data is None:
            return None
        self._marker = data
        return dict(data)

    def _store_marker(self, marker: dict[str, Any]) -> None:
        self._write_json(self.marker_rel, marker)
        self._marker = marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        last = self._last_epoch()
        self._store_marker({**marker, "last_epoch": last})

    def _last_epoch(self) -> int:
        if self._marker is None:
            self.read_marker()
        return int((self._marker or {}).get("last_epoch", -1))
