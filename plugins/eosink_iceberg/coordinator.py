"""The iceberg sink's coordinator (on the driver): its phases, made of the sink's parts.

* ``checks.py``: what is checked before anything is written (``validate_schema``);
* ``setup.py``: the table before the writers (loaded or created, checked, evolved) and the
  native path;
* ``marker.py``: the sink's marker and committed epochs in the table's properties;
* ``files.py``: the sink's data files, swept after a commit, deleted on abort.

What its phases do:

* ``commit`` appends the epoch's files in one snapshot whose summary carries
  ``eosink.sink-id`` and ``eosink.epoch``. In the same metadata commit it raises the table
  property ``eosink.epoch.<sink key>`` to the newest committed epoch (never lowers it) and
  adds the epoch to ``eosink.<sink key>.epochs`` (committed epochs as ranges). An epoch is
  already committed when it equals the newest, is in the ranges, or a snapshot in the
  ancestry of the current one carries the sink and exactly this epoch. Epochs may be
  committed out of order (a backfill of an older epoch). After the commit, data files of the
  epoch that no committable names (a dead executor, a failed task attempt) are deleted.
* ``mode="upsert"`` (``cdc.py``): the writers stage the epoch's change rows as Parquet
  files; ``pre_commit`` checks them; ``commit`` rewrites the data files holding the epoch's
  keys and adds the upserted rows in one snapshot with the same marker (copy-on-write).
* ``abort`` deletes the epoch's data files (``files.py``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import eosink
from eosink import (
    CommitFailedError,
    CommitOutcome,
    CommitStateUnknownError,
    ConfigError,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import abandon_hint

from . import _compat, cdc
from .datafiles import data_file_from_json, norm, sink_key
from .files import EpochFiles
from .marker import add_to_ranges, in_ranges, parse_ranges
from .options import IcebergSinkOptions, load_catalog, redact, require_pyiceberg
from .setup import TableSetup

__all__ = ["IcebergCoordinator", "make_coordinator"]

log = logging.getLogger("eosink.iceberg")

# A commit that conflicts with another writer's is redone on the new snapshot this often.
_CONFLICT_ATTEMPTS = 20


class IcebergCoordinator(
    TableSetup,
    EpochFiles,
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    SparkWriter[dict[str, Any]],
):
    """The coordinator of one sink_id (see the module's docstring)."""

    def __init__(self, opts: IcebergSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        key = f"{sink_key(sink_id):08x}"
        self.prop = f"eosink.epoch.{key}"  # the newest committed epoch (last_epoch)
        self.epochs_prop = f"eosink.{key}.epochs"  # every committed epoch, as ranges
        self.marker_prop = f"eosink.{key}.marker"
        self.catalog: Any = None
        self.commits = 0
        # A marker written before the table exists: stored when the table is created (same
        # metadata commit) or, if another process creates it, at the next writer_setup/commit.
        self._pending_marker: str | None = None
        # The table metadata the last writer_setup gave the writers (after evolution): what
        # spark_write_unsupported judges.
        self._metadata: Any = None

    def init(self) -> None:
        self.catalog = load_catalog(self.opts)

    def target_id(self) -> str | None:
        # Stable before and after the table exists (it may be created by writer_setup,
        # after the core bound the sink to this id), hence no table uuid; the catalog's
        # location (credentials removed) tells two catalogs of the same name apart.
        props = self.opts.catalog_properties()
        where = re.sub(r"//[^/@]*@", "//", props.get("uri") or props.get("warehouse") or "")
        name = f"iceberg:{self.opts.catalog_name}.{self.opts.table}"
        return f"{name} in {where}" if where else name

    def _table(self) -> Any:
        if self.catalog is None:
            self.init()
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.opts.table)
        except NoSuchTableError:
            return None
        except Exception as exc:
            raise SinkError(
                redact(f"cannot load Iceberg table {self.opts.table!r}: {exc}", self.opts)
            ) from None

    # -- phases --------------------------------------------------------------------------
    def pre_commit(
        self, epoch: int, results: Sequence[dict[str, Any]]
    ) -> eosink.Prepared[dict[str, Any]]:
        evolve = next((r["evolve"] for r in results if r.get("evolve")), None)
        if self.opts.mode == "upsert":
            return self._pre_commit_changes(epoch, results, evolve)
        files = [f for r in results for f in r["files"]]
        return eosink.Prepared(
            {"files": files, "table": self.opts.table, "evolve": evolve},
            files=len(files),
            bytes=sum(int(f["file_size_in_bytes"]) for f in files),
        )

    def _pre_commit_changes(
        self, epoch: int, results: Sequence[dict[str, Any]], evolve: Any
    ) -> eosink.Prepared[dict[str, Any]]:
        """Phase 1 of an upsert epoch: the checks of :func:`cdc.check_changes`, and no
        newer epoch of the sink committed (its changes would be overwritten by older ones)."""
        changes = [c for r in results for c in r.get("changes", [])]
        table = self._table()
        if table is not None:
            last = self._last_epoch(table)
            if epoch < last:
                raise ConfigError(
                    f"iceberg sink {self.sink_id}: epoch {epoch} holds upserts, but epoch "
                    f"{last} is already committed to {self.opts.table!r}: applying older "
                    "changes after newer ones would overwrite them. Upsert epochs commit in "
                    "order; run this backfill under a new epoch (above "
                    f"{last}) or leave epoch= unset. Nothing was committed."
                )
        # The schema writer_setup staged; without it (format("eosink") commits in another
        # process than its writer_setup) the table's: new columns are never required.
        metadata = (
            self._metadata if self._metadata is not None else getattr(table, "metadata", None)
        )
        required = (
            [] if metadata is None else [f.name for f in metadata.schema().fields if f.required]
        )
        io = self.opts.catalog_properties()
        if table is not None:
            io = {**io, **table.io.properties}
        cdc.check_changes(self.opts, epoch, changes, io, required)
        return eosink.Prepared(
            {
                "mode": "upsert",
                "changes": changes,
                "files": [],
                "keys": list(self.opts.keys),
                "order_by": self.opts.order_by,
                "op_column": self.opts.op_column,
                "delete_ops": list(self.opts.delete_ops),
                "table": self.opts.table,
                "evolve": evolve,
            },
            files=len(changes),
            bytes=sum(int(c.get("size", 0)) for c in changes),
        )

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

    def commit(self, epoch: int, committable: dict[str, Any]) -> CommitOutcome | None:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        table = self._table()
        if table is None:
            raise SinkError(f"Iceberg table {self.opts.table!r} disappeared")
        if self._committed(table, epoch):
            if committable.get("mode") == "upsert":
                self._sweep_changes(table, epoch, keep=None)
            else:
                self._sweep_epoch(table, epoch, committable)
            return CommitOutcome.already_committed("a snapshot of the table has it")
        evolve = committable.get("evolve")
        if committable.get("mode") == "upsert":
            self._commit_changes(table, epoch, committable)
            return None
        if not committable["files"] and not evolve:
            self._sweep_epoch(table, epoch, committable)
            return None
        data_files = [data_file_from_json(f) for f in committable["files"]]
        self._check_present(table, epoch, [df.file_path for df in data_files], "data")
        props = self._epoch_props(table, epoch)
        try:
            with _compat.transaction(table) as tx:
                if evolve:
                    self._apply_evolution(tx, evolve, epoch)
                summary = {"eosink.sink-id": self.sink_id, "eosink.epoch": str(epoch)}
                with tx.update_snapshot(snapshot_properties=summary).fast_append() as app:
                    for i, df in enumerate(data_files):
                        app.append_data_file(df)
                        if i == 0:
                            fault_point("mid_commit", site="append")
                tx.set_properties(props)
        except CommitFailedException as exc:
            raise CommitFailedError(f"iceberg commit of epoch {epoch} conflicted: {exc}") from None
        except CommitStateUnknownException as exc:
            raise CommitStateUnknownError(f"iceberg commit of epoch {epoch}: {exc}") from None
        self._pending_marker = None
        self.commits += 1
        self._sweep_epoch(table, epoch, committable)
        if self.opts.expire_snapshots_keep:
            self._expire(self.opts.expire_snapshots_keep)
        return None

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

    def _commit_changes(self, table: Any, epoch: int, committable: dict[str, Any]) -> None:
        """Phase 2 of an upsert epoch (see ``cdc.py``): one table commit that rewrites the
        data files holding the epoch's keys without them and adds the upserted rows; redone
        on the new snapshot when another writer committed meanwhile."""
        from pyiceberg.exceptions import (
            CommitFailedException,
            CommitStateUnknownException,
            ValidationException,
        )

        # The committable says how the epoch is applied, whatever this run's options.
        spec = self.opts.model_copy(
            update={
                "mode": "upsert",
                "keys": tuple(committable["keys"]),
                "order_by": committable.get("order_by"),
                "op_column": committable.get("op_column"),
                "delete_ops": tuple(committable.get("delete_ops") or ("d",)),
            }
        )
        io_props = {**self.opts.catalog_properties(), **table.io.properties}
        t0 = time.perf_counter()
        staged = [c["path"] for c in committable["changes"] if c.get("rows")]
        self._check_present(table, epoch, staged, "change")
        changes = cdc.read_changes(spec, committable["changes"], io_props)
        evolve = committable.get("evolve")
        if changes.keys.num_rows == 0 and not evolve:
            self._sweep_changes(table, epoch, keep=set())
            return
        summary = {"eosink.sink-id": self.sink_id, "eosink.epoch": str(epoch)}
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            written: list[Any] = []
            removed = 0
            try:
                tx = _compat.transaction(table)
                if evolve:
                    self._apply_evolution(tx, evolve, epoch)
                metadata = tx.table_metadata
                gone, kept, removed = cdc.rewrite_plan(table, metadata, changes.keys, table.io)
                where = cdc.new_files_dir(table.location(), self.sink_id, epoch)
                if kept is not None:
                    written += cdc.write_data(metadata, kept, table.io, self.sink_id, epoch, where)
                written += cdc.write_data(
                    metadata, changes.upserts, table.io, self.sink_id, epoch, where
                )
                fault_point("mid_commit", site="upsert")
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as ow:
                    for f in gone:
                        ow.delete_data_file(f)
                    for f in written:
                        ow.append_data_file(f)
                tx.set_properties(self._epoch_props(table, epoch))
                tx.commit_transaction()
            except (CommitFailedException, ValidationException) as exc:
                # Another writer committed meanwhile, and pyiceberg's own retry could not
                # rebase this commit (a file it rewrites changed): redo it from the new state.
                self._delete_unreferenced(None, [f.file_path for f in written], refs=set())
                table = self._table()
                if table is None:
                    raise SinkError(f"Iceberg table {self.opts.table!r} disappeared") from None
                if self._committed(table, epoch):  # a zombie's commit of the same epoch
                    self._sweep_changes(table, epoch, keep=None)
                    return
                if attempt == _CONFLICT_ATTEMPTS:
                    raise CommitFailedError(
                        f"iceberg upsert commit of epoch {epoch} conflicted {attempt} times "
                        f"with other writers: {exc}"
                    ) from None
                log.info(
                    "iceberg: upsert commit of epoch %d of %s conflicted with another "
                    "writer (%s); redone on the new snapshot (attempt %d)",
                    epoch,
                    self.sink_id,
                    exc,
                    attempt + 1,
                )
                continue
            except CommitStateUnknownException as exc:
                raise CommitStateUnknownError(f"iceberg commit of epoch {epoch}: {exc}") from None
            break
        self._pending_marker = None
        self.commits += 1
        log.info(
            "iceberg: epoch %d of %s committed %d upsert(s) and %d delete(s): %d row(s) "
            "replaced in %d rewritten data file(s), in %.2f s",
            epoch,
            self.sink_id,
            changes.upserts.num_rows,
            changes.deletes,
            removed,
            len(gone),
            time.perf_counter() - t0,
        )
        self._sweep_changes(table, epoch, keep={norm(f.file_path) for f in written})
        if self.opts.expire_snapshots_keep:
            self._expire(self.opts.expire_snapshots_keep)

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

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        try:
            table = self._table()
            paths = {f["file_path"] for f in (committable or {}).get("files", [])}
            paths |= {c["path"] for c in (committable or {}).get("changes", [])}
            paths |= {p for p, e in self._data_files(table) if e == epoch}
            # Never a file the table references: the core also aborts the output of a replay
            # of an epoch that is committed (its own files are in the table).
            self._delete_unreferenced(table, paths, fault="mid_abort")
            if table is not None:
                self._remove_native_dirs(table, epoch)
        except Exception:
            log.exception("iceberg: abort of epoch %d could not delete every data file", epoch)

    def staged_epochs(self) -> Iterable[int]:
        """Epochs with data files that the table does not reference and that are not
        committed (the core aborts them). Unreferenced files of epochs that ARE committed in
        the table (a dead executor's, a failed task attempt's; the core never offers a
        committed epoch to abort) are deleted here."""
        table = self._table()
        if table is None:
            return []
        files = self._data_files(table)
        if not files:
            return []
        refs = self._referenced(table)
        unreferenced: dict[int, list[str]] = {}
        for p, e in files:
            if norm(p) not in refs:
                unreferenced.setdefault(e, []).append(p)
        staged = []
        for e, paths in sorted(unreferenced.items()):
            if not self._committed(table, e):
                staged.append(e)
                continue
            try:
                n = self._delete_unreferenced(table, paths, refs=refs)
            except Exception:
                log.warning(
                    "iceberg: could not delete orphaned data files of committed epoch %d",
                    e,
                    exc_info=True,
                )
                continue
            log.info(
                "iceberg: deleted %d orphaned data file(s) of committed epoch %d of %s",
                n,
                e,
                self.sink_id,
            )
        return staged


def make_coordinator(opts: IcebergSinkOptions, sink_id: str) -> IcebergCoordinator:
    """The coordinator factory (on the driver)."""
    require_pyiceberg()
    return IcebergCoordinator(opts, sink_id)
