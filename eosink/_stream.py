"""The micro-batches of an ``eosink.run`` stream: the ``foreachBatch`` function.

:class:`StreamBatches` is the function Spark calls with each micro-batch. On a classic session
it runs in the driver's own Python, with the runtime this driver set the stream up with. Over
Spark Connect, Spark runs ``foreachBatch`` functions in a Python worker on the server: the
client pickles the function, so it holds only :class:`StreamSettings` (what the client's
set-up decided: the validated sink, the stream's lineage and epoch base), and the worker
builds its own runtime from them at the first micro-batch: it acquires the sink in the meta
store and claims the journal's next generation (fencing the client's set-up runtime), then
commits after Spark's checkpoint as a classic driver does. When the query ends, Spark stops
that worker; the client then finishes what the worker could not (:func:`finish_stream`):
the epochs Spark checkpointed but the worker did not commit yet, and the open files of
sinks whose files span epochs.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from . import _metrics
from ._checkpoint import CheckpointDir
from ._journal import Journal
from ._logs import default_logging
from ._metastore import COMMITTED, PENDING, MetaStore
from ._protocol import FIGURES_KEPT, AsyncCommitter, EpochFigures, SinkRuntime
from ._rules import discard_refused_micro_batch
from ._setup import SinkSetup, open_runtime
from ._write import Written, spark_write
from .errors import ConfigError, SinkIdentityError
from .faults import fault_point
from .sink import Rolling

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ._protocol import Epoch

log = logging.getLogger("eosink")

__all__ = [
    "StreamBatches",
    "StreamSettings",
    "close_live",
    "commit_written_micro_batch",
    "discard_refused",
    "finish_stream",
    "open_stream_batches",
    "wait_committed",
]


@dataclass(frozen=True)
class StreamSettings:
    """What a stream's ``foreachBatch`` function needs to build its runtime anywhere
    (picklable: Spark Connect ships it to the server).

    Attributes:
        setup: the validated sink.
        checkpoint: the checkpoint location (a local path over Spark Connect).
        lineage: the stream's lineage (its checkpoint's eosink marker).
        epoch_base: epoch = base + Spark's batchId.
        inline: commit inside the micro-batch (``commit_mode="inline"``).
        run_id: the ``eosink.run`` call's id, in the journal claims of its coordinators:
            how a Spark Connect client tells that a later run took the stream over.
        max_pending_epochs: backpressure: a micro-batch waits before writing while this many
            epochs wait for their commit (``commit_mode="after_checkpoint"``).
    """

    setup: SinkSetup
    checkpoint: str
    lineage: str
    epoch_base: int
    inline: bool
    run_id: str = ""
    max_pending_epochs: int = 8

    def check_shared(self) -> None:
        """Check that this process sees the checkpoint and the meta store the stream was set
        up with (a Spark Connect server's worker, which may be on another machine than the
        client): else nothing is written, and the error says what to give.

        Raises:
            ConfigError: another directory under the same path, or another meta store.
        """
        sid = self.setup.sink_id
        seen = CheckpointDir(None, self.checkpoint).read_lineage()
        if seen != self.lineage:
            raise ConfigError(
                f"sink {sid!r}: the Spark Connect server does not see the checkpoint the "
                f"client set up at {self.checkpoint!r} (lineage {seen!r} there, "
                f"{self.lineage!r} expected): client and server are on different machines. "
                "Over Spark Connect the checkpoint_location must be a path both open (a "
                "mounted file system), or run the client on the server's machine"
            )
        store = MetaStore(self.setup.metastore_url, retry_s=self.setup.metastore_retry_s)
        try:
            rec = store.sink(sid)
        finally:
            store.close()
        if rec is None or rec.lineage != self.lineage:
            raise ConfigError(
                f"sink {sid!r}: on the Spark Connect server, meta store "
                f"{store.url_redacted} has no record of this stream (the client set it up in "
                "a meta store of that name on its own machine). Over Spark Connect the client "
                "and the server must share one meta store: pass metastore_url= of a database "
                "both reach (e.g. postgresql+psycopg://...)"
            )

    def runtime(self) -> SinkRuntime:
        """A new coordinator of the stream: the sink acquired in the meta store, the
        journal's next generation claimed (every earlier coordinator is fenced)."""
        rt = open_runtime(self.setup, self.lineage)
        rt.run_id = self.run_id or None
        try:
            journal = Journal(CheckpointDir(None, self.checkpoint), self.setup.sink_id)
            rt.inline = self.inline
            rt.attach_stream(journal, self.epoch_base)
        except BaseException:
            rt.close()
            rt.store.close()
            raise
        return rt


