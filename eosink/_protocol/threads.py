"""The runtime's threads: the heartbeat and the asynchronous committer of a stream."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .. import _metrics
from .._metastore import (
    HEARTBEAT_SECONDS,
    MetaStore,
)
from .figures import EpochFigures

log = logging.getLogger("eosink")


class Heartbeat:
    """Records in the sink's row, every :data:`HEARTBEAT_SECONDS`, that its coordinator
    runs (a daemon thread), and clears it on :meth:`stop`: ``eosink status`` and the
    operator commands tell a live owner on another host from a dead one by it. Fenced: a
    coordinator that lost the sink stops beating."""

    def __init__(self, store: MetaStore, sink_id: str, generation: int, kind: str = "") -> None:
        self.store = store
        self.sink_id = sink_id
        self.generation = generation
        self.kind = kind
        _metrics.heartbeat(sink_id, kind)  # acquiring the sink recorded one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="eosink-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if self.store.heartbeat(self.sink_id, self.generation):
                _metrics.heartbeat(self.sink_id, self.kind)
            else:
                log.debug("sink %s: heartbeat not recorded", self.sink_id)

    def stop(self, *, keep: bool = False) -> None:
        """Stop beating; clear the heartbeat (a coordinator that stopped cleanly), or with
        ``keep`` record a last one (its job runs on: a micro-batch's coordinator)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.store.heartbeat(self.sink_id, self.generation, stopped=not keep)


class _Committing(Protocol):
    """What the :class:`AsyncCommitter` uses of its :class:`~eosink._protocol.SinkRuntime`
    (typed so, not by the class, so that this module does not import the runtime's)."""

    sink_id: str

    def commit_epoch(self, epoch: int, committable: Any, fig: EpochFigures | None = None) -> None:
        """Phase 2 of ``epoch``."""


class AsyncCommitter:
    """Runs phase 2 off the batch's critical path, in epoch order.

    An epoch is committed once ``checkpointed(epoch)`` is true. :meth:`drain` returns when every
    checkpointed epoch is committed. A terminal failure is kept and re-raised by
    :meth:`raise_if_failed` (the runner then stops the query).
    """

    def __init__(
        self,
        runtime: _Committing,
        checkpointed: Callable[[int], bool],
        poll_s: float = 0.02,
    ) -> None:
        self.runtime = runtime
        self.checkpointed = checkpointed
        self.poll_s = poll_s
        self._q: queue.Queue[tuple[int, Any, EpochFigures]] = queue.Queue()
        self._head: tuple[int, Any, EpochFigures] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="eosink-committer", daemon=True)
        self._thread.start()

    def submit(self, epoch: int, committable: Any, fig: EpochFigures) -> None:
        self._q.put((epoch, committable, fig))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def outstanding(self) -> int:
        with self._lock:
            return self._outstanding_locked()

    def _outstanding_locked(self) -> int:
        """Epochs submitted and not committed yet; the caller holds ``_lock``."""
        return self._q.qsize() + (1 if self._head is not None else 0)

    def wait_for_room(self, limit: int, before: Callable[[int], None]) -> float:
        """Block until fewer than ``limit`` epochs wait for their commit (backpressure: a
        target that is down or slow must not let staged epochs pile up without end).

        ``before(n)`` is called once, with the number outstanding, if it has to wait.
        Returns the seconds waited. Raises the committer's error if a commit failed for good.
        """
        t0 = time.monotonic()
        n = self.outstanding()
        if n < limit or self.error is not None:
            self.raise_if_failed()
            return 0.0
        before(n)
        with self._lock:
            while self.error is None and self._outstanding_locked() >= limit:
                self._wake.set()
                self._idle.wait(0.05)
        self.raise_if_failed()
        return time.monotonic() - t0

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._head is None and not self._q.empty():
                    self._head = self._q.get_nowait()
                head = self._head
            if head is None or self.error is not None:
                with self._lock:
                    self._idle.notify_all()
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            epoch, committable, fig = head
            try:
                ready = self.checkpointed(epoch)
            except Exception:  # a checkpoint read hiccup: try again
                log.debug("checkpoint check failed", exc_info=True)
                ready = False
            if not ready:
                with self._lock:
                    self._idle.notify_all()
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            try:
                self.runtime.commit_epoch(epoch, committable, fig)
            except BaseException as exc:
                log.error(
                    "sink %s epoch %d: commit failed for good: %s", self.runtime.sink_id, epoch, exc
                )
                self.error = exc
            with self._lock:
                if self.error is None:
                    self._head = None
                self._idle.notify_all()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def drain(self, *, until_checkpointed: bool = True, timeout: float | None = None) -> None:
        """Wait until no checkpointed epoch is left uncommitted (or an error)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.error is None:
                head = self._head
                if head is None and self._q.empty():
                    break
                if until_checkpointed:
                    nxt = head[0] if head is not None else self._q.queue[0][0]
                    try:
                        if not self.checkpointed(nxt):
                            break
                    except Exception:
                        pass
                self._wake.set()
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._idle.wait(0.05 if left is None else min(0.05, left))
        self.raise_if_failed()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
