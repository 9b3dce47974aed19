"""The iceberg sink's coordinator (on the driver): its phases, made of the sink's parts.

* ``checks.py``: what is checked before anything is written (``validate_schema``);
* ``setup.py``: the table before the writers (loaded or created, checked, evolved) and the
  native path;
* ``marker.py``: the sink's marker and committed epochs in the table's properties;
* ``files.py``: the sink's data files, swept after a commit, deleted on abort;
* ``upsert.py``: phase 1 and the commit of an upsert epoch.

What its phases do:

* ``commit`` appends the epoch's files in one snapshot whose summary carries
  ``eosink.sink-id`` and ``eosink.epoch``. In the same metadata commit it raises the table
  property ``eosink.epoch.<sink key>`` to the newest committed epoch (never lowers it) and
  adds the epoch to ``eosink.<sink key>.epochs`` (committed epochs as ranges). An epoch is
  already committed when it equals the newest, is in the ranges, or a snapshot in the
  ancestry of the current one carries the sink and exactly this epoch. Epochs may be
  committed out of order (a backfill of an older epoch). After the commit, data files of the
  epoch that no committable names (a dead executor, a failed task attempt) are deleted.
* ``mode="upsert"`` (``upsert.py``, ``cdc.py``): the writers stage the epoch's change rows
  as Parquet files; ``pre_commit`` checks them; ``commit`` rewrites the data files holding
  the epoch's keys and adds the upserted rows in one snapshot with the same marker
  (copy-on-write).
* ``abort`` deletes the epoch's data files (``files.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import eosink
from eosink import (
    CommitFailedError,
    CommitOutcome,
    CommitStateUnknownError,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)

from . import _compat
from .datafiles import data_file_from_json, norm, sink_key
from .options import IcebergSinkOptions, load_catalog, redact, require_pyiceberg
from .upsert import UpsertEpochs

__all__ = ["IcebergCoordinator", "make_coordinator"]

log = logging.getLogger("eosink.iceberg")


class IcebergCoordinator(
    UpsertEpochs,
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
