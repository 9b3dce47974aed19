"""Writing one epoch's DataFrame: Python writers in Spark tasks, or the native path.

* Python writers: ``mapInArrow`` runs one :class:`~eosink.sink.CoordinatedSinkWriter` per
  Spark partition (``eosink/_tasks.py``); every row crosses from the JVM into Python.
* The native path: a coordinator that is a :class:`~eosink.sink.SparkWriter` stages the epoch
  with Spark's own ``DataFrameWriter`` on the driver; the rows never leave the JVM.

Both give the same write results to ``pre_commit``; the protocol does not know which ran.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from . import _spark_version
from ._arrow_schema import arrow_schema
from ._spark_errors import _eosink_error_in, _note, _root_cause, _without_sqlstate
from ._staging import is_connect
from ._tasks import TaskSink, _task_fn
from .errors import EosinkError, SinkError
from .faults import fault_point
from .sink import Capabilities, SinkCommitCoordinator, SparkWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ._protocol.epoch import Epoch
    from ._protocol.phases import _Phases

log = logging.getLogger("eosink")

__all__ = ["Written", "spark_write", "write_epoch", "write_or_discard", "writer_kind"]

_RESULT_SCHEMA = "result binary, rows long"
_told: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Written:
    """What writing an epoch gave: the write results, rows, seconds, which path ran, and the
    Arrow schema it was written with (persisted in the epoch's spec)."""

    results: list[Any]
    rows: int
    seconds: float
    writer: str  # "spark" (native path) or "python"
    schema: pa.Schema | None = None


def writer_kind(
    coordinator: SinkCommitCoordinator[Any, Any],
    schema: pa.Schema,
    caps: Capabilities,
    connect: bool = False,
) -> str:
    """``spark`` when the coordinator (whose capabilities are ``caps``) stages DataFrames of
    ``schema`` with Spark's writers, else ``python`` (logged once per sink and reason when the
    coordinator could but declines, or the session cannot: ``connect``, a Spark Connect
    session, on a Spark without Connect's ``Observation``)."""
    if not caps.spark_writer:
        return "python"
    why = cast(SparkWriter[Any], coordinator).spark_write_unsupported(schema)
    if why is None and connect and not _spark_version.CONNECT_OBSERVATION:
        why = (
            f"Spark Connect on pyspark {_spark_version.PYSPARK[0]}.{_spark_version.PYSPARK[1]} "
            "has no Observation, which Spark's writers count an epoch's rows with"
        )
    if why is None:
        return "spark"
    key = (str(id(coordinator)), why)
    if key not in _told:
        _told.add(key)
        log.info("eosink: Python writers for this sink, not Spark's: %s", why)
    return "python"


def write_or_discard(df: DataFrame, ep: Epoch, schema: pa.Schema) -> Written:
    """Write ``ep`` (its ``writer_setup`` first, then :func:`write_epoch`); if any writer
    fails, discard what the others staged, then re-raise. What a batch run's and a
    micro-batch's lifecycle hand their epoch to."""
    setup = ep.setup(schema)
    try:
        return write_epoch(df, ep.runtime, ep.epoch, setup, schema)
    except BaseException:
        ep.discard()
        raise


def spark_write(df: DataFrame, ep: Epoch) -> Written:
    """A micro-batch's epoch written by Spark's tasks (:func:`write_or_discard`)."""
    return write_or_discard(df, ep, arrow_schema(df))


def write_epoch(
    df: DataFrame, runtime: _Phases, epoch: int, setup: Any, schema: pa.Schema | None = None
) -> Written:
    """Write ``epoch``'s rows (staged, invisible) on the path ``runtime``'s sink takes for
    ``df``: the native path when its capabilities say ``spark_writer`` and its coordinator
    takes ``df``'s schema, else Python writers in Spark tasks, each given the one
    :class:`~eosink._tasks.TaskSink` value (plugin, options, sink id, epoch, ``setup``).

    ``schema``: ``df``'s Arrow schema when the caller has it already (else derived).

    Raises:
        SinkError: writing failed (the message ends with the writer's or Spark's own error).
    """
    coordinator, sink_id = runtime.coordinator, runtime.sink_id
    sink = TaskSink(runtime.plugin, runtime.options, sink_id, epoch, setup)
    schema = schema if schema is not None else arrow_schema(df)
    kind = writer_kind(coordinator, schema, runtime.caps, is_connect(df.sparkSession))
    t0 = time.perf_counter()
    tag = _tag_jobs(df.sparkSession)
    try:
        if kind == "spark":
            native = cast(SparkWriter[Any], coordinator)
            results, rows = _write_native(df, native, sink_id, epoch, setup)
        else:
            results, rows = _write_python(df, sink)
    except Exception as exc:
        # Spark fails the job as soon as one task fails, while other tasks of it may still
        # be writing: the caller's abort must not run before they stopped, or what they
        # stage after it is left behind (until the sink's next write sweeps it, rule 4).
        _wait_for_tasks(df.sparkSession, tag, sink_id, epoch)
        if isinstance(exc, EosinkError):
            raise
        raised = task_eosink_error(exc, f"(sink {sink_id} epoch {epoch}: raised in a Spark task)")
        if raised is not None:  # a writer's own error (a value it refuses...): itself
            raise raised from exc
        where = "Spark's writer" if kind == "spark" else "a Spark task"
        raise SinkError(
            f"sink {sink_id} epoch {epoch}: writing failed in {where}: {_root_cause(exc)}"
        ) from exc
    finally:
        _untag_jobs(df.sparkSession, tag)
    return Written(results, rows, time.perf_counter() - t0, kind, schema)


#: How long a failed write waits for the other tasks of its Spark jobs to stop.
TASKS_STOP_TIMEOUT = 60.0


def _tag_jobs(spark: Any) -> str | None:
    """Tag the Spark jobs this thread starts with a fresh tag (classic sessions; None over
    Spark Connect, where this process cannot see the server's tasks)."""
    if is_connect(spark):
        return None
    tag = f"eosink-write-{uuid.uuid4().hex}"
    try:
        spark.sparkContext.addJobTag(tag)
    except Exception:  # a session that cannot tag jobs: no wait on failure
        return None
    return tag


def _untag_jobs(spark: Any, tag: str | None) -> None:
    if tag is not None:
        try:
            spark.sparkContext.removeJobTag(tag)
        except Exception:  # the session is gone: nothing to untag
            pass


def _active_tasks(spark: Any, tag: str) -> int:
    """Tasks still running in the Spark jobs tagged ``tag`` (killed ones count until their
    end reaches the driver)."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    active = 0
    for job_id in tracker.getJobIdsForTag(tag):
        job = tracker.getJobInfo(job_id)
        if job.isEmpty():
            continue
        for stage_id in job.get().stageIds():
            stage = tracker.getStageInfo(stage_id)
            if not stage.isEmpty():
                active += int(stage.get().numActiveTasks())
    return active


def _wait_for_tasks(spark: Any, tag: str | None, sink_id: str, epoch: int) -> None:
    """Return when no task of the jobs tagged ``tag`` runs any more (at most
    :data:`TASKS_STOP_TIMEOUT` seconds; then the failure goes on with a warning)."""
    if tag is None:
        return
    deadline = time.monotonic() + TASKS_STOP_TIMEOUT
    try:
        while (active := _active_tasks(spark, tag)) > 0:
            if time.monotonic() > deadline:
                log.warning(
                    "eosink: sink %s epoch %s: %d task(s) of the failed write still run after "
                    "%.0f s; aborting the epoch now: what they stage later stays under the "
                    "sink's staging area until its next write deletes it",
                    sink_id,
                    epoch,
                    active,
                    TASKS_STOP_TIMEOUT,
                )
                return
            time.sleep(0.05)
    except Exception as exc:  # never make a failure worse
        log.debug("eosink: cannot follow the failed write's tasks: %s", exc)


def _write_python(df: DataFrame, sink: TaskSink) -> tuple[list[Any], int]:
    # mapInArrow resolves each column as df[name], which reads "a.b" as field b of a
    # column a: hand it positional names and give writers the real ones back.
    names = df.columns
    fn = _task_fn(sink, names)
    plain = df.toDF(*[f"_c{i}" for i in range(len(names))])
    out = plain.mapInArrow(fn, _RESULT_SCHEMA).collect()
    codec = sink.plugin.write_result_codec
    results = [codec.decode(bytes(r["result"]), codec.version) for r in out]
    return results, sum(int(r["rows"]) for r in out)


def _write_native(
    df: DataFrame, coordinator: SparkWriter[Any], sink_id: str, epoch: int, setup: Any
) -> tuple[list[Any], int]:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    # The rows are counted by the write itself (one pass over the data, no second job).
    obs = Observation(f"eosink_rows_{uuid.uuid4().hex}")
    observed = df.observe(obs, F.count(F.lit(1)).alias("rows"))
    attempt = f"spark-{uuid.uuid4().hex[:12]}"
    results = list(coordinator.write_with_spark(observed, epoch, attempt, setup))
    fault_point("after_spark_write")
    jo = getattr(obs, "_jo", None)
    done = jo is None or _spark_version.observed(jo)
    if not done:  # the plugin never wrote the DataFrame it was given
        raise SinkError(
            f"sink {sink_id} epoch {epoch}: write_with_spark returned without writing the "
            "DataFrame it was given (a plugin contract violation)"
        )
    rows = int(obs.get["rows"])
    # Before phase 1: an epoch whose staged files do not hold what Spark wrote never
    # becomes PENDING (the caller discards it).
    coordinator.check_spark_write(epoch, results, rows)
    return results, rows


def task_eosink_error(exc: BaseException, note: str = "") -> EosinkError | None:
    """The eosink error a Spark task raised (a writer's), rebuilt from Spark's failure: same
    class and message, ``note`` added; None when the task's Python traceback does not end
    with one."""
    text = str(exc)
    if "eosink." not in text:
        return None
    try:
        err = _eosink_error_in(_without_sqlstate(text))
    except Exception:  # never make an error worse
        return None
    if err is not None and note:
        _note(err, note)
    return err
