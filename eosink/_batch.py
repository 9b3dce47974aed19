"""A batch run's lifecycle: the one place that orders its steps, for every front end.

``eosink.run`` runs it in one process (:func:`run_batch`). ``format("eosink")``'s data
source runs it in two: Spark asks its ``writer`` for the epoch (:func:`open_batch`, on one
Python worker of the driver), the tasks write, and its ``commit`` (another worker) ends it
(:func:`commit_batch`, or :func:`end_batch` for an epoch committed before).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from ._handles import BatchResult
from ._protocol import Epoch, SinkRuntime
from ._write import Written

log = logging.getLogger("eosink")

__all__ = ["commit_batch", "end_batch", "open_batch", "run_batch"]


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
    fig = ep.prepare(w.results, w.rows, w.seconds, writer=w.writer)
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
