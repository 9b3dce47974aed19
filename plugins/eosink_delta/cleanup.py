"""Finding and deleting what the delta sink staged in the table's directory (``layout.py``
names it): an epoch's data directories and staged changes, never a committed epoch's data
files (they are the table's: ``VACUUM`` deletes them once no version it keeps needs them),
never a file another writer wrote."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from eosink import fault_point

from . import layout
from .options import DeltaSinkOptions, filesystem

__all__ = ["Staging"]

log = logging.getLogger("eosink.delta")


class Staging:
    """The sink's files in one table's directory."""

    def __init__(self, opts: DeltaSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        self._fs: Any = None
        self._root = ""

    def files(self) -> tuple[Any, str]:
        """The table's filesystem and its root in it (made once)."""
        if self._fs is None:
            self._fs, self._root = filesystem(self.opts)
        return self._fs, self._root

    def epoch_dirs(self, epoch: int) -> list[str]:
        """The data directories of ``epoch`` (one per write attempt)."""
        fs, root = self.files()
        base = layout.epoch_root(self.sink_id, epoch)
        return [f"{base}/{d}" for d in layout.top_dirs(fs, root, base)]

    def data_epochs(self) -> set[int]:
        """Every epoch that has a data directory."""
        fs, root = self.files()
        names = layout.top_dirs(fs, root, layout.data_root(self.sink_id))
        return {e for e in map(layout.epoch_of, names) if e is not None}

    def changes_dirs(self, epoch: int | None) -> list[str]:
        """The staged-changes directories of ``epoch`` (None: of every epoch)."""
        fs, root = self.files()
        base = layout.changes_root(self.sink_id)
        return [
            f"{base}/{d}"
            for d in layout.top_dirs(fs, root, base)
            if epoch is None or layout.changes_epoch_of(d) == epoch
        ]

    def changes_epochs(self) -> set[int]:
        return {
            e
            for d in self.changes_dirs(None)
            if (e := layout.changes_epoch_of(d.rsplit("/", 1)[-1])) is not None
        }

    def delete(self, dirs: Iterable[str], fault: str | None = None) -> None:
        """Delete ``dirs`` (relative to the table's root); with ``fault``, that fault point
        between the first and the second (crash tests stop there)."""
        fs, root = self.files()
        dirs = list(dirs)
        for i, d in enumerate(dirs):
            try:
                fs.delete_dir(f"{root}/{d}")
            except FileNotFoundError:
                pass
            if fault is not None and i == 0 and len(dirs) > 1:
                fault_point(fault)

    def sweep(self, epoch: int, committable: dict[str, Any]) -> None:
        """After the epoch's commit: delete its staged changes and the directories of its
        attempts that the commit did not take (dead and failed task attempts)."""
        keep = {layout.attempt_dir(f["path"]) for f in committable.get("files", [])}
        self.delete([d for d in self.epoch_dirs(epoch) if d not in keep])
        self.delete(self.changes_dirs(epoch))

    def committed_dirs(self, table: Any, epoch: int) -> set[str] | None:
        """The data directories the commit of ``epoch`` (in the table) named, read from that
        commit's log entry, found by its commit info from the newest version back; None when
        it is not found (the log cleaned up that far back)."""
        limit = 16
        while True:
            history = table.history(limit)
            for h in history:
                if h.get("eosink.sink_id") == self.sink_id and h.get("eosink.epoch") == str(epoch):
                    return self._dirs_of_version(int(h["version"]))
            if len(history) < limit or limit >= 4096:
                return None
            limit *= 4

    def _dirs_of_version(self, version: int) -> set[str]:
        fs, root = self.files()
        with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as fh:
            lines = fh.read().decode().splitlines()
        out = set()
        for line in lines:
            add = json.loads(line).get("add") if line.strip() else None
            if add:
                out.add(layout.attempt_dir(unquote(add["path"])))
        return out

    def abort(self, table: Any, epoch: int, committed: bool) -> None:
        """Delete what ``epoch`` staged; of a ``committed`` epoch (a replay of it, as
        ``format("eosink")`` discards one), only what its commit did not take."""
        dirs = self.epoch_dirs(epoch)
        if committed and dirs:
            keep = self.committed_dirs(table, epoch)
            if keep is None:
                log.warning(
                    "delta sink %s: epoch %d is in the table but its commit is no longer in the "
                    "log: its directories %s are kept (VACUUM removes what no version references)",
                    self.sink_id,
                    epoch,
                    dirs,
                )
            dirs = [d for d in dirs if keep is not None and d not in keep]
        self.delete([*dirs, *self.changes_dirs(epoch)], fault="mid_abort")
        if not committed:  # the epoch's own directory, now empty (a local table's)
            self.delete([layout.epoch_root(self.sink_id, epoch)])
