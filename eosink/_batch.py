"""A batch run's lifecycle: the one place that orders its steps, for every front end.

``eosink.run`` runs it in one process (:func:`run_batch`). ``format("eosink")``'s data
source runs it in two: Spark asks its ``writer`` for the epoch (:func:`open_batch`, on one
Python worker of the driver), the tasks write, and its ``commit`` (another worker) ends it
(:func:`commit_batch`, or :func:`end_batch` for an epoch committed before). The CLI's
``eosink recover`` finishes a stopped sink with :func:`finish_stopped`.
"""

from __future__ import annotations

import dataclasses
import getpass
import logging
import socket
from collections.abc import Callable
from typing import Any, cast

from ._handles import BatchResult
from ._mixins import Rolling
from ._protocol import Epoch, SinkRuntime
from ._write import Written
from .errors import ConfigError, SinkError

log = logging.getLogger("eosink")

__all__ = ["Finished", "commit_batch", "end_batch", "finish_stopped", "open_batch", "run_batch"]


def run_batch(
    runtime: SinkRuntime, epoch: int | None, write: Callable[[Epoch], Written]
) -> BatchResult:
    """A batch run's lifecycle on an open runtime: the epoch decided (recovered, skipped as
    committed, or written), ``write`` (Spark's tasks for ``eosink.run``: it returns the
    epoch's write results, or discards the epoch and raises), phase 1, the commit, then
    every open file rolled and the run's end recorded. The caller closes the runtime."""
    ep = open_batch(runtime, epoch)
    if ep.skipped:
        return end_batch(runtime, skipped_result(runtime, ep))
    log.info("sink %s epoch %d: writing batch DataFrame", runtime.sink_id, ep.epoch)
    return commit_batch(runtime, ep, write(ep))


def open_batch(runtime: SinkRuntime, epoch: int | None) -> Epoch:
    """The epoch a batch run writes (None: the next free one), recovery applied first
    (:meth:`SinkRuntime.batch_epoch`): to be written, skipped as committed before, or a
    crashed run's complete epoch committed now (``recovered``)."""
    return runtime.batch_epoch(epoch)


def skipped_result(runtime: SinkRuntime, ep: Epoch) -> BatchResult:
    """The result of a batch run whose epoch needs no write (see :func:`open_batch`)."""
    sid, e = runtime.sink_id, ep.epoch
    if ep.recovered:
        fig = ep.figures
        assert fig is not None
        return BatchResult(sid, e, fig.rows, fig.files, True, recovered=True, figures=fig)
    log.info("sink %s epoch %d: already committed; nothing to do", sid, e)
    return BatchResult(sid, e, 0, 0, committed=True, skipped=True)


def commit_batch(runtime: SinkRuntime, ep: Epoch, w: Written) -> BatchResult:
    """Phase 1 and the commit of a batch run's written epoch, then :func:`end_batch`. A batch
    run has no Spark checkpoint: the durable PENDING row plays that role."""
    fig = ep.prepare(w.results, w.rows, w.seconds, writer=w.writer, schema=w.schema)
    ep.commit()
    return end_batch(
        runtime, BatchResult(runtime.sink_id, ep.epoch, w.rows, fig.files, True, figures=fig)
    )


def end_batch(runtime: SinkRuntime, result: BatchResult) -> BatchResult:
    """The end of a batch run, written or not: every open file rolled (a batch run leaves no
    rows in open files, also those a crashed run left in committed epochs) and the run's end
    recorded. ``result`` with the rolled files added."""
    rolled = runtime.roll(everything=True)
    runtime.run_returned(result.epoch)
    return dataclasses.replace(result, files=result.files + rolled) if rolled else result


@dataclasses.dataclass(frozen=True)
class Finished:
    """What :func:`finish_stopped` did.

    Attributes:
        failure: the error of an epoch that still cannot be committed (then nothing was
            dropped or rolled), or of an open file that cannot be published; or None.
        dropped: the open files dropped (the file sink's records: ``final``, ``start``,
            ``end``, ``rows``, ``bytes``, ``why``), each recorded as a known loss.
        rolled: the open files published.
    """

    failure: SinkError | None
    dropped: list[dict[str, Any]]
    rolled: int


def finish_stopped(runtime: SinkRuntime, *, drop_lost_open_files: str | None = None) -> Finished:
    """``eosink recover``'s lifecycle on an open runtime of a stopped sink (the caller checked
    that it is stopped, and closes the runtime): the recovery rules with every PENDING epoch
    taken as complete data (as a batch run takes them: a stopped stream's PENDING epochs are
    checkpointed or a crashed run's), then, given a reason, the open files whose committed
    rows were destroyed outside eosink dropped and recorded as known losses, then every open
    file rolled (published).

    Raises:
        ConfigError: ``drop_lost_open_files`` for a sink without open files.
    """
    try:
        runtime.recover(first_epoch=0)  # lineage "batch": every PENDING epoch is complete
    except SinkError as exc:  # an epoch that still cannot be committed: the caller reports it
        return Finished(exc, [], 0)
    dropped = _drop_lost_open_files(runtime, drop_lost_open_files) if drop_lost_open_files else []
    try:
        return Finished(None, dropped, runtime.roll(everything=True))
    except SinkError as exc:  # an open file that cannot be published (lost behind its back)
        return Finished(exc, dropped, 0)


def _drop_lost_open_files(rt: SinkRuntime, reason: str) -> list[dict[str, Any]]:
    """Drop the sink's open files whose committed rows can no longer be published, and
    record their rows as known losses (one per last epoch of a file's epochs; the plugin logs
    each file it drops)."""
    from ._metastore import DROPPED_OPEN_FILE, PENDING

    if not rt.caps.rolling:
        raise ConfigError(
            f"--drop-lost-open-files: sink {rt.sink_id} ({rt.plugin.name}) has no open files"
        )
    if rt.store.epochs(rt.sink_id, (PENDING,)):
        raise ConfigError(
            f"--drop-lost-open-files: sink {rt.sink_id} still has PENDING epochs that could "
            "not be committed (see `eosink status`); if one of them fails on a lost open "
            "file, abandon it first (`eosink abandon`), then run this again"
        )
    dropped = cast(Rolling, rt.coordinator).drop_lost_open_files()
    by = f"{getpass.getuser()}@{socket.gethostname()} (eosink recover --drop-lost-open-files)"
    for d in dropped:
        rt.store.record_loss(
            rt.sink_id,
            d["end"],
            rows=d["rows"],
            files=1,
            nbytes=d["bytes"],
            origin=DROPPED_OPEN_FILE,
            reason=f"{reason}: open file {d['final']} of epochs {d['start']}..{d['end']} "
            f"dropped, {d['why']}",
            by=by,
        )
    return dropped