def keep_figures(figures: list[EpochFigures], fig: EpochFigures) -> None:
    """Append a micro-batch's figures to a handle's list, which keeps the newest
    :data:`~eosink._protocol.FIGURES_KEPT` (trimmed in place, by a tenth at a time)."""
    figures.append(fig)
    if len(figures) > FIGURES_KEPT + FIGURES_KEPT // 10:
        del figures[: len(figures) - FIGURES_KEPT]


@dataclass
class _Live:
    """A stream's coordinator where its micro-batches run."""

    runtime: SinkRuntime
    committer: AsyncCommitter | None
    figures: list[EpochFigures]
    roller: RollTimer | None = None
    resumed: bool = False
    """Whether the held recovery ran (:meth:`SinkRuntime.resume_stream`, first micro-batch)."""
    write: Callable[[Any, Epoch], Written] = spark_write
    """How a micro-batch's data becomes the epoch's write results: Spark's tasks. (The
    Spark-less crash driver, tests/lifecycle_driver.py, runs the same writers in-process.)"""

    def stop_threads(self) -> None:
        """Stop the roller and close the committer (a query that failed to start: the
        caller closes the coordinator)."""
        if self.roller is not None:
            self.roller.stop()
        if self.committer is not None:
            self.committer.close()


class RollTimer:
    """Publishes a rolling sink's open files that are due by time (rollover, inactivity)
    between micro-batches, in a daemon thread."""

    def __init__(self, runtime: SinkRuntime) -> None:
        self.runtime = runtime
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"eosink-roll-{runtime.sink_id}", daemon=True
        )
        self._thread.start()

    @staticmethod
    def start_for(runtime: SinkRuntime) -> RollTimer | None:
        """A roller when the sink's files span epochs (:class:`~eosink.sink.Rolling`)."""
        return RollTimer(runtime) if runtime.caps.rolling else None

    def _loop(self) -> None:
        coord = cast(Rolling, self.runtime.coordinator)
        while not self._stop.is_set():
            wait = coord.next_roll_in()
            if wait is not None and wait <= 0:
                try:
                    self.runtime.roll(everything=False)
                except Exception:
                    log.exception(
                        "sink %s: rolling open files failed; retrying", self.runtime.sink_id
                    )
                    self._stop.wait(5.0)
                    continue
                wait = coord.next_roll_in()
            self._stop.wait(min(1.0, wait) if wait is not None else 1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class StreamBatches:
    """The ``foreachBatch`` function of an ``eosink.run`` stream (see the module).

    Pickling keeps :attr:`settings` only: the live state (runtime, committer) is this
    process's, and a worker that unpickles the function builds its own.
    """

    settings: StreamSettings
    live: _Live | None = None
    figures: list[EpochFigures] = field(default_factory=list)

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self.live = None
        self.figures = []

    def _open(self) -> _Live:
        """Build the runtime from the settings: the first micro-batch in a Spark Connect
        server's worker."""
        default_logging()  # the server's log
        s = self.settings
        s.check_shared()
        rt = s.runtime()
        ckpt = CheckpointDir(None, s.checkpoint)
        base = s.epoch_base
        committer = None if s.inline else AsyncCommitter(rt, lambda e: ckpt.has_commit(e - base))
        log.info(
            "sink %s: micro-batches run in this process (pid-side coordinator, epochs = %d + "
            "batchId)",
            s.setup.sink_id,
            base,
        )
        return _Live(rt, committer, self.figures, RollTimer.start_for(rt))

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        if self.live is None:
            self.live = self._open()
        live = self.live
        committer = live.committer
        runtime = live.runtime
        sid = runtime.sink_id
        if committer is not None:
            committer.raise_if_failed()
            committer.wake()
            limit = self.settings.max_pending_epochs

            def waiting(n: int) -> None:
                log.warning(
                    "sink %s: %d epochs wait for their commit (max_pending_epochs=%d): "
                    "micro-batch %d waits for a commit before writing",
                    sid,
                    n,
                    limit,
                    batch_id,
                )

            waited = committer.wait_for_room(limit, waiting)
            if waited:
                _metrics.backpressure(sid, runtime.plugin.name, waited)
                log.info(
                    "sink %s: micro-batch %d goes on after waiting %.1fs for commits",
                    sid,
                    batch_id,
                    waited,
                )
        if not live.resumed and not self.settings.inline:
            runtime.resume_stream(self.settings.epoch_base, batch_id)
            live.resumed = True
        ep = runtime.stream_epoch(self.settings.epoch_base + batch_id)
        if ep.recovered:
            return
        if ep.skipped:
            log.info(
                "sink %s epoch %d (batch %d): replay of a committed epoch; output discarded",
                sid,
                ep.epoch,
                batch_id,
            )
            keep_figures(live.figures, EpochFigures(ep.epoch, skipped=True))
            return
        w = live.write(batch_df, ep)
        fig = ep.prepare(w.results, w.rows, w.seconds, writer=w.writer, schema=w.schema)
        keep_figures(live.figures, fig)
        if committer is None:
            ep.commit()
        else:
            committer.submit(ep.epoch, ep.committable, fig)


def discard_refused(rt: SinkRuntime, epoch: int) -> None:
    """Delete what the tasks staged for ``epoch`` in a refused micro-batch, where
    :func:`~eosink._rules.discard_refused_micro_batch` says so (a micro-batch whose tasks
    wrote before its decision: ``format("eosink")``'s)."""
    if discard_refused_micro_batch(rt.status_of(epoch)):
        rt.discard(epoch)


def commit_written_micro_batch(rt: SinkRuntime, epoch: int, written: Callable[[], Written]) -> None:
    """The lifecycle of a micro-batch that Spark's tasks wrote before its decision
    (``format("eosink")``'s data source, at its commit): the decision (recovery first: this
    front end commits inline), then phase 1 and 2 of what ``written()`` says the tasks
    staged; a replay's output is discarded, a refused one's too.

    Raises:
        SinkIdentityError: another run took the epoch (the restart moves the query above
            it).
    """
    try:
        ep = rt.stream_epoch(epoch, inline=True)
    except SinkIdentityError:
        discard_refused(rt, epoch)
        raise
    if ep.skipped:
        log.info(
            "sink %s epoch %d: replay of a committed epoch; output discarded",
            rt.sink_id,
            epoch,
        )
        ep.discard()
        return
    w = written()
    ep.prepare(w.results, w.rows, w.seconds, writer=w.writer, schema=w.schema)
    ep.commit()
    # Files that span epochs: what is due by time (this front end has no stop hook: open
    # files roll at a later micro-batch).
    rt.roll(everything=False)


def open_stream_batches(
    runtime: SinkRuntime,
    setup: SinkSetup,
    ckpt: CheckpointDir,
    *,
    inline: bool,
    max_pending_epochs: int,
    figures: list[EpochFigures] | None = None,
) -> tuple[StreamBatches, int, int]:
    """The start of an ``eosink.run`` stream, in the protocol's order, on the coordinator
    ``runtime`` (opened, the sink acquired): the one place that orders it.

    Repairs the checkpoint's half-written log entries, opens the stream (its lineage, rules
    1-5 of a fresh or known checkpoint), starts recovery and rebases the epochs (rule 8);
    a stream that commits after Spark's checkpoint holds the decision on the epochs from the
    first batch not checkpointed until its first micro-batch
    (:meth:`SinkRuntime.resume_stream`), once Spark fixed it; inline mode finishes every
    PENDING epoch now (each holds complete data; the replayed batch is then skipped, rule 5).
    On a classic session the returned function runs its micro-batches on ``runtime`` (with an
    :class:`AsyncCommitter` unless ``inline``); over Spark Connect it holds only its settings.
    Fault point ``stream_before_start`` fires at the end: set up, no micro-batch run.

    Returns:
        The ``foreachBatch`` function, the epoch base (epoch = base + batchId) and the first
        epoch of this run (the first batch Spark has not checkpointed).
    """
    runtime.run_id = uuid.uuid4().hex
    ckpt.repair()  # temp files of a crash mid-write would fail Spark's start at batch 0
    base = runtime.start_stream(ckpt, setup.new_checkpoint, inline=inline)
    last = ckpt.last_committed_batch()
    first = base + (0 if last is None else last + 1)
    settings = StreamSettings(
        setup,
        ckpt.location,
        runtime.lineage,
        base,
        inline,
        runtime.run_id or "",
        max_pending_epochs=max_pending_epochs,
    )
    batches = StreamBatches(settings, figures=[] if figures is None else figures)
    fault_point("stream_before_start")  # before this process's threads start
    if not ckpt.connect:
        committer = None if inline else AsyncCommitter(runtime, lambda e: ckpt.has_commit(e - base))
        batches.live = _Live(runtime, committer, batches.figures, RollTimer.start_for(runtime))
    return batches, base, first


def close_live(live: _Live) -> None:
    """The end of a classic session's stream, once Spark's query ended: commit what Spark
    checkpointed (epochs it did not checkpoint stay PENDING: the next start aborts and
    rewrites them), publish the rows still in open files, close the coordinator."""
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
                    live.runtime.sink_id,
                    left,
                )
        live.runtime.roll(everything=True)  # a stopped stream leaves no rows waiting
    finally:
        if committer is not None:
            committer.close()
        live.runtime.close()
        live.runtime.store.close()


