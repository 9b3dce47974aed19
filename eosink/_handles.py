"""What ``eosink.run`` returns: :class:`BatchResult` and :class:`StreamingHandle`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import _metrics
from ._metastore import MetaStore
from ._protocol import EpochFigures
from ._restart import NO_RESTART, RestartPolicy, restart_rule, stream_failure_verdict
from ._spark_errors import eosink_error_of_stream
from ._stream import (
    StreamBatches,
    close_live,
    committed_figures,
    finish_stream,
    wait_committed,
)
from .errors import EosinkError, FencedError

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
    read from the meta store while the query runs (the epochs committed so far) and when it
    ends, and ``stop()`` / ``await_termination()`` commit from this client what the server's
    worker had not committed yet.

    A query that fails on a transient error is started again from its checkpoint (the
    ``restart=`` policy of ``eosink.run``) while you wait on the handle: ``await_termination``
    and ``process_all_available`` go on with the new query, which :attr:`query` then is.

    Attributes:
        query: the Spark ``StreamingQuery`` (the newest, after restarts).
        sink_id: the sink.
        epoch_base: epoch = ``epoch_base`` + Spark's batchId for this checkpoint.
        restarts: how many times the query was started again after a transient failure.
    """

    query: StreamingQuery
    sink_id: str
    epoch_base: int
    _batches: StreamBatches
    _first_epoch: int = 0
    _figures: list[EpochFigures] = field(default_factory=list)
    _read_at: float = 0.0
    _reader: MetaStore | None = None
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    restarts: int = 0
    _restart: Callable[[list[EpochFigures]], StreamingHandle] | None = None
    _policy: RestartPolicy = NO_RESTART
    _failures: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._figures = self._batches.figures

    @property
    def figures(self) -> list[EpochFigures]:
        """One :class:`EpochFigures` per micro-batch of this run, in order (the newest 1,000).

        Over Spark Connect, while the query runs, read from the meta store (at most once a
        second): the epochs the server's worker committed so far."""
        if self.remote and not self._closed and time.monotonic() - self._read_at >= 1.0:
            self._read_at = time.monotonic()
            settings = self._batches.settings
            try:
                if self._reader is None:
                    # A view: an unreachable store is logged at once, never waited for.
                    self._reader = MetaStore(settings.setup.metastore_url, retry_s=0)
                self._figures[:] = committed_figures(self._reader, settings, self._first_epoch)
            except Exception as exc:  # the figures are a view: never break the caller's loop
                log.warning("sink %s: cannot read its figures: %s", self.sink_id, exc)
        return self._figures

    @property
    def remote(self) -> bool:
        """Whether the micro-batches run on a Spark Connect server (not in this process)."""
        return self._batches.live is None

    @property
    def id(self) -> str:
        """The Spark streaming query's id (Spark keeps it in the checkpoint; never part of the
        sink's state)."""
        return str(self.query.id)

    @property
    def is_active(self) -> bool:
        """Whether the Spark streaming query is still running."""
        return bool(self.query.isActive)

    def committed_epochs(self) -> list[int]:
        """The epochs this handle's micro-batches wrote that are committed so far, in order
        (among the newest 1,000 micro-batches: ``figures``)."""
        return [f.epoch for f in self.figures if f.committed_at]

    def _finish(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        live = self._batches.live
        if live is None:  # Spark Connect: the server's worker is gone with the query
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            figures = finish_stream(self._batches.settings, self._first_epoch)
            self._figures[:] = figures
            return
        close_live(live)

    def stop(self) -> None:
        """Stop the query, then commit every checkpointed epoch before returning."""
        self.query.stop()
        self._finish()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (e.g. ``availableNow``); drain commits; re-raise errors.

        A failure that the restart policy retries starts the query again from its checkpoint
        and the wait goes on (within ``timeout``).

        Returns:
            True if the query ended within ``timeout``.

        Raises:
            EosinkError: the error that stopped the query when eosink raised it (over Spark
                Connect too); else Spark's ``StreamingQueryException``.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                done: bool | None
                if end is None:
                    done = self.query.awaitTermination() or True
                else:
                    left = max(0.0, end - time.monotonic())
                    done = self.query.awaitTermination(left)  # type: ignore[arg-type]
            except BaseException as exc:
                if self._stopped_by(exc):
                    continue
                raise
            if done:
                self._finish()
            return bool(done)

    def _stopped_by(self, exc: BaseException) -> bool:
        """The query stopped with ``exc``: finish what it left, then restart it (True) when
        the policy says so; else raise the error the user should see (False: ``exc``)."""
        live = self._batches.live
        if live is None and _still_running(self.query):
            return False  # e.g. KeyboardInterrupt: the server's query runs on; stop() ends it
        try:
            self._finish()
        except FencedError as fenced:  # another coordinator took the sink over: it finishes
            log.warning(
                "sink %s: the stopped stream leaves what it had to the coordinator that took "
                "the sink over (%s)",
                self.sink_id,
                " ".join(str(fenced).split()),
            )
        except Exception:
            log.exception("sink %s: finishing the stopped stream failed", self.sink_id)
        failed = live.committer.error if live is not None and live.committer is not None else None
        err = failed if failed is not None else eosink_error_of_stream(exc)
        if isinstance(exc, Exception) and self._restarted(failed or exc, err):
            return True
        if failed is not None:
            raise failed
        if err is not None:
            raise err from _spark_error(err, exc)
        return False

    def _restarted(self, failure: BaseException, err: BaseException | None) -> bool:
        """Apply the restart rules to ``failure``; start the query again if they say so."""
        if self._restart is None:
            return False
        now = time.monotonic()
        eosink_err = err if isinstance(err, EosinkError) else None
        verdict = stream_failure_verdict(failure, eosink_err)
        decision = restart_rule(verdict, self._failures, now, self._policy)
        shown = err if err is not None else failure
        what = f"{type(shown).__name__}: {str(shown).splitlines()[0] if str(shown) else ''}"
        if not decision.restart:
            if verdict.transient:
                log.error(
                    "sink %s: the streaming query failed (%s); not restarted: %s",
                    self.sink_id,
                    what,
                    decision.why,
                )
            return False
        self._failures.append(now)
        log.warning(
            "sink %s: the streaming query failed (%s), %s: restarting it from its checkpoint "
            "in %.1fs (restart %d; at most %d within %gs)",
            self.sink_id,
            what,
            decision.why,
            decision.delay_s,
            self.restarts + 1,
            self._policy.max_failures,
            self._policy.interval_s,
        )
        time.sleep(decision.delay_s)
        try:
            new = self._restart(self.figures)
        except Exception as again:
            log.warning("sink %s: the restart failed: %s", self.sink_id, again)
            if self._restarted(again, again if isinstance(again, EosinkError) else None):
                return True
            raise
        self.query, self.epoch_base, self._batches = new.query, new.epoch_base, new._batches
        self._closed = False
        self.restarts += 1
        _metrics.stream_restarted(
            self.sink_id, self._batches.settings.setup.plugin.name, verdict.why
        )
        log.warning(
            "sink %s: streaming query restarted (run %s, restart %d)",
            self.sink_id,
            self.query.runId,
            self.restarts,
        )
        return True

    def process_all_available(self, timeout: float = 300.0) -> None:
        """Block until the source's available data is processed and committed.

        Over Spark Connect the server's worker commits; this waits (up to ``timeout``
        seconds) until the meta store shows every checkpointed epoch committed. A failure
        that the restart policy retries starts the query again, and the wait goes on."""
        while True:
            try:
                self.query.processAllAvailable()
            except Exception as exc:
                if not _still_running(self.query):
                    if self._stopped_by(exc):
                        continue
                    raise  # _stopped_by raised the eosink error, if there was one
                err = eosink_error_of_stream(exc)
                if err is not None:
                    raise err from _spark_error(err, exc)
                raise
            break
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
