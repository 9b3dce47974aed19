"""The Spark runner: ``eosink.run`` for batch and streaming DataFrames."""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ._checkpoint import CheckpointDir
from ._metastore import COMMITTED, MetaStore, default_url, eosink_home
from ._protocol import FINISH, SKIP, AsyncCommitter, EpochFigures, SinkRuntime
from ._tasks import _task_fn
from .errors import ConfigError, EosinkError, SinkError
from .registry import get_sink
from .sink import SinkPlugin

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("eosink")

__all__ = ["BatchResult", "StreamingHandle", "run", "spark_session"]

CommitMode = Literal["after_checkpoint", "inline"]


# ---------------------------------------------------------------------------------------
# Spark session helper
# ---------------------------------------------------------------------------------------
def find_java() -> str:
    """Return JAVA_HOME for Spark, finding Java 17+ if JAVA_HOME is unset.

    Raises:
        EosinkError: no Java installation found, with how to install one.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return home
    java = shutil.which("java")
    if java:
        return os.path.dirname(os.path.dirname(os.path.realpath(java)))
    for cand in sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True):
        return os.path.dirname(os.path.dirname(cand))
    raise EosinkError(
        "Spark needs Java 17 or newer and none was found (no JAVA_HOME, no `java` on PATH). "
        "Install one, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME."
    )


SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
"""The log4j levels ``spark_session(log_level=...)`` and ``EOSINK_SPARK_LOG_LEVEL`` accept."""

_LOG4J2 = """\
# Written by eosink.spark_session(): Spark's own log level ({level}) from the JVM's start.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# pyspark's JVM starts as a shell: Spark takes this logger's level (WARN when it has none)
# for the console; the root's level keeps it from printing "Setting default log level to".
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
# Spark's own defaults for noisy third-party loggers.
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = {jetty}
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = {parquet}
"""


def _spark_log_level(log_level: str | None) -> tuple[str, bool]:
    """The log level Spark should start at, and whether the caller asked for it explicitly.

    Raises:
        ConfigError: not a log4j level.
    """
    given = log_level or os.environ.get("EOSINK_SPARK_LOG_LEVEL") or None
    level = (given or "ERROR").strip().upper()
    if level not in SPARK_LOG_LEVELS:
        src = "log_level" if log_level else "EOSINK_SPARK_LOG_LEVEL"
        raise ConfigError(
            f"{src}={given!r} is not a Spark log level; use one of {', '.join(SPARK_LOG_LEVELS)}"
        )
    return level, given is not None


def _own_log4j_config(conf: dict[str, str]) -> bool:
    """Whether the user configures Spark's log4j already (then eosink leaves it alone)."""
    if os.environ.get("LOG4J_CONFIGURATION_FILE"):
        return True
    opts = [os.environ.get("PYSPARK_SUBMIT_ARGS", ""), *conf.values()]
    if any("log4j2.configurationFile" in o for o in opts):
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    return bool(conf_dir and glob.glob(os.path.join(conf_dir, "log4j2*")))


def _log4j2_file(level: str) -> str | None:
    """A log4j2 properties file setting Spark's root level to ``level`` (under
    ``$EOSINK_HOME/spark``), or None when it cannot be written."""

    def quieter(floor: str) -> str:  # a noisy logger: never more verbose than ``floor``
        return SPARK_LOG_LEVELS[min(SPARK_LOG_LEVELS.index(level), SPARK_LOG_LEVELS.index(floor))]

    text = _LOG4J2.format(level=level, jetty=quieter("WARN"), parquet=quieter("ERROR"))
    path = str(eosink_home() / "spark" / f"log4j2-{level.lower()}.properties")
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("cannot write %s (%s): Spark's level is set once it runs", path, exc)
        return None
    return path


