"""The iceberg sink's data files: what it wrote, what the table references, what to delete.

* After a commit, data files of the epoch that no committable names (a dead executor's, a
  failed task attempt's) are deleted; an upsert epoch's staged changes too.
* ``abort`` deletes the epoch's data files; a file referenced by the table is never deleted.
* After a snapshot expiry (``expire_snapshots_keep``), an upsert sink's files that only
  expired snapshots referenced are deleted.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Iterable
from typing import Any

from eosink import SinkError, fault_point
from eosink.util import abandon_hint

from . import _compat
from .datafiles import epoch_of_file, native_write_dir, norm, sink_key
from .state import CoordinatorState

__all__ = ["EpochFiles"]

log = logging.getLogger("eosink.iceberg")


def _manifest_files(table: Any, snapshots: Iterable[Any], discard_deleted: bool) -> dict[str, str]:
    """The data files the manifests of ``snapshots`` list (each manifest read once), by
    path without scheme (a listing's spelling) -> path as the manifest spells it;
    ``discard_deleted``: without the entries a snapshot marks DELETED."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for snap in snapshots:
        for manifest in snap.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=discard_deleted):
                path = entry.data_file.file_path
                out.setdefault(norm(path), path)
    return out


class EpochFiles(CoordinatorState):
    """The sink's data files in the table's data location: listed, swept after a commit,
    deleted on abort (never one the table references), and after a snapshot expiry."""

    def _epoch_dirs(self, table: Any, epoch: int) -> list[str]:
        """The epoch's own directories under the table's data location (native writes,
        staged changes, an upsert commit's files), spelt as locations."""
        from pyarrow import fs as pafs

        data = table.location().rstrip("/") + "/data"
        filesystem, root, _ = _compat.location_filesystem(self.opts.catalog_properties(), data)
        prefix = f"eosink-{sink_key(self.sink_id):08x}-e{epoch}-"
        top = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        return [
            f"{data}/{d.base_name}"
            for d in top
            if d.type == pafs.FileType.Directory and d.base_name.startswith(prefix)
        ]

    def _sweep_changes(self, table: Any, epoch: int, keep: set[str] | None) -> None:
        """After an upsert epoch is committed: delete its staged changes and every file of
        its directories that is not one of the data files just committed (``keep``; None:
        a replayed commit, where the table's references decide). Never raises."""
        try:
            files = [p for p, e in self._data_files(table, self._epoch_dirs(table, epoch))]
            if keep is None:
                self._delete_unreferenced(table, files)
            else:
                self._delete_unreferenced(
                    None, [p for p in files if norm(p) not in keep], refs=set()
                )
            self._remove_native_dirs(table, epoch)
        except Exception:
            log.warning(
                "iceberg: could not delete the staged changes of epoch %d; retried at the "
                "next start",
                epoch,
                exc_info=True,
            )

    def _expire(self, keep: int) -> None:
        table = self._table()
        snaps = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
        if len(snaps) <= keep:
            return
        cutoff = snaps[-keep].timestamp_ms
        try:
            table.maintenance.expire_snapshots().older_than(
                _dt.datetime.fromtimestamp(cutoff / 1000, tz=_dt.timezone.utc)
            ).commit()
        except Exception:
            log.warning(
                "iceberg: snapshot expiry failed; retried after the next commit", exc_info=True
            )
            return
        if self.opts.mode == "upsert":
            self._delete_expired_files(snaps, table)

    def _delete_expired_files(self, before: list[Any], table: Any) -> None:
        """After an expiry: delete this sink's data files that only expired snapshots
        referenced (an upsert epoch's commit replaces files; pyiceberg's expiry deletes no
        file). Other writers' files are left alone. Never raises."""
        try:
            table = self._table()
            live = {s.snapshot_id for s in table.snapshots()}
            expired = [s for s in before if s.snapshot_id not in live]
            if not expired:
                return
            gone = [
                path
                for path in _manifest_files(table, expired, discard_deleted=False).values()
                if epoch_of_file(path, self.sink_id) is not None
            ]
            if gone:
                # What the live snapshots read (a DELETED entry of a manifest is no reference).
                refs = set(_manifest_files(table, table.snapshots(), discard_deleted=True))
                n = self._delete_unreferenced(None, gone, refs=refs)
                self._remove_empty_dirs({d for d in map(native_write_dir, gone) if d})
                if n:
                    log.info(
                        "iceberg: deleted %d data file(s) of %s that only expired snapshots "
                        "referenced",
                        n,
                        self.sink_id,
                    )
        except Exception:
            log.warning("iceberg: could not delete the files of expired snapshots", exc_info=True)

    def _io(self) -> Any:
        from pyiceberg.io import load_file_io

        return load_file_io(self.opts.catalog_properties())

    def _referenced(self, table: Any) -> set[str]:
        """Every data file path (without scheme) that any snapshot of ``table`` references."""
        return set(_manifest_files(table, table.snapshots(), discard_deleted=False))

    def _delete_unreferenced(
        self,
        table: Any | None,
        paths: Iterable[str],
        refs: set[str] | None = None,
        fault: str | None = None,
    ) -> int:
        """Delete ``paths`` except those ``table`` references (``refs``: already computed);
        return how many were deleted. A path spelt twice (with and without its scheme: a
        committable's and a listing's) is deleted once; one already gone is no error."""
        by_norm: dict[str, str] = {}
        for p in sorted(set(paths), reverse=True):  # "file:///x" before "/x": the scheme wins
            by_norm.setdefault(norm(p), p)
        if not by_norm:
            return 0
        if refs is None and table is not None:
            refs = self._referenced(table)
        todo = [p for n, p in sorted(by_norm.items()) if not refs or n not in refs]
        io = self._io()
        for i, p in enumerate(todo):
            try:
                io.delete(p)
            except FileNotFoundError:
                pass
            if i == 0 and fault:
                fault_point(fault)
        return len(todo)

    def _sweep_epoch(self, table: Any, epoch: int, committable: dict[str, Any]) -> None:
        """After ``epoch`` is committed: delete its data files that the committable does not
        name (a dead executor's, a failed or speculative task attempt's). Never raises.

        ``table`` is current: loaded just before, or updated in place by the commit. An
        epoch that Spark's writer staged lists only its own write directories (Spark's
        committer already removed its failed attempts' files), so the cost does not grow
        with the table; another write directory of the epoch (a crashed driver's attempt)
        is left to the next start's :meth:`staged_epochs`. Python writers' files sit in the
        table's partition directories: those epochs list the table's data location.
        """
        try:
            files = [f["file_path"] for f in committable.get("files", [])]
            keep = {norm(p) for p in files}
            dirs = {native_write_dir(p) for p in files}
            roots = None if None in dirs or not dirs else sorted(d for d in dirs if d)
            extra = [
                p for p, e in self._data_files(table, roots) if e == epoch and norm(p) not in keep
            ]
            if extra:
                n = self._delete_unreferenced(table, extra)
                if n:
                    log.info(
                        "iceberg: deleted %d orphaned data file(s) of committed epoch %d of %s",
                        n,
                        epoch,
                        self.sink_id,
                    )
        except Exception:
            log.warning(
                "iceberg: could not sweep orphaned data files of epoch %d; retried at the "
                "next start",
                epoch,
                exc_info=True,
            )

    def _remove_native_dirs(self, table: Any, epoch: int) -> None:
        """Delete the directories of the epoch's native writes that hold no file any more
        (Spark leaves empty partition directories behind)."""
        self._remove_empty_dirs(self._epoch_dirs(table, epoch))

    def _remove_empty_dirs(self, locations: Iterable[str]) -> None:
        """Delete each of this sink's epoch directories ``locations`` that holds no file
        (empty subdirectories, e.g. Spark's partition directories, go with it)."""
        from pyarrow import fs as pafs

        for location in sorted(locations):
            filesystem, path, _ = _compat.location_filesystem(
                self.opts.catalog_properties(), location
            )
            try:
                inside = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
            except FileNotFoundError:
                continue
            if not any(i.type == pafs.FileType.File for i in inside):
                filesystem.delete_dir(path)

    def _data_files(
        self, table: Any | None = None, roots: list[str] | None = None
    ) -> list[tuple[str, int]]:
        """(path, epoch) of every data file this sink wrote under the table's data location
        (``roots``: only below these locations)."""
        table = table if table is not None else self._table()
        if table is None:
            return []
        from pyarrow import fs as pafs

        out = []
        for loc in roots if roots is not None else [table.location().rstrip("/") + "/data"]:
            try:
                # pyiceberg's own filesystem for the location: endpoint and credentials applied.
                filesystem, root, scheme_name = _compat.location_filesystem(
                    self.opts.catalog_properties(), loc
                )
                infos = filesystem.get_file_info(
                    pafs.FileSelector(root, recursive=True, allow_not_found=True)
                )
            except Exception:
                log.warning("iceberg: cannot list %s", loc, exc_info=True)
                continue
            scheme = "" if scheme_name == "file" else f"{scheme_name}://"
            for info in infos:
                if info.type == pafs.FileType.File:
                    e = epoch_of_file(info.path, self.sink_id)
                    if e is not None:
                        out.append((f"{scheme}{info.path}" if scheme else info.path, e))
        return out

    def _check_present(self, table: Any, epoch: int, paths: list[str], kind: str) -> None:
        """Refuse to commit an epoch whose files are gone: deleted while it was PENDING (an
        orphan-file cleanup such as Iceberg's ``remove_orphan_files``, which takes files no
        snapshot references for garbage, or a storage lifecycle rule). Committing would
        make the table reference missing files (readers fail); its rows are lost either way.

        Raises:
            SinkError: (permanent) naming the missing files and ``eosink abandon``.
        """
        if not paths:
            return
        from concurrent.futures import ThreadPoolExecutor

        def gone(path: str) -> bool:
            try:
                return not table.io.new_input(path).exists()
            except FileNotFoundError:
                return True

        with ThreadPoolExecutor(min(8, len(paths))) as pool:
            missing = [p for p, g in zip(paths, pool.map(gone, paths), strict=True) if g]
        if not missing:
            return
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        shown = ", ".join(missing[:3]) + more
        raise SinkError(
            f"iceberg sink {self.sink_id}: epoch {epoch} cannot be committed: {len(missing)} of "
            f"its {len(paths)} {kind} files are gone ({shown}). They were deleted while the epoch "
            "was PENDING, by an orphan-file cleanup (remove_orphan_files takes files no "
            "snapshot references yet) or a storage lifecycle rule; committing them would "
            "leave the table referencing missing files. " + abandon_hint(self.sink_id, epoch)
        )
