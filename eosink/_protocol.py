"""The two-phase protocol on the driver: recovery, phase 1, phase 2 (the template method).

The plugin implements only phase methods; every state transition happens here, through the
fenced :class:`~eosink._metastore.MetaStore`.
"""

from __future__ import annotations

import io
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from ._metastore import ABORTED, COMMITTED, PENDING, MetaStore
from .errors import EosinkError, FencedError
from .faults import fault_point
from .sink import SinkCommitCoordinator, SinkPlugin, StagedEpochs

log = logging.getLogger("eosink")

__all__ = ["EpochFigures", "SinkRuntime"]


@dataclass
class EpochFigures:
    """What happened to one epoch; exposed by handles and results, logged, sent to hooks."""

    epoch: int
    rows: int = 0
    files: int = 0
    bytes: int = 0
    write_s: float = 0.0
    pre_commit_ms: float = 0.0
    persist_ms: float = 0.0
    commit_ms: float = 0.0
    batch_end_at: float = 0.0
    committed_at: float = 0.0
    skipped: bool = False

    @property
    def visibility_lag_s(self) -> float:
        """Commit visible minus batch end."""
        return max(0.0, self.committed_at - self.batch_end_at) if self.committed_at else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["visibility_lag_s"] = self.visibility_lag_s
        return d


def schema_bytes(schema: pa.Schema) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue()


def schema_from_bytes(data: bytes) -> pa.Schema:
    return pa.ipc.open_stream(data).schema