def spark_session(
    master: str = "local[2]",
    app_name: str = "eosink",
    *,
    log_level: str | None = None,
    **conf: str,
) -> SparkSession:
    """A SparkSession set up for eosink: Java found, executors on this Python, Arrow on.

    Spark's own log lines are quiet by default: its log level is ``ERROR`` from the JVM's
    first line on (a log4j2 configuration file under ``$EOSINK_HOME/spark`` handed to the JVM
    through ``LOG4J_CONFIGURATION_FILE``), so start-up warnings (hostname resolving to a
    loopback address, native-hadoop library, log4j profile...) are not printed. eosink's own
    logging (logger ``eosink``) is not affected. Your own log4j2 configuration wins: with
    ``LOG4J_CONFIGURATION_FILE``, ``-Dlog4j2.configurationFile`` in ``PYSPARK_SUBMIT_ARGS``
    or a Spark setting, or a ``log4j2*`` file in ``SPARK_CONF_DIR``, eosink does not change
    Spark's logging unless a level is asked for explicitly (then ``setLogLevel``).

    Args:
        master: Spark master URL (``local[2]``, ``spark://host:7077``...).
        app_name: application name.
        log_level: Spark's log level: ``OFF``, ``FATAL``, ``ERROR``, ``WARN``, ``INFO``,
            ``DEBUG``, ``TRACE`` or ``ALL`` (case-insensitive). Default: the environment
            variable ``EOSINK_SPARK_LOG_LEVEL``, else ``ERROR``. ``WARN`` brings back what
            pyspark prints by default. When a SparkContext is already running, an explicit
            level is applied with ``setLogLevel`` and the default leaves it alone.
        **conf: extra Spark settings (dots written as ``__``: ``spark__ui__enabled="false"``).

    Raises:
        ConfigError: ``log_level`` or ``EOSINK_SPARK_LOG_LEVEL`` is not a log level.
        EosinkError: no Java 17+ found.
    """
    level, explicit = _spark_log_level(log_level)
    os.environ["JAVA_HOME"] = find_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in conf.items():
        b = b.config(k.replace("__", "."), v)
    running = SparkContext._active_spark_context is not None
    own = running or _own_log4j_config(conf)
    config = None if own else _log4j2_file(level)
    if config:  # read by log4j in the JVM spark-submit starts (inherits this environment)
        os.environ["LOG4J_CONFIGURATION_FILE"] = config
    try:
        spark = b.getOrCreate()
    finally:
        if config:
            os.environ.pop("LOG4J_CONFIGURATION_FILE", None)
    if (explicit and own) or not (own or config):
        spark.sparkContext.setLogLevel(level)
    from ._datasource import register

    register(spark)
    return spark


