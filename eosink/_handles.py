"""What ``eosink.run`` returns: :class:`BatchResult` and :class:`StreamingHandle`."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._protocol import AsyncCommitter, EpochFigures, SinkRuntime
from .sink import Rolling

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
    micro-batch (rows, pre-commit and commit durations, visibility lag).

    Attributes:
        query: the Spark ``StreamingQuery``.
        sink_id: the sink.
        epoch_base: epoch = ``epoch_base`` + Spark's batchId for this checkpoint.
        figures: one :class:`EpochFigures` per micro-batch of this run, in order.
    """

    query: StreamingQuery
    sink_id: str
    runtime: SinkRuntime
    committer: AsyncCommitter | None
    epoch_base: int
    figures: list[EpochFigures] = field(default_factory=list)
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> str:
        """The Spark streaming query's id (new at every start; never part of the sink's state)."""
        return str(self.query.id)

    @property
    def is_active(self) -> bool:
        """Whether the Spark streaming query is still running."""
        return bool(self.query.isActive)

    def committed_epochs(self) -> list[int]:
        """The epochs this handle's micro-batches wrote that are committed so far, in order."""
        return [f.epoch for f in self.figures if f.committed_at]

    def __post_init__(self) -> None:
        self._stop_rolls = threading.Event()
        self._roller: threading.Thread | None = None
        if isinstance(self.runtime.coordinator, Rolling):
            self._roller = threading.Thread(
                target=self._roll_loop, name=f"eosink-roll-{self.sink_id}", daemon=True
            )
            self._roller.start()

    def _roll_loop(self) -> None:
        """Publish open files that are due by time (rollover, inactivity) between batches."""
        coord = self.runtime.coordinator
        assert isinstance(coord, Rolling)
        while not self._stop_rolls.is_set():
            wait = coord.next_roll_in()
            if wait is not None and wait <= 0:
                try:
                    self.runtime.roll(everything=False)
                except Exception:
                    log.exception("sink %s: rolling open files failed; retrying", self.sink_id)
                    self._stop_rolls.wait(5.0)
                    continue
                wait = coord.next_roll_in()
            self._stop_rolls.wait(min(1.0, wait) if wait is not None else 1.0)

    def _finish(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_rolls.set()
        if self._roller is not None:
            self._roller.join()
        try:
            if self.committer is not None:
                self.committer.drain(until_checkpointed=True)
                left = self.committer.outstanding()
                if left:
                    log.info(
                        "sink %s: %d epoch(s) not checkpointed by Spark stay PENDING; the next "
                        "start aborts and rewrites them",
                        self.sink_id,
                        left,
                    )
            self.runtime.roll(everything=True)  # a stopped stream leaves no rows waiting
        finally:
            if self.committer is not None:
                self.committer.close()
            self.runtime.close()
            self.runtime.store.close()

    def stop(self) -> None:
        """Stop the query, then commit every checkpointed epoch before returning."""
        self.query.stop()
        self._finish()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (e.g. ``availableNow``); drain commits; re-raise errors.

        Returns:
            True if the query ended within ``timeout``.
        """
        try:
            done = (
                self.query.awaitTermination(timeout)  # type: ignore[arg-type]
                if timeout is not None
                else (self.query.awaitTermination() or True)
            )
        except BaseException:
            self._finish()
            if self.committer is not None:
                self.committer.raise_if_failed()
            raise
        if done:
            self._finish()
        return bool(done)

    def process_all_available(self) -> None:
        """Block until the source's available data is processed and committed."""
        self.query.processAllAvailable()
        if self.committer is not None:
            self.committer.drain(until_checkpointed=True)

    def __enter__(self) -> StreamingHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