def finish_stream(settings: StreamSettings, first_epoch: int) -> list[EpochFigures]:
    """After a Spark Connect stream ended: commit what Spark checkpointed and roll open files.

    A new coordinator takes the sink over (fencing the server's worker, should it still run),
    commits the PENDING epochs whose micro-batch Spark checkpointed (all of them in inline
    mode, where PENDING means complete) and aborts the others (Spark replays their batches at
    the next start), then publishes the files still open. Returns the figures of the stream's
    committed epochs from ``first_epoch`` on (this run's), from the meta store.
    """
    ckpt = CheckpointDir(None, settings.checkpoint)
    newest = Journal(ckpt, settings.setup.sink_id).state()
    if settings.run_id and newest is not None and newest.get("run") != settings.run_id:
        # A later run of the stream (another client, on the same checkpoint) claimed it:
        # Spark stopped this run's query when that one started. It finishes; fencing it from
        # here would stop it.
        log.warning(
            "sink %s: a later run of this stream (journal generation %s, %s) took it over; "
            "this run's query ended and the later run commits what remains",
            settings.setup.sink_id,
            newest.get("generation"),
            newest.get("owner"),
        )
        return []
    rt = settings.runtime()
    try:
        last = ckpt.last_committed_batch()
        first = settings.epoch_base + (0 if last is None else last + 1)
        rt.recover(first_epoch=sys.maxsize if settings.inline else first)
        rt.roll(everything=True)
        return committed_figures(rt.store, settings, first_epoch)
    finally:
        rt.close()
        rt.store.close()