@dataclass
class SinkRuntime:
    """One live coordinator of one sink_id, with its fencing generation.

    Args:
        plugin: the sink.
        options: validated options.
        sink_id: stable sink name.
        store: the meta store.
        gc_keep: committed rows kept per sink (older ones are garbage-collected).
    """

    plugin: SinkPlugin[Any, Any, Any]
    options: Any
    sink_id: str
    store: MetaStore
    gc_keep: int = 1000
    commit_retry_max_s: float = 30.0
    coordinator: SinkCommitCoordinator[Any, Any] = field(init=False)
    generation: int = field(init=False, default=0)
    figures: dict[int, EpochFigures] = field(init=False, default_factory=dict)
    _since_gc: int = field(init=False, default=0)

    def start(self) -> None:
        rec = self.store.acquire(self.sink_id, self.plugin.name, None)
        self.generation = rec.generation
        self.coordinator = self.plugin.coordinator_factory(self.options, self.sink_id)
        self.coordinator.init()
        log.info(
            "sink %s: coordinator started (plugin %s, generation %d, meta store %s)",
            self.sink_id,
            self.plugin.name,
            self.generation,
            self.store.url_redacted,
        )

    def close(self) -> None:
        try:
            self.coordinator.close()
        except Exception:  # pragma: no cover - close must not hide the real outcome
            log.exception("sink %s: coordinator close failed", self.sink_id)

    # -- recovery ------------------------------------------------------------------------
    def recover(self, first_epoch: int, keep_staged: frozenset[int] = frozenset()) -> None:
        """Apply the recovery rule before epoch ``first_epoch`` is pre-committed.

        PENDING epochs below ``first_epoch`` are checkpointed: commit them. PENDING epochs at
        or above it will be written again: abort them. Then finish every ABORTED epoch and
        discard data staged for epochs that have no committable (except ``keep_staged``:
        epochs being written right now).
        """
        t0 = time.perf_counter()
        pending = self.store.epochs(self.sink_id, (PENDING,))
        for rec in pending:
            if rec.epoch < first_epoch:
                log.info("sink %s: recovery commits checkpointed epoch %d", self.sink_id, rec.epoch)
                assert rec.committable is not None
                c = self.plugin.committable_codec.decode(rec.committable, rec.codec_version)
                fig = EpochFigures(
                    rec.epoch,
                    rec.rows,
                    rec.files,
                    rec.bytes,
                    batch_end_at=rec.batch_end_at or 0.0,
                    pre_commit_ms=rec.pre_commit_ms or 0.0,
                )
                self.commit_epoch(rec.epoch, c, fig)
            else:
                log.info(
                    "sink %s: recovery aborts epoch %d (not checkpointed; it will be written "
                    "again)",
                    self.sink_id,
                    rec.epoch,
                )
                self.store.mark_aborted(self.sink_id, self.generation, rec.epoch)
        for rec in self.store.epochs(self.sink_id, (ABORTED,)):
            c = (
                self.plugin.committable_codec.decode(rec.committable, rec.codec_version)
                if rec.committable is not None
                else None
            )
            if self._abort(rec.epoch, c):
                self.store.finish_abort(self.sink_id, self.generation, rec.epoch)
                log.info("sink %s epoch %d: ABORTED, staged data deleted", self.sink_id, rec.epoch)
        if isinstance(self.coordinator, StagedEpochs):
            live = {r.epoch for r in self.store.epochs(self.sink_id, (PENDING,))} | keep_staged
            for e in sorted(set(self.coordinator.staged_epochs()) - live):
                if self.is_committed(e):
                    continue  # visible data: never offered to abort
                log.info("sink %s: discarding data staged for epoch %d", self.sink_id, e)
                self._abort(e, None)
        log.info(
            "sink %s: recovery done before epoch %d in %.1f ms",
            self.sink_id,
            first_epoch,
            (time.perf_counter() - t0) * 1000,
        )

    def _abort(self, epoch: int, committable: Any) -> bool:
        """Call the plugin's abort; False (row stays ABORTED, retried next start) if it raised."""
        self.store.assert_live(self.sink_id, self.generation)
        try:
            self.coordinator.abort(epoch, committable)
            return True
        except Exception:
            log.exception(
                "sink %s: abort of epoch %d raised (a plugin contract violation); "
                "it is retried on the next start",
                self.sink_id,
                epoch,
            )
            return False

    # -- epochs --------------------------------------------------------------------------
    def is_committed(self, epoch: int) -> bool:
        """True when ``epoch`` is already visible (a replay): its new output is discarded."""
        rec = self.store.epoch(self.sink_id, epoch)
        if rec is not None:
            return rec.status == COMMITTED
        sink = self.store.sink(self.sink_id)
        # Committed rows older than the GC window are gone; the high-water mark remembers.
        return sink is not None and epoch <= sink.high_water

    def status_of(self, epoch: int) -> str | None:
        rec = self.store.epoch(self.sink_id, epoch)
        return None if rec is None else rec.status

    def add_columns(self, schema: pa.Schema) -> list[pa.Field]:
        """Fields of ``schema`` that the previous epoch's schema did not have; remembers it."""
        sink = self.store.sink(self.sink_id)
        prev = schema_from_bytes(sink.arrow_schema) if sink and sink.arrow_schema else None
        if prev is not None and prev.equals(schema):
            return []
        self.store.set_schema(self.sink_id, self.generation, schema_bytes(schema))
        if prev is None:
            return []
        return [f for f in schema if f.name not in prev.names]

    def pre_commit(
        self,
        epoch: int,
        results: Sequence[Any],
        add_columns: Sequence[pa.Field],
        *,
        rows: int,
        write_s: float,
    ) -> tuple[Any, EpochFigures]:
        """Phase 1: build the committable and persist PENDING."""
        fault_point("after_write_results")
        t0 = time.perf_counter()
        committable = self.coordinator.pre_commit(epoch, results, add_columns)
        data = self.plugin.committable_codec.encode(committable)
        fault_point("after_pre_commit")
        files, nbytes = _count_files(committable)
        batch_end = time.time()
        pre_ms = (time.perf_counter() - t0) * 1000
        self.store.persist_pending(
            self.sink_id,
            self.generation,
            epoch,
            data,
            self.plugin.committable_codec.version,
            rows=rows,
            files=files,
            nbytes=nbytes,
            batch_end_at=batch_end,
            pre_commit_ms=pre_ms,
        )
        fig = EpochFigures(
            epoch,
            rows,
            files,
            nbytes,
            write_s=write_s,
            pre_commit_ms=pre_ms,
            persist_ms=(time.perf_counter() - t0) * 1000 - pre_ms,
            batch_end_at=batch_end,
        )
        self.figures[epoch] = fig
        log.info(
            "sink %s epoch %d: PENDING (rows=%d files=%d bytes=%d write=%.3fs pre_commit=%.1fms "
            "persist=%.1fms)",
            self.sink_id,
            epoch,
            rows,
            files,
            nbytes,
            write_s,
            fig.pre_commit_ms,
            fig.persist_ms,
        )
        fault_point("after_persist")
        return committable, fig

    def commit_epoch(self, epoch: int, committable: Any, fig: EpochFigures | None = None) -> None:
        """Phase 2: commit (retried with backoff while transient) and mark COMMITTED."""
        fig = fig or self.figures.get(epoch) or EpochFigures(epoch)
        fault_point("before_commit")
        self.store.assert_live(self.sink_id, self.generation)
        t0 = time.perf_counter()
        delay = 0.05
        deadline = time.monotonic() + self.commit_retry_max_s
        while True:
            try:
                self.coordinator.commit(epoch, committable)
                break
            except FencedError:
                raise
            except EosinkError as exc:
                if not exc.transient or time.monotonic() > deadline:
                    raise
                log.warning(
                    "sink %s epoch %d: commit failed (%s); retrying in %.2fs",
                    self.sink_id,
                    epoch,
                    exc,
                    delay,
                )
            time.sleep(delay * (1 + random.random() * 0.2))
            delay = min(delay * 2, 5.0)
        fault_point("after_commit")
        fig.commit_ms = (time.perf_counter() - t0) * 1000
        self.store.mark_committed(self.sink_id, self.generation, epoch, commit_ms=fig.commit_ms)
        fig.committed_at = time.time()
        self.figures[epoch] = fig
        fault_point("after_mark_committed")
        log.info(
            "sink %s epoch %d: COMMITTED (rows=%d files=%d commit=%.1fms visibility_lag=%.3fs)",
            self.sink_id,
            epoch,
            fig.rows,
            fig.files,
            fig.commit_ms,
            fig.visibility_lag_s,
        )
        from .registry import plugin_manager

        plugin_manager().hook.eosink_epoch_committed(
            sink_id=self.sink_id, epoch=epoch, figures=fig.as_dict()
        )
        self._since_gc += 1
        if self._since_gc >= 100:
            self._since_gc = 0
            n = self.store.gc(self.sink_id, self.generation, self.gc_keep)
            if n:
                log.debug("sink %s: garbage-collected %d committed epochs", self.sink_id, n)


def _count_files(committable: Any) -> tuple[int, int]:
    """Best-effort file count and size from a committable with a ``files`` list."""
    files = committable.get("files") if isinstance(committable, dict) else None
    if not isinstance(files, list):
        return 0, 0
    return len(files), sum(int(f.get("bytes", 0)) for f in files if isinstance(f, dict))


class AsyncCommitter:
    """Runs phase 2 off the batch's critical path, in epoch order.

    An epoch is committed once ``checkpointed(epoch)`` is true. :meth:`drain` returns when every
    checkpointed epoch is committed. A terminal failure is kept and re-raised by
    :meth:`raise_if_failed` (the runner then stops the query).
    """

    def __init__(
        self,
        runtime: SinkRuntime,
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
            return self._q.qsize() + (1 if self._head is not None else 0)

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
