"""Phase 2's steps: one Delta version per epoch, carrying the epoch's app transactions.

* appends: the epoch's ``add`` actions through delta-rs's ``create_write_transaction``;
* upserts: the winners of the staged changes applied in one ``MERGE`` (``changes.py``);
* before either, :func:`check_present` refuses an epoch whose files are gone;
* :func:`commit_error` says what a failed attempt means: a conflict with another writer's
  commit (``CommitFailedError``: nothing visible, retried on the new version) or an unknown
  state (``CommitStateUnknownError``: retried, and the retry's check of the app
  transactions finds the epoch if the attempt got in).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa

from eosink import CommitFailedError, CommitStateUnknownError, SinkError
from eosink.util import abandon_hint

from . import changes, table
from .options import DeltaSinkOptions, redact

__all__ = ["append", "check_present", "commit_error", "commit_properties", "merge_epoch"]

log = logging.getLogger("eosink.delta")


def commit_properties(sink_id: str, epoch: int, txns: dict[str, int]) -> Any:
    """The commit's app transactions and its commit info (the sink and the epoch)."""
    from deltalake.transaction import CommitProperties, Transaction

    return CommitProperties(
        app_transactions=[Transaction(app, v) for app, v in txns.items()],
        custom_metadata={"eosink.sink_id": sink_id, "eosink.epoch": str(epoch)},
    )


def check_present(
    fs: Any, root: str, sink_id: str, epoch: int, paths: list[str], kind: str
) -> None:
    """Refuse to commit an epoch whose files are gone (a ``VACUUM`` with a short retention,
    a lifecycle rule, while the epoch was PENDING): the table would reference missing files.

    Raises:
        SinkError: naming the missing files and ``eosink abandon``.
    """
    if not paths:
        return
    from pyarrow import fs as pafs

    infos = fs.get_file_info([f"{root}/{p}" for p in paths])
    missing = [p for p, i in zip(paths, infos, strict=True) if i.type != pafs.FileType.File]
    if not missing:
        return
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    raise SinkError(
        f"delta sink {sink_id}: epoch {epoch} cannot be committed: {len(missing)} of its "
        f"{len(paths)} {kind} files are gone ({', '.join(missing[:3])}{more}). They were "
        "deleted while the epoch was PENDING (VACUUM with a retention shorter than the "
        "epoch's wait, or a storage lifecycle rule); committing them would leave the table "
        "referencing missing files. " + abandon_hint(sink_id, epoch)
    )


def append(t: Any, files: list[dict[str, Any]], props: Any) -> None:
    """Commit ``files`` (the writers' descriptions) as one version."""
    from deltalake.transaction import AddAction

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


def merge_epoch(
    opts: DeltaSinkOptions, t: Any, data: pa.Table, sink_id: str, epoch: int, props: Any
) -> None:
    """Apply an epoch's staged changes ``data`` in one ``MERGE`` (an empty epoch: its app
    transactions alone, in a version without files)."""
    if data.num_rows == 0:
        t.create_write_transaction([], mode="append", schema=t.schema(), commit_properties=props)
        return
    have = table.arrow_schema(t)
    won = changes.winners(opts, data)
    cols = [c for c in won.column_names if c in have.names]
    source = pa.Table.from_arrays(
        [won.column(c).cast(have.field(c).type) for c in cols] + [won.column(changes.DELETE)],
        names=[*cols, changes.DELETE],
    )
    metrics = changes.merge(opts, t, source, props)
    log.info(
        "delta sink %s epoch %d: merged %d changes (%s inserted, %s updated, %s deleted)",
        sink_id,
        epoch,
        source.num_rows,
        metrics.get("num_target_rows_inserted"),
        metrics.get("num_target_rows_updated"),
        metrics.get("num_target_rows_deleted"),
    )


def commit_error(opts: DeltaSinkOptions, epoch: int, exc: BaseException) -> Exception:
    """The eosink error of a failed commit attempt (see the module docstring)."""
    from deltalake.exceptions import CommitFailedError as DeltaCommitFailed

    first = str(exc).splitlines()[0] if str(exc) else ""
    text = redact(f"{type(exc).__name__}: {first}", opts)
    if isinstance(exc, DeltaCommitFailed):
        return CommitFailedError(
            f"delta commit of epoch {epoch} conflicted with another writer: {text}"
        )
    return CommitStateUnknownError(f"delta commit of epoch {epoch}: {text}")
