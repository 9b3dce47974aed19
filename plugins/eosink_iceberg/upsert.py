"""The iceberg sink's upsert epochs (``mode="upsert"``): phase 1's checks of the staged change
rows and phase 2's copy-on-write commit (the change files themselves: ``cdc.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import eosink
from eosink import (
    CommitFailedError,
    CommitStateUnknownError,
    ConfigError,
    SinkError,
    fault_point,
)

from . import _compat, cdc, rewrite
from .datafiles import norm
from .files import EpochFiles
from .setup import TableSetup

__all__ = ["UpsertEpochs"]

log = logging.getLogger("eosink.iceberg")

# A commit that conflicts with another writer's is redone on the new snapshot this often.
_CONFLICT_ATTEMPTS = 20


class UpsertEpochs(TableSetup, EpochFiles):
    """Phase 1 and phase 2 of the epochs of an upsert sink (a part of the coordinator)."""

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
                gone, kept, removed = rewrite.rewrite_plan(table, metadata, changes.keys, table.io)
                where = rewrite.new_files_dir(table.location(), self.sink_id, epoch)
                if kept is not None:
                    written += rewrite.write_data(
                        metadata, kept, table.io, self.sink_id, epoch, where
                    )
                written += rewrite.write_data(
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
