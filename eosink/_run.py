"""``eosink.run``: the batch and streaming flows of the first front end.

The other front end is ``format("eosink")`` (``eosink/_datasource.py``); both drive epochs
through :class:`~eosink._protocol.Epoch`.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import TYPE_CHECKING, Any, Literal

from . import _spark_version
from ._arrow_schema import arrow_schema
from ._batch import run_batch
from ._checkpoint import CheckpointDir
from ._handles import BatchResult, StreamingHandle
from ._logs import default_logging
from ._metastore import MetaStore
from ._protocol import EpochFigures, SinkRuntime
from ._restart import RestartPolicy
from ._setup import SinkSetup, open_runtime, prepare_sink
from ._staging import spark_master
from ._stream import open_stream_batches
from ._write import write_or_discard
from .errors import ConfigError
from .registry import get_sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("eosink")

__all__ = ["CommitMode", "run", "run_batch"]

CommitMode = Literal["after_checkpoint", "inline"]
DEFAULT_RESTART = RestartPolicy()


def run(
    df: DataFrame,
    sink: str,
    *,
    sink_id: str | None = None,
    metastore_url: str | None = None,
    checkpoint_location: str | None = None,
    trigger: dict[str, Any] | str | None = None,
    epoch: int | None = None,
    commit_mode: CommitMode = "after_checkpoint",
    new_checkpoint: Literal["refuse", "continue"] = "refuse",
    query_name: str | None = None,
    metastore_retry_s: float = 60.0,
    max_pending_epochs: int = 8,
    restart: RestartPolicy | None = DEFAULT_RESTART,
    **sink_options: Any,
) -> BatchResult | StreamingHandle:
    """Write ``df`` to a sink exactly once.

    Args:
        df: a batch or streaming DataFrame.
        sink: the sink name (``eosink plugins`` lists them).
        sink_id: stable name of this logical sink; keys all persisted state. Default derived
            from the sink and its target (e.g. ``file:/data/out``). Never a Spark query id.
        metastore_url: SQLAlchemy URL of the meta store. Default ``EOSINK_METASTORE_URL``,
            else ``$EOSINK_HOME/metastore.db`` (``~/.eosink``): one store for the batch and
            streaming runs of a sink. An in-memory SQLite URL is refused.
        checkpoint_location: streaming only, required: Spark's checkpoint directory.
        trigger: streaming only: ``{"processingTime": "5 seconds"}``, ``{"availableNow": True}``,
            ``{"once": True}``, or the same as a string: ``"5 seconds"``, ``"availableNow"``,
            ``"once"``. Default: as fast as possible.
        epoch: batch only: the epoch to write. A re-run of an epoch that a batch run
            committed is a no-op (idempotent batch jobs); an epoch never written is written,
            also below the newest one (a backfill). An epoch that a streaming query of the
            sink used, or that eosink cannot tell about, is refused
            (:class:`SinkIdentityError`). Default: the next free epoch.
        commit_mode: ``after_checkpoint`` (default: phase 2 runs after Spark's checkpoint, off
            the batch's critical path) or ``inline`` (commit inside the batch, after
            persisting; lower visibility lag, longer batches).
        new_checkpoint: streaming: what to do when ``checkpoint_location`` is new but the sink
            already has committed epochs: ``refuse`` (default, raises
            :class:`NewCheckpointError`) or ``continue`` on a new epoch range.
        query_name: streaming query name.
        metastore_retry_s: how long an unreachable meta store is retried (backoff up to 5 s)
            before the run fails with :class:`MetaStoreUnavailableError`.
        max_pending_epochs: streaming, ``commit_mode="after_checkpoint"``: backpressure.
            While this many epochs are written but not yet committed (a target that is down,
            or slower than the stream), the next micro-batch waits for a commit before it
            writes, instead of staging more data. Logged, and counted in the
            ``eosink.backpressure.time`` metric. Default 8.
        restart: streaming: how a query that failed on a transient error (a Python worker
            that did not start, a lost executor, a meta store or target that went away) is
            started again from its checkpoint, while you wait on the handle
            (``await_termination``, ``process_all_available``). Default
            ``RestartPolicy()``: at most 3 restarts within 10 minutes, after 5 s, 10 s,
            20 s. ``None``: never. Errors a restart cannot fix are never retried.
        **sink_options: the sink's options, validated by its pydantic model before any job.

    Returns:
        :class:`BatchResult` for a batch DataFrame, :class:`StreamingHandle` for a streaming one.

    Raises:
        UnknownSinkError, ConfigError, SchemaMismatchError: before any job starts.
        MissingExtraError: a ``ConfigError``: the sink's extra is not installed (it names
            the ``pip install`` to run); before Spark is touched.
        SinkIdentityError: the sink_id, its target and the meta store disagree (before
            anything is written).
        UnfinishedRunError: batch without ``epoch``: an earlier run without one crashed
            with its data complete; that epoch is committed now and this run not written.
        MetaStoreUnavailableError: the meta store cannot be reached (nothing is published).
    """
    default_logging()
    get_sink(sink).check_ready()  # a missing extra first: before Spark is touched
    if commit_mode not in ("after_checkpoint", "inline"):
        raise ConfigError(
            f"commit_mode must be 'after_checkpoint' or 'inline', not {commit_mode!r}"
        )
    if restart is not None and not isinstance(restart, RestartPolicy):
        raise ConfigError(f"restart must be an eosink.RestartPolicy(...) or None, not {restart!r}")
    if isinstance(max_pending_epochs, bool) or not isinstance(max_pending_epochs, int):
        raise ConfigError(
            f"max_pending_epochs must be a whole number >= 1, not {max_pending_epochs!r}"
        )
    if max_pending_epochs < 1:
        raise ConfigError(
            f"max_pending_epochs must be >= 1 (1: each micro-batch waits for the commit of "
            f"the one before), not {max_pending_epochs}"
        )
    streaming = bool(df.isStreaming)
    spark = df.sparkSession
    _spark_version.check_connectors(spark)
    ckpt: CheckpointDir | None = None
    if streaming:
        if not checkpoint_location:
            raise ConfigError(
                "checkpoint_location is required for a streaming DataFrame: it is how Spark "
                "and eosink resume after a crash"
            )
        trigger = _trigger(trigger)
        # Where Spark puts the checkpoint: a path without a scheme is on the cluster's
        # default file system (HDFS on YARN), which is where eosink's journal and a sink's
        # default staging go too. Over Spark Connect: a path this client and the server
        # can both open.
        ckpt = CheckpointDir(spark, checkpoint_location)
    elif trigger is not None or checkpoint_location is not None:
        raise ConfigError("trigger and checkpoint_location are for streaming DataFrames")
    schema = arrow_schema(df)
    setup = prepare_sink(
        sink,
        sink_options,
        streaming=streaming,
        sink_id=sink_id,
        metastore_url=metastore_url,
        metastore_retry_s=metastore_retry_s,
        epoch=epoch,
        new_checkpoint=new_checkpoint,
        schema=schema,
        checkpoint_location=ckpt.location if ckpt is not None else None,
        master=lambda: spark_master(spark),
    )
    if not streaming:
        runtime = open_runtime(setup)
        try:
            _warn_if_unfenced(df, runtime.store, setup.sink_id)
            write = functools.partial(write_or_discard, df, schema=schema)
            return run_batch(runtime, setup.epoch, write)
        finally:
            runtime.close()
            runtime.store.close()
    stream_ckpt = ckpt
    assert stream_ckpt is not None

    def start(figures: list[EpochFigures] | None = None) -> StreamingHandle:
        """A new coordinator and the query started on it: the first start, and each restart
        (which keeps the handle's ``figures``)."""
        runtime = open_runtime(setup)
        try:
            return _start_stream(
                df,
                runtime,
                setup,
                stream_ckpt,
                trigger,
                commit_mode,
                query_name,
                max_pending_epochs,
                figures,
            )
        except BaseException:
            runtime.close()
            runtime.store.close()
            raise

    handle = start()
    if restart is not None and restart.max_failures > 0:
        handle._restart, handle._policy = start, restart
    return handle


def _start_stream(
    df: DataFrame,
    runtime: SinkRuntime,
    setup: SinkSetup,
    ckpt: CheckpointDir,
    trigger: dict[str, Any] | str | None,
    commit_mode: str,
    query_name: str | None,
    max_pending_epochs: int,
    figures: list[EpochFigures] | None = None,
) -> StreamingHandle:
    inline = commit_mode == "inline"
    batches, base, first = open_stream_batches(
        runtime,
        setup,
        ckpt,
        inline=inline,
        max_pending_epochs=max_pending_epochs,
        figures=figures,
    )
    sid = runtime.sink_id
    if ckpt.connect:
        # Spark Connect: the micro-batches run in the server's Python worker, which builds
        # its own coordinator from the settings (and fences this one).
        runtime.close()
        runtime.store.close()

    df = _observed_for_progress(df, connect=ckpt.connect)
    writer = df.writeStream.foreachBatch(batches).option("checkpointLocation", ckpt.spark_location)
    if isinstance(trigger, dict) and trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    try:
        query = writer.start()
    except BaseException:
        if batches.live is not None:
            batches.live.stop_threads()
        raise
    if ckpt.connect:
        runtime.close()
        runtime.store.close()
    handle = StreamingHandle(query, sid, base, batches, _first_epoch=first)
    log.info(
        "sink %s: streaming query %s started (epochs = %d + batchId, commit_mode=%s%s)",
        sid,
        query.id,
        base,
        commit_mode,
        ", micro-batches on the Spark Connect server" if ckpt.connect else "",
    )
    return handle


PROGRESS_METRICS = "eosink"
"""The name of the observed metrics an ``eosink.run`` stream adds to Spark's progress."""


def _observed_for_progress(df: DataFrame, *, connect: bool) -> DataFrame:
    """``df`` observed as :data:`PROGRESS_METRICS`: each micro-batch's rows handed to the
    sink appear in Spark's ``StreamingQueryProgress.observedMetrics`` (``{"eosink":
    Row(rows=N)}``; the Spark UI and ``query.lastProgress`` show it), for users who only look
    at Spark. A stateless aggregate at the top of the plan: checkpoints of earlier runs
    without it resume. Bytes and the commit's figures are not known when Spark reports the
    micro-batch (they are in eosink's metrics and the handle's figures). Spark Connect 3.5
    has no ``observe``, and a query that observes a metric of that name itself keeps its own:
    there the stream runs without it (logged)."""
    if connect and not _spark_version.CONNECT_OBSERVATION:
        return df
    from pyspark.sql import functions as F

    try:
        observed = df.observe(PROGRESS_METRICS, F.count(F.lit(1)).alias("rows"))
        if connect:
            observed.schema  # noqa: B018 -- analysed now, as a classic session does at once
        return observed
    except Exception as exc:  # never let a progress figure stop a stream
        # e.g. DUPLICATED_METRICS_NAME: the query observes a metric of this name itself
        log.info(
            "the stream's rows are not added to Spark's progress as observed metrics %r: %s",
            PROGRESS_METRICS,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return df


# One or more "<number> <unit>" pairs, as Spark's interval strings ("5 seconds",
# "1 minute 30 seconds", "interval 2 hours"): Spark parses the units; this refuses what cannot
# be an interval before anything is written (pyspark would refuse it only at start()).
_INTERVAL = re.compile(r"(?i)\s*(interval\s+)?(\d+(\.\d+)?\s*[a-z]+\s*)+")


def _trigger(trigger: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """``trigger=`` as the keyword arguments of Spark's ``DataStreamWriter.trigger``.

    Raises:
        ConfigError: not one of the triggers eosink runs, or a value Spark would refuse.
    """
    if trigger is None:
        return None
    if isinstance(trigger, str):
        word = trigger.strip()
        if word.lower() in ("availablenow", "available_now"):
            return {"availableNow": True}
        if word.lower() == "once":
            return {"once": True}
        if word and word[0].isdigit() and _INTERVAL.fullmatch(word):
            return {"processingTime": word}
    elif isinstance(trigger, dict) and len(trigger) == 1:
        ((key, value),) = trigger.items()
        if key in ("availableNow", "once") and value is True:
            return trigger
        if key == "processingTime" and isinstance(value, str) and _INTERVAL.fullmatch(value):
            return trigger
        if key == "continuous":
            raise ConfigError(
                "trigger={'continuous': ...}: Spark's continuous processing has no micro-"
                "batches, and eosink commits per micro-batch; use {'processingTime': "
                "'1 second'} for low latency"
            )
    raise ConfigError(
        f"trigger={trigger!r} is not a trigger; use {{'processingTime': '5 seconds'}} (or "
        "'5 seconds'), {'availableNow': True} (or 'availableNow'), {'once': True} (or 'once')"
    )


def _warn_if_unfenced(df: DataFrame, store: MetaStore, sink_id: str) -> None:
    """A batch run on a cluster with a meta store on the driver's own disk: say what it
    cannot do (streams have their checkpoint's journal; a batch run has none)."""
    if store.engine.dialect.name != "sqlite":
        return
    master = spark_master(df.sparkSession) or "local"
    if master.startswith("local"):
        return
    log.warning(
        "sink %s: a batch run on a cluster (master %s) with the meta store %s, a SQLite file "
        "on this driver's disk: a driver of this sink on another machine does not see it, so "
        "two drivers at once do not fence each other, and a re-run elsewhere knows only what "
        "the target records (the file sink's batch journal). Give every driver one shared "
        "meta store: metastore_url='postgresql+psycopg://...' (pip install 'eosink[postgres]')",
        sink_id,
        master,
        store.url_redacted,
    )