def arrow_schema(df: DataFrame) -> pa.Schema:
    """The Arrow schema Spark's ``mapInArrow`` hands to writers for ``df``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    return to_arrow_schema(df.schema, timezone=tz)


# ---------------------------------------------------------------------------------------
# Writers in Spark tasks
# ---------------------------------------------------------------------------------------
_RESULT_SCHEMA = "result binary, rows long"


def write_epoch(
    df: DataFrame,
    plugin: SinkPlugin[Any, Any, Any],
    options: Any,
    sink_id: str,
    epoch: int,
    setup: Any = None,
) -> tuple[list[Any], int, float]:
    """Run the writers of ``epoch`` in Spark tasks; return (results, rows, seconds).

    Raises:
        SinkError: a writer failed (the message ends with the writer's own error).
    """
    t0 = time.perf_counter()
    try:
        # mapInArrow resolves each column as df[name], which reads "a.b" as field b of a
        # column a: hand it positional names and give writers the real ones back.
        names = df.columns
        fn = _task_fn(plugin, options, sink_id, epoch, setup, names)
        plain = df.toDF(*[f"_c{i}" for i in range(len(names))])
        out = plain.mapInArrow(fn, _RESULT_SCHEMA).collect()
    except Exception as exc:
        if isinstance(exc, EosinkError):
            raise
        raise SinkError(
            f"sink {sink_id} epoch {epoch}: writing failed in a Spark task: {_root_cause(exc)}"
        ) from exc
    codec = plugin.write_result_codec
    results = [codec.decode(bytes(r["result"]), codec.version) for r in out]
    return results, sum(int(r["rows"]) for r in out), time.perf_counter() - t0


def _root_cause(exc: BaseException) -> str:
    """The last ``SomethingError: message`` line of a Spark task failure, else its first line."""
    text = str(exc)
    found = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", text, re.M)
    causes = [c for c in found if not c.startswith(("PythonException", "Py4JJavaError"))]
    return causes[-1] if causes else text.strip().splitlines()[0][:300]


# ---------------------------------------------------------------------------------------
# Results and handles
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchResult:
    """What ``eosink.run`` returns for a batch DataFrame.

    Attributes:
        sink_id: the sink.
        epoch: the epoch written.
        rows: rows written in this call (0 when skipped).
        files: files (or other units) the committable published.
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

    def _finish(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
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


# ---------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------
def run(
    df: DataFrame,
    sink: str,
    *,
    sink_id: str | None = None,
    metastore_url: str | None = None,
    checkpoint_location: str | None = None,
    trigger: dict[str, Any] | None = None,
    epoch: int | None = None,
    commit_mode: CommitMode = "after_checkpoint",
    new_checkpoint: Literal["refuse", "continue"] = "refuse",
    query_name: str | None = None,
    metastore_retry_s: float = 60.0,
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
            ``{"once": True}``. Default: as fast as possible.
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
    plugin = get_sink(sink)
    plugin.check_ready()  # a missing extra: MissingExtraError with its pip install, first
    options = plugin.parse_options(sink_options)
    if commit_mode not in ("after_checkpoint", "inline"):
        raise ConfigError(
            f"commit_mode must be 'after_checkpoint' or 'inline', not {commit_mode!r}"
        )
    if new_checkpoint not in ("refuse", "continue"):
        raise ConfigError(f"new_checkpoint must be 'refuse' or 'continue', not {new_checkpoint!r}")
    if not metastore_retry_s >= 0:
        raise ConfigError(f"metastore_retry_s must be >= 0, not {metastore_retry_s!r}")
    schema = arrow_schema(df)
    if plugin.validate_schema is not None:
        plugin.validate_schema(options, schema)
    sid = sink_id or plugin.default_sink_id(options)
    streaming = bool(df.isStreaming)
    if streaming:
        if epoch is not None:
            raise ConfigError("epoch= is for batch DataFrames; a stream's epoch is its batchId")
        if not checkpoint_location:
            raise ConfigError(
                "checkpoint_location is required for a streaming DataFrame: it is how Spark "
                "and eosink resume after a crash"
            )
    else:
        if trigger is not None or checkpoint_location is not None:
            raise ConfigError("trigger and checkpoint_location are for streaming DataFrames")
        if epoch is not None and epoch < 0:
            raise ConfigError(f"epoch must be >= 0, not {epoch}")
    store = MetaStore(
        metastore_url or default_url(checkpoint_location if streaming else None),
        retry_s=metastore_retry_s,
    )
    runtime = SinkRuntime(plugin, options, sid, store)
    try:
        runtime.start()
        if not streaming:
            try:
                return _run_batch(df, runtime, schema, epoch)
            finally:
                runtime.close()
                store.close()
        return _start_stream(
            df,
            runtime,
            schema,
            checkpoint_location or "",
            trigger,
            commit_mode,
            new_checkpoint,
            query_name,
        )
    except BaseException:
        if streaming:
            store.close()
        raise


def _run_batch(
    df: DataFrame, runtime: SinkRuntime, schema: pa.Schema, epoch: int | None
) -> BatchResult:
    sid = runtime.sink_id
    decision, e = runtime.batch_decision(epoch)
    if decision == SKIP:
        log.info("sink %s epoch %d: already committed; nothing to do", sid, e)
        return BatchResult(sid, e, 0, 0, committed=True, skipped=True)
    if decision == FINISH:
        # A crashed run persisted this epoch's committable: its data is complete. Finish it.
        runtime.recover(first_epoch=e + 1)
        rec = runtime.store.epoch(sid, e)
        assert rec is not None and rec.status == COMMITTED
        return BatchResult(
            sid,
            e,
            rec.rows,
            rec.files,
            committed=True,
            recovered=True,
            figures=runtime.figures.get(e),
        )
    runtime.recover(first_epoch=e)
    log.info("sink %s epoch %d: writing batch DataFrame", sid, e)
    results, rows, secs = _write_or_discard(df, runtime, e)
    committable, fig = runtime.pre_commit(
        e, results, runtime.add_columns(schema), rows=rows, write_s=secs
    )
    # A batch job has no Spark checkpoint: the durable PENDING row plays that role.
    runtime.commit_epoch(e, committable, fig)
    return BatchResult(sid, e, rows, fig.files, committed=True, figures=fig)


def _write_or_discard(
    df: DataFrame, runtime: SinkRuntime, epoch: int
) -> tuple[list[Any], int, float]:
    """Run the writers; if any fails, discard what the others staged, then re-raise."""
    setup = runtime.coordinator.writer_setup(arrow_schema(df))
    try:
        return write_epoch(df, runtime.plugin, runtime.options, runtime.sink_id, epoch, setup)
    except BaseException:
        runtime.discard(epoch)
        raise


def _start_stream(
    df: DataFrame,
    runtime: SinkRuntime,
    schema: pa.Schema,
    checkpoint_location: str,
    trigger: dict[str, Any] | None,
    commit_mode: str,
    new_checkpoint: str,
    query_name: str | None,
) -> StreamingHandle:
    spark = df.sparkSession
    ckpt = CheckpointDir(spark, checkpoint_location)
    ckpt.repair()  # temp files of a crash mid-write would fail Spark's start at batch 0
    base = runtime.open_stream(ckpt, new_checkpoint)
    last = ckpt.last_committed_batch()
    first = base + (0 if last is None else last + 1)
    # Inline mode may have crashed in the middle of a commit: every PENDING epoch holds
    # complete data, so finish them all; the replayed batch is then skipped (rule 4).
    runtime.recover(first_epoch=sys.maxsize if commit_mode == "inline" else first)
    base = runtime.rebase_stream(ckpt, base)
    sid = runtime.sink_id

    committer = (
        AsyncCommitter(runtime, lambda e: ckpt.has_commit(e - base))
        if commit_mode == "after_checkpoint"
        else None
    )
    handle_box: list[StreamingHandle] = []
    state = {"schema": schema}

    def process_batch(batch_df: DataFrame, batch_id: int) -> None:
        if committer is not None:
            committer.raise_if_failed()
            committer.wake()
        e = base + batch_id
        handle = handle_box[0]
        decision = runtime.stream_decision(e)
        if decision == SKIP:
            log.info(
                "sink %s epoch %d (batch %d): replay of a committed epoch; output discarded",
                sid,
                e,
                batch_id,
            )
            handle.figures.append(EpochFigures(e, skipped=True))
            return
        if decision == FINISH:
            runtime.finish(e)
            return
        bschema = arrow_schema(batch_df)
        add = runtime.add_columns(bschema) if not bschema.equals(state["schema"]) else []
        state["schema"] = bschema
        results, rows, secs = _write_or_discard(batch_df, runtime, e)
        committable, fig = runtime.pre_commit(e, results, add, rows=rows, write_s=secs)
        handle.figures.append(fig)
        if committer is None:
            runtime.commit_epoch(e, committable, fig)
        else:
            committer.submit(e, committable, fig)

    runtime.add_columns(schema)
    writer = df.writeStream.foreachBatch(process_batch).option(
        "checkpointLocation", checkpoint_location
    )
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    try:
        query = writer.start()
    except BaseException:
        if committer is not None:
            committer.close()
        raise
    handle = StreamingHandle(query, sid, runtime, committer, base)
    handle_box.append(handle)
    log.info(
        "sink %s: streaming query %s started (epochs = %d + batchId, commit_mode=%s)",
        sid,
        query.id,
        base,
        commit_mode,
    )
    return handle
