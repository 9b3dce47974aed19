"""What ``eosink.run`` returns: :class:`BatchResult` and :class:`StreamingHandle`."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._protocol import EpochFigures
from ._stream import StreamBatches, eosink_error_of_stream, finish_stream, wait_committed

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("eosink")

__all__ = ["BatchResult", "StreamingHandle"]


@dataclass(frozen=True)
class BatchResult:
    """What ``eosink.run`` returns for a batch DataFrame.

    Attributes:
        sink_id: the sink.
        epoch: the epoch written.
        rows: rows written in this call (0 when skipped).
        files: files (or other units) the run published: the epoch's commit's, plus the
            files a sink whose files span epochs rolled at the run's end.
        committed: True: the epoch is visible.
        skipped: True when the epoch had been committed before (a re-run is a no-op).
        recovered: True when a crashed earlier run's pending epoch was finished instead.
        figures: durations of the phases.
    """

    sink_id: str
    epoch: int
    rows: int
    files: int
    committed: bool
    skipped: bool = False
    recovered: bool = False
    figures: EpochFigures | None = None


@dataclass
class StreamingHandle:
    """A running streaming query writing through eosink.

    ``stop()`` and ``await_termination()`` return only once every epoch that Spark has
    checkpointed is committed and visible. ``figures`` holds one :class:`EpochFigures` per
    micro-batch (rows, pre-commit and commit durations, visibility lag), the newest 1,000 of
    them: a stream that runs for months keeps a flat memory. Every epoch's figures stay in the
    meta store (``eosink status``) and reach the ``eosink_epoch_committed`` hook.

    Over Spark Connect the micro-batches run in the server's Python worker: ``figures`` is
    filled from the meta store when the query ends, and ``stop()`` / ``await_termination()``
    commit from this client what the server's worker had not committed yet.

    Attributes:
        query: the Spark ``StreamingQuery``.
        sink_id: the sink.
        epoch_base: epoch = ``epoch_base`` + Spark's batchId for this checkpoint.
        figures: one :class:`EpochFigures` per micro-batch of this run, in order (the newest
            1,000).
    """

    query: StreamingQuery
    sink_id: str
    epoch_base: int
    _batches: StreamBatches
    _first_epoch: int = 0
    figures: list[EpochFigures] = field(default_factory=list)
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.figures = self._batches.figures

    @property
    def remote(self) -> bool:
        """Whether the micro-batches run on a Spark Connect server (not in this process)."""
        return self._batches.live is None

    @property
    def id(self) -> str:
        """The Spark streaming query's id (new at every start; never part of the sink's state)."""
        return str(self.query.id)

    @property
    def is_active(self) -> bool:
        """Whether the Spark streaming query is still running."""
        return bool(self.query.isActive)

    def committed_epochs(self) -> list[int]:
        """The epochs this handle's micro-batches wrote that are committed so far, in order
        (among the newest 1,000 micro-batches: :attr:`figures`)."""
        return [f.epoch for f in self.figures if f.committed_at]

    def _finish(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        live = self._batches.live
        if live is None:  # Spark Connect: the server's worker is gone with the query
            figures = finish_stream(self._batches.settings, self._first_epoch)
            self.figures[:] = figures
            return
        if live.roller is not None:
            live.roller.stop()
        committer = live.committer
        try:
            if committer is not None:
                committer.drain(until_checkpointed=True)
                left = committer.outstanding()
                if left:
                    log.info(
                        "sink %s: %d epoch(s) not checkpointed by Spark stay PENDING; the next "
                        "start aborts and rewrites them",
                        self.sink_id,
                        left,
                    )
            live.runtime.roll(everything=True)  # a stopped stream leaves no rows waiting
        finally:
            if committer is not None:
                committer.close()
            live.runtime.close()
            live.runtime.store.close()

    def stop(self) -> None:
        """Stop the query, then commit every checkpointed epoch before returning."""
        self.query.stop()
        self._finish()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (e.g. ``availableNow``); drain commits; re-raise errors.

        Returns:
            True if the query ended within ``timeout``.

        Raises:
            EosinkError: the error that stopped the query when eosink raised it (over Spark
                Connect too); else Spark's ``StreamingQueryException``.
        """
        try:
            done = (
                self.query.awaitTermination(timeout)  # type: ignore[arg-type]
                if timeout is not None
                else (self.query.awaitTermination() or True)
            )
        except BaseException as exc:
            live = self._batches.live
            if live is None and _still_running(self.query):
                raise  # e.g. KeyboardInterrupt: the server's query runs on; stop() ends it
            try:
                self._finish()
            except Exception:
                log.exception("sink %s: finishing the stopped stream failed", self.sink_id)
            if live is not None and live.committer is not None:
                live.committer.raise_if_failed()
            err = eosink_error_of_stream(exc)
            if err is not None:
                raise err from _spark_error(err, exc)
            raise
        if done:
            self._finish()
        return bool(done)

    def process_all_available(self, timeout: float = 300.0) -> None:
        """Block until the source's available data is processed and committed.

        Over Spark Connect the server's worker commits; this waits (up to ``timeout``
        seconds) until the meta store shows every checkpointed epoch committed."""
        try:
            self.query.processAllAvailable()
        except Exception as exc:
            err = eosink_error_of_stream(exc)
            if err is not None:
                raise err from _spark_error(err, exc)
            raise
        live = self._batches.live
        if live is None:
            wait_committed(self._batches.settings, lambda: _still_running(self.query), timeout)
        elif live.committer is not None:
            live.committer.drain(until_checkpointed=True)

    def __enter__(self) -> StreamingHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spark_error(err: BaseException, exc: BaseException) -> BaseException | None:
    """Spark's exception behind ``err``: ``exc``, or, when pyspark's error conversion (wrapped
    by ``register_datasource``) already raised the eosink error itself, the one it replaced."""
    if err is not exc:
        return exc
    return getattr(err, "_spark_error", None) or err.__cause__


def _still_running(query: StreamingQuery) -> bool:
    """Whether a Spark Connect query is still active on its server (False when the server
    cannot be asked: it is gone, and with it the query)."""
    try:
        return bool(query.isActive)
    except Exception:
        return False
