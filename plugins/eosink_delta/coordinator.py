"""The delta sink's coordinator: the table, phase 1's checks, one Delta version per epoch.

* ``writer_setup`` opens (or creates) the table, refuses what the sink cannot write
  (``table.py``), adds the columns the data gained, and gives the writers the table's schema.
* ``pre_commit`` gathers the writers' files into the committable and, for upserts, checks the
  staged changes (``changes.py``).
* ``commit`` makes the epoch one Delta version: its ``add`` actions through delta-rs's
  ``create_write_transaction`` (appends) or one ``MERGE`` (upserts), carrying the sink's app
  transactions (``epochs.py``), from which a replayed commit learns that the epoch is in.
* ``abort`` and ``staged_epochs`` find an epoch's files by their names (``layout.py``) and
  never touch a committed epoch's data files or another writer's.
* The marker (``TargetMarker``) is a table property, ``eosink.<sink key>.marker``, set with
  the table's creation or, when it changes (a new stream, a rebase, a retirement), in a
  metadata commit of its own; ``last_epoch`` is the frontier of the app transactions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from eosink import (
    CommitOutcome,
    ConfigError,
    EpochSpec,
    JournalHome,
    Prepared,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import abandon_hint, marker_from_property, marker_property, sink_key

from . import changes, commit, epochs, layout, table
from .cleanup import Staging
from .options import DeltaSinkOptions, redact
from .stats import indexed_columns
from .writer import Setup

__all__ = ["DeltaCoordinator", "make_coordinator"]

log = logging.getLogger("eosink.delta")

_HOW = ("mode", "keys", "order_by", "op_column", "delete_ops")
"""The options that say how an epoch's rows are applied: taken from the epoch's spec."""


class DeltaCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    JournalHome,
    SparkWriter[dict[str, Any]],
):
    """The coordinator of one sink_id (see the module's docstring)."""

    def __init__(self, opts: DeltaSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.sink_id = sink_id
        self.ids = epochs.AppIds.of(sink_id)
        self.marker_prop = f"eosink.{sink_key(sink_id)}.marker"
        self._dt: Any = None
        self._pending_marker: str | None = None
        self.staging = Staging(opts, sink_id)
        self.commits = 0

    # -- the table ---------------------------------------------------------------------
    def init(self) -> None:
        table.open_table(self.opts)  # deltalake installed, the location readable
        from .s3check import check_safe_commit

        check_safe_commit(self.opts)

    def target_id(self) -> str | None:
        return f"delta:{self.opts.path}"

    def journal_location(self) -> str | None:
        """The core's batch journal, ``_eosink/journal`` in the table's directory (hidden from
        Delta readers and from ``VACUUM``) on a local or mounted path; None on ``s3://``."""
        return None if self.opts.on_s3 else f"{self.opts.path}/{layout.JOURNAL}"

    def _table(self) -> Any:
        """The table at its newest version (None when there is none yet)."""
        if self._dt is None:
            self._dt = table.open_table(self.opts)
        else:
            try:
                self._dt.update_incremental()
            except Exception as exc:
                raise SinkError(
                    redact(f"cannot read the Delta table at {self.opts.path}: {exc}", self.opts)
                ) from None
        return self._dt

    # -- the sink's marker in the table (TargetMarker) -----------------------------------
    def read_marker(self) -> dict[str, Any] | None:
        t = self._table()
        if t is None:
            return None
        raw = dict(t.metadata().configuration or {}).get(self.marker_prop)
        last = epochs.last_epoch(self.ids, t.transaction_version)
        if raw is None and last < 0:
            return None
        return marker_from_property(
            raw, last, f"Delta table {self.opts.path}: table property {self.marker_prop!r}"
        )

    def write_marker(self, marker: dict[str, Any]) -> None:
        raw = marker_property(marker)
        t = self._table()
        if t is None:
            self._pending_marker = raw  # stored with the table's creation (writer_setup)
            return
        for attempt in range(10):
            if dict(t.metadata().configuration or {}).get(self.marker_prop) == raw:
                break
            try:
                t.alter.set_table_properties({self.marker_prop: raw}, raise_if_not_exists=False)
                break
            except Exception as exc:
                if attempt == 9:
                    raise SinkError(
                        redact(
                            f"Delta table {self.opts.path}: cannot store the eosink marker: {exc}",
                            self.opts,
                        )
                    ) from None
                t = self._table()
        self._pending_marker = None

    # -- before the writers ----------------------------------------------------------------
    def writer_setup(self, schema: pa.Schema) -> Setup:
        t = self._table()
        if t is None:
            if not self.opts.create_table:
                raise ConfigError(
                    f"there is no Delta table at {self.opts.path} and create_table=False: create "
                    "it first, or let the sink create it from the DataFrame's schema"
                )
            props = {self.marker_prop: self._pending_marker} if self._pending_marker else {}
            self._dt = t = table.create_table(self.opts, schema, props)
            self._pending_marker = None
        elif self._pending_marker is not None:  # another writer created it meanwhile
            self.write_marker(json.loads(self._pending_marker))
        table.check_table(self.opts, t)
        table.check_partitioning(self.opts, t)
        parts = list(t.metadata().partition_columns)
        for k in self.opts.keys:
            if k not in schema.names:
                raise ConfigError(f"keys names {k!r}, which is not a column of the data")
        for name, what in ((self.opts.order_by, "order_by"), (self.opts.op_column, "op_column")):
            if name is not None and name not in schema.names:
                raise ConfigError(f"{what} names {name!r}, which is not a column of the data")
        new = table.plan_schema(self.opts, table.arrow_schema(t), schema, parts)
        if new:
            table.evolve(self.opts, t, new)
            t = self._table()
        have = table.arrow_schema(t)
        config = dict(t.metadata().configuration or {})
        return Setup(
            schema=have,
            partition_by=tuple(parts),
            indexed=tuple(indexed_columns(have.names, parts, config)),
        )

    # -- the native path (SparkWriter) -------------------------------------------------------
    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        """Why Spark's writer does not stage this epoch (``writer="python"``, or where the
        native path cannot write), or None.

        Raises:
            ConfigError: ``writer="spark"`` and the native path cannot write the epoch.
        """
        from .native import unsupported

        if self.opts.writer == "python":
            return "the sink's option writer='python'"
        why = unsupported(self.opts, schema)
        if why is not None and self.opts.writer == "spark":
            raise ConfigError(
                f"Delta table {self.opts.path}: writer='spark', but Spark's Parquet writer "
                f"cannot stage this epoch: {why}. Use writer='auto' or writer='python'."
            )
        return why

    def write_with_spark(
        self, df: Any, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        from .native import write_epoch

        return write_epoch(self.opts, self.sink_id, df, epoch, attempt, setup)

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        key = "changes" if self.opts.mode == "upsert" else "files"
        found = sum(int(f["rows"]) for r in results for f in r.get(key, []))
        if found != rows:
            raise SinkError(
                f"delta sink epoch {epoch}: Spark wrote {rows} rows, but the files the driver "
                f"finds under {self.opts.path} hold {found}. The table's location must be the "
                "same for every node of the query (a shared mount or an object store). "
                "Nothing was committed"
            )

    # -- phase 1 ------------------------------------------------------------------------
    def pre_commit(self, epoch: int, results: Sequence[dict[str, Any]]) -> Prepared[dict[str, Any]]:
        if self.opts.mode == "upsert":
            staged = [f for r in results for f in r.get("changes", [])]
            t = self._table()
            last = epochs.last_epoch(self.ids, t.transaction_version) if t is not None else -1
            if epoch < last and not epochs.is_committed(self.ids, epoch, t.transaction_version):
                raise SinkError(
                    f"delta sink {self.sink_id}: upsert epoch {epoch} is older than epoch {last}, "
                    "which the table already has: its changes would overwrite newer ones. "
                    "Write it under a new epoch (no epoch=). Nothing was committed"
                )
            fs, root = self.staging.files()
            cols = list(
                dict.fromkeys(
                    [*self.opts.keys, *([self.opts.order_by] if self.opts.order_by else [])]
                )
            )
            changes.check_changes(
                self.opts,
                epoch,
                changes.read_changes(fs, root, [f["path"] for f in staged if f["rows"]], cols),
            )
            committable = {"mode": "upsert", "changes": staged}
            return Prepared(
                committable, files=len(staged), bytes=sum(int(f["size"]) for f in staged)
            )
        files = [f for r in results for f in r.get("files", [])]
        return Prepared(
            {"mode": "append", "files": files},
            files=len(files),
            bytes=sum(int(f["size"]) for f in files),
        )

    # -- phase 2 ------------------------------------------------------------------------
    def _as_staged(self, spec: EpochSpec | None) -> DeltaSinkOptions:
        """The options an epoch was staged with (its spec; the run's own without one): a
        PENDING epoch is applied with the keys, order and deletes it was staged with,
        whatever this run was given."""
        if spec is None:
            return self.opts
        how = {k: spec.options[k] for k in _HOW if k in spec.options}
        fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in how.items()}
        return self.opts.model_copy(update=fixed)

    def commit(
        self, epoch: int, committable: dict[str, Any], spec: EpochSpec | None = None
    ) -> CommitOutcome | None:
        opts = self._as_staged(spec)
        t = self._table()
        if t is None:
            raise SinkError(f"the Delta table at {self.opts.path} disappeared")
        look = t.transaction_version
        if epochs.is_committed(self.ids, epoch, look):
            self.staging.sweep(epoch, committable)
            return CommitOutcome.already_committed("the table's app transactions have it")
        table.check_table(self.opts, t)  # a feature enabled while the epoch was PENDING
        txns = epochs.txns_for(self.ids, epoch, look)
        if committable["mode"] == "upsert" and len(txns) == 1 and self.ids.backfill(epoch) in txns:
            raise SinkError(
                f"delta sink {self.sink_id}: upsert epoch {epoch} is older than the table's "
                f"newest epoch {epochs.last_epoch(self.ids, look)}: applying it now would "
                "overwrite newer changes. " + abandon_hint(self.sink_id, epoch)
            )
        props = commit.commit_properties(self.sink_id, epoch, txns)
        fs, root = self.staging.files()
        try:
            if committable["mode"] == "upsert":
                staged = [f["path"] for f in committable["changes"] if f["rows"]]
                commit.check_present(fs, root, self.sink_id, epoch, staged, "staged change")
                data = changes.read_changes(fs, root, staged, None)
                commit.merge_epoch(opts, t, data, self.sink_id, epoch, props)
            else:
                files = committable["files"]
                paths = [f["path"] for f in files]
                commit.check_present(fs, root, self.sink_id, epoch, paths, "data")
                commit.append(t, files, props)
        except (SinkError, ConfigError):
            raise
        except Exception as exc:
            raise commit.commit_error(self.opts, epoch, exc) from None
        fault_point("mid_commit")
        self.commits += 1
        self.staging.sweep(epoch, committable)
        return None

    def abort(
        self, epoch: int, committable: dict[str, Any] | None, spec: EpochSpec | None = None
    ) -> None:
        try:
            t = self._table()
            committed = t is not None and epochs.is_committed(
                self.ids, epoch, t.transaction_version
            )
            self.staging.abort(t, epoch, committed)
        except Exception as exc:  # never raise: the next start finds it again (staged_epochs)
            log.warning(
                "delta sink %s: abort of epoch %d left files behind: %s",
                self.sink_id,
                epoch,
                redact(str(exc), self.opts),
            )

    def staged_epochs(self) -> Iterable[int]:
        t = self._table()
        look = t.transaction_version if t is not None else (lambda _app: None)
        found = {
            e for e in self.staging.data_epochs() if not epochs.is_committed(self.ids, e, look)
        }
        return sorted(found | self.staging.changes_epochs())


def make_coordinator(opts: DeltaSinkOptions, sink_id: str) -> DeltaCoordinator:
    """The delta sink's coordinator factory."""
    return DeltaCoordinator(opts, sink_id)


def describe_open(
    sink_id: str, last_committed: dict[str, Any] | None, pending: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """What ``eosink status`` shows the sink holds open: each PENDING epoch's staged files."""
    out = []
    for epoch, c in sorted(pending.items()):
        staged = c.get("files") or c.get("changes") or []
        kind = "staged changes" if c.get("mode") == "upsert" else "staged data files"
        size = sum(int(f.get("size", 0)) for f in staged)
        where = sorted(
            {
                layout.attempt_dir(f["path"])
                if c.get("mode") != "upsert"
                else f["path"].rsplit("/", 1)[0]
                for f in staged
            }
        )
        out.append(
            {
                "kind": kind,
                "what": f"epoch {epoch}: {len(staged)} file(s), {size} bytes, under "
                + (", ".join(where) or "nothing"),
            }
        )
    return out