def committed_figures(
    store: MetaStore, settings: StreamSettings, first_epoch: int
) -> list[EpochFigures]:
    """The figures of the stream's COMMITTED epochs from ``first_epoch`` on (a run's), read
    from the meta store: what a Spark Connect client knows of the micro-batches its server's
    worker ran (no ``write_s``, ``persist_ms`` or ``writer``)."""
    return [
        EpochFigures(
            r.epoch,
            rows=r.rows,
            files=r.files,
            bytes=r.bytes,
            pre_commit_ms=r.pre_commit_ms or 0.0,
            commit_ms=r.commit_ms or 0.0,
            batch_end_at=r.batch_end_at or 0.0,
            committed_at=r.committed_at or 0.0,
        )
        for r in sorted(store.epochs(settings.setup.sink_id, (COMMITTED,)), key=lambda r: r.epoch)
        if r.origin == settings.lineage and r.epoch >= first_epoch
    ][-1000:]


def wait_committed(settings: StreamSettings, active: Callable[[], bool], timeout: float) -> None:
    """Wait until the server's worker committed every epoch Spark checkpointed (Spark
    Connect's ``process_all_available``): no PENDING epoch of the stream at or below the
    checkpoint's last batch. Returns early when the query is no longer ``active``.

    Raises:
        TimeoutError: still PENDING after ``timeout`` seconds.
    """
    ckpt = CheckpointDir(None, settings.checkpoint)
    store = MetaStore(settings.setup.metastore_url, retry_s=settings.setup.metastore_retry_s)
    end = time.monotonic() + timeout
    try:
        while True:
            last = ckpt.last_committed_batch()
            top = settings.epoch_base + (-1 if last is None else last)
            left = [
                r.epoch
                for r in store.epochs(settings.setup.sink_id, (PENDING,))
                if r.origin == settings.lineage and r.epoch <= top
            ]
            if not left or not active():
                return
            if time.monotonic() > end:
                raise TimeoutError(
                    f"sink {settings.setup.sink_id!r}: epochs {left} checkpointed by Spark "
                    f"are still PENDING after {timeout:.0f} s"
                )
            time.sleep(0.05)
    finally:
        store.close()
