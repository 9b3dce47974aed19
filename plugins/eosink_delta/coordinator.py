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
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from eosink import (
    CommitFailedError,
    CommitOutcome,
    CommitStateUnknownError,
    ConfigError,
    Prepared,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import abandon_hint, sink_key

from . import changes, epochs, layout, table
from .options import DeltaSinkOptions, filesystem, redact
from .stats import indexed_columns
from .writer import Setup

__all__ = ["DeltaCoordinator", "make_coordinator"]

log = logging.getLogger("eosink.delta")


class DeltaCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    StagedEpochs,
    TargetMarker,
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
        self._fs: Any = None
        self._root = ""
        self.commits = 0

    # -- the table ---------------------------------------------------------------------
    def init(self) -> None:
        table.open_table(self.opts)  # deltalake installed, the location readable
        from .s3check import check_safe_commit

        check_safe_commit(self.opts)

    def target_id(self) -> str | None:
        return f"delta:{self.opts.path}"

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

    def _files(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs, self._root = filesystem(self.opts)
        return self._fs, self._root

    # -- the sink's marker in the table (TargetMarker) -----------------------------------
    def read_marker(self) -> dict[str, Any] | None:
        t = self._table()
        if t is None:
            return None
        raw = dict(t.metadata().configuration or {}).get(self.marker_prop)
        last = epochs.last_epoch(self.ids, t.transaction_version)
        if raw is None and last < 0:
            return None
        marker: dict[str, Any] = {}
        if raw is not None:
            try:
                marker = dict(json.loads(raw))
            except (ValueError, TypeError):
                raise SinkError(
                    f"Delta table {self.opts.path}: table property {self.marker_prop!r} is not "
                    f"an eosink marker (not a JSON object): {raw[:200]!r}"
                ) from None
        marker["last_epoch"] = last
        return marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        raw = json.dumps(
            {k: v for k, v in marker.items() if k != "last_epoch"},
            separators=(",", ":"),
            sort_keys=True,
        )
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
            fs, root = self._files()
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
    def commit(self, epoch: int, committable: dict[str, Any]) -> CommitOutcome | None:
        t = self._table()
        if t is None:
            raise SinkError(f"the Delta table at {self.opts.path} disappeared")
        look = t.transaction_version
        if epochs.is_committed(self.ids, epoch, look):
            self._sweep(epoch, committable)
            return CommitOutcome.already_committed("the table's app transactions have it")
        table.check_table(self.opts, t)  # a feature enabled while the epoch was PENDING
        txns = epochs.txns_for(self.ids, epoch, look)
        if committable["mode"] == "upsert" and len(txns) == 1 and self.ids.backfill(epoch) in txns:
            raise SinkError(
                f"delta sink {self.sink_id}: upsert epoch {epoch} is older than the table's "
                f"newest epoch {epochs.last_epoch(self.ids, look)}: applying it now would "
                "overwrite newer changes. " + abandon_hint(self.sink_id, epoch)
            )
        props = self._commit_properties(epoch, txns)
        try:
            if committable["mode"] == "upsert":
                self._merge(t, epoch, committable, props)
            else:
                self._append(t, epoch, committable, props)
        except (SinkError, ConfigError):
            raise
        except Exception as exc:
            raise self._commit_error(epoch, exc) from None
        fault_point("mid_commit")
        self.commits += 1
        self._sweep(epoch, committable)
        return None

    def _commit_properties(self, epoch: int, txns: dict[str, int]) -> Any:
        from deltalake.transaction import CommitProperties, Transaction

        return CommitProperties(
            app_transactions=[Transaction(app, v) for app, v in txns.items()],
            custom_metadata={"eosink.sink_id": self.sink_id, "eosink.epoch": str(epoch)},
        )

    def _append(self, t: Any, epoch: int, committable: dict[str, Any], props: Any) -> None:
        from deltalake.transaction import AddAction

        files = committable["files"]
        self._check_present(epoch, [f["path"] for f in files], "data")
        now = int(time.time() * 1000)
        actions = [
            AddAction(f["path"], int(f["size"]), f["partition_values"], now, True, f["stats"])
            for f in files
        ]
        parts = list(t.metadata().partition_columns)
        t.create_write_transaction(
            actions,
            mode="append",
            schema=t.schema(),
            partition_by=parts or None,
            commit_properties=props,
        )

    def _merge(self, t: Any, epoch: int, committable: dict[str, Any], props: Any) -> None:
        staged = [f["path"] for f in committable["changes"] if f["rows"]]
        self._check_present(epoch, staged, "staged change")
        fs, root = self._files()
        data = changes.read_changes(fs, root, staged, None)
        have = table.arrow_schema(t)
        if data.num_rows == 0:
            # Nothing to merge: the epoch's app transactions alone, in an empty commit.
            t.create_write_transaction(
                [], mode="append", schema=t.schema(), commit_properties=props
            )
            return
        won = changes.winners(self.opts, data)
        cols = [c for c in won.column_names if c in have.names]
        source = pa.Table.from_arrays(
            [won.column(c).cast(have.field(c).type) for c in cols] + [won.column(changes.DELETE)],
            names=[*cols, changes.DELETE],
        )
        metrics = changes.merge(self.opts, t, source, props)
        log.info(
            "delta sink %s epoch %d: merged %d changes (%s inserted, %s updated, %s deleted)",
            self.sink_id,
            epoch,
            source.num_rows,
            metrics.get("num_target_rows_inserted"),
            metrics.get("num_target_rows_updated"),
            metrics.get("num_target_rows_deleted"),
        )

    def _commit_error(self, epoch: int, exc: BaseException) -> Exception:
        from deltalake.exceptions import CommitFailedError as DeltaCommitFailed

        text = redact(
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", self.opts
        )
        if isinstance(exc, DeltaCommitFailed):
            return CommitFailedError(
                f"delta commit of epoch {epoch} conflicted with another writer: {text}"
            )
        return CommitStateUnknownError(f"delta commit of epoch {epoch}: {text}")

    def _check_present(self, epoch: int, paths: list[str], kind: str) -> None:
        """Refuse to commit an epoch whose files are gone (a ``VACUUM`` with a short
        retention, a lifecycle rule, while the epoch was PENDING): the table would reference
        missing files.

        Raises:
            SinkError: naming the missing files and ``eosink abandon``.
        """
        if not paths:
            return
        from pyarrow import fs as pafs

        fs, root = self._files()
        infos = fs.get_file_info([f"{root}/{p}" for p in paths])
        missing = [p for p, i in zip(paths, infos, strict=True) if i.type != pafs.FileType.File]
        if not missing:
            return
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise SinkError(
            f"delta sink {self.sink_id}: epoch {epoch} cannot be committed: {len(missing)} of its "
            f"{len(paths)} {kind} files are gone ({', '.join(missing[:3])}{more}). They were "
            "deleted while the epoch was PENDING (VACUUM with a retention shorter than the "
            "epoch's wait, or a storage lifecycle rule); committing them would leave the table "
            "referencing missing files. " + abandon_hint(self.sink_id, epoch)
        )

    # -- cleanup ----------------------------------------------------------------------------
    def _epoch_dirs(self, epoch: int) -> list[str]:
        fs, root = self._files()
        return [d for d in layout.top_dirs(fs, root) if layout.epoch_of(self.sink_id, d) == epoch]

    def _changes_dirs(self, epoch: int | None) -> list[str]:
        fs, root = self._files()
        base = layout.changes_root(self.sink_id)
        return [
            f"{base}/{d}"
            for d in layout.top_dirs(fs, root, base)
            if epoch is None or layout.changes_epoch_of(d) == epoch
        ]

    def _delete_dirs(self, dirs: Iterable[str]) -> None:
        fs, root = self._files()
        for d in dirs:
            try:
                fs.delete_dir(f"{root}/{d}")
            except FileNotFoundError:
                pass

    def _sweep(self, epoch: int, committable: dict[str, Any]) -> None:
        """After the epoch's commit: delete its staged changes and the directories of its
        attempts that the commit did not take (dead and failed task attempts)."""
        keep = {f["path"].split("/", 1)[0] for f in committable.get("files", [])}
        self._delete_dirs([d for d in self._epoch_dirs(epoch) if d not in keep])
        self._delete_dirs(self._changes_dirs(epoch))

    def _committed_dirs(self, t: Any, epoch: int) -> set[str] | None:
        """The data directories the commit of ``epoch`` (in the table) named, read from that
        commit's log entry, found by its commit info from the newest version back; None when
        it is not found (the log cleaned up that far back)."""
        limit = 16
        while True:
            history = t.history(limit)
            for h in history:
                if h.get("eosink.sink_id") == self.sink_id and h.get("eosink.epoch") == str(epoch):
                    return self._dirs_of_version(int(h["version"]))
            if len(history) < limit or limit >= 4096:
                return None
            limit *= 4

    def _dirs_of_version(self, version: int) -> set[str]:
        from urllib.parse import unquote

        fs, root = self._files()
        with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as fh:
            lines = fh.read().decode().splitlines()
        out = set()
        for line in lines:
            add = json.loads(line).get("add") if line.strip() else None
            if add:
                out.add(unquote(add["path"]).split("/", 1)[0])
        return out

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        try:
            t = self._table()
            committed = t is not None and epochs.is_committed(
                self.ids, epoch, t.transaction_version
            )
            dirs = self._epoch_dirs(epoch)
            if committed and dirs:
                # A replay of a committed epoch (format("eosink")'s): only what its commit did
                # not take; the committed files are the table's (VACUUM deletes them).
                keep = self._committed_dirs(t, epoch)
                if keep is None:
                    log.warning(
                        "delta sink %s: epoch %d is in the table but its commit is no longer in "
                        "the log: its directories %s are kept (VACUUM removes what no version "
                        "references)",
                        self.sink_id,
                        epoch,
                        dirs,
                    )
                dirs = [d for d in dirs if keep is not None and d not in keep]
            dirs += self._changes_dirs(epoch)
            for i, d in enumerate(dirs):
                self._delete_dirs([d])
                if i == 0 and len(dirs) > 1:
                    fault_point("mid_abort")  # crash tests stop between two directories
        except Exception as exc:  # never raise: the next start finds it again (staged_epochs)
            log.warning(
                "delta sink %s: abort of epoch %d left files behind: %s",
                self.sink_id,
                epoch,
                redact(str(exc), self.opts),
            )

    def staged_epochs(self) -> Iterable[int]:
        fs, root = self._files()
        t = self._table()
        look = t.transaction_version if t is not None else (lambda _app: None)
        found = {
            e
            for d in layout.top_dirs(fs, root)
            if (e := layout.epoch_of(self.sink_id, d)) is not None
        }
        staged = {e for e in found if not epochs.is_committed(self.ids, e, look)}
        base = layout.changes_root(self.sink_id)
        staged |= {
            e
            for d in layout.top_dirs(fs, root, base)
            if (e := layout.changes_epoch_of(d)) is not None
        }
        return sorted(staged)


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
                f["path"].split("/")[0]
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
