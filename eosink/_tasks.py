"""The code that runs inside Spark tasks (executors): one writer over a partition.

Kept apart from the driver-side modules so that a Python worker that unpickles a task
imports only this, the plugin API and pyarrow: not the meta store (SQLAlchemy, Alembic) nor
the protocol. ``import eosink`` is lazy for the same reason (see ``eosink/__init__.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .faults import fault_point
from .sink import SinkPlugin, WriterContext

__all__ = ["TaskSink", "run_writer"]


@dataclass(frozen=True)
class TaskSink:
    """The one value a Spark task gets of the sink and its epoch, built on the driver and
    pickled to the executors: the plugin, its parsed options, the sink id, the epoch and what
    the coordinator's ``writer_setup`` returned for it. Every front end ships this (the
    Python writers of ``eosink.run``, ``format("eosink")``'s tasks, the conformance suite)."""

    plugin: SinkPlugin[Any, Any, Any]
    options: Any
    sink_id: str
    epoch: int
    setup: Any = None


def run_writer(
    sink: TaskSink,
    batches: Iterable[pa.RecordBatch],
    *,
    partition: int | None = None,
    attempt: int = 0,
) -> tuple[bytes, int]:
    """Inside a Spark task: one writer over the partition's batches -> (encoded result, rows).

    A failing writer gets ``abort_write`` before the error propagates (Spark retries the task).
    The partition and attempt number are the running Spark task's; ``partition`` given, they
    are these (the conformance suite runs this same code without Spark).
    """
    plugin, epoch = sink.plugin, sink.epoch
    if partition is None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        part = tc.partitionId() if tc else 0
        attempt = tc.attemptNumber() if tc else 0
    else:
        part = partition
    ctx = WriterContext(
        sink.sink_id, epoch, part, f"p{part:05d}-a{attempt}-{uuid.uuid4().hex[:8]}", sink.setup
    )
    writer = plugin.writer_factory(sink.options, ctx)
    rows = 0
    try:
        writer.begin_epoch(epoch)
        for b in batches:
            rows += b.num_rows
            writer.write_batch(b)
        fault_point("task_before_finish", first_attempt=attempt == 0)
        result = writer.finish_write(epoch)
    except BaseException:
        writer.abort_write()
        raise
    fault_point("task_after_finish", first_attempt=attempt == 0)
    return plugin.write_result_codec.encode(result), rows


def _task_fn(sink: TaskSink, names: list[str] | None = None) -> Any:
    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if names is not None:  # the DataFrame's own column names (see write_epoch)
            batches = (b.rename_columns(names) for b in batches)
        result, rows = run_writer(sink, batches)
        yield pa.record_batch(
            [pa.array([result], pa.binary()), pa.array([rows], pa.int64())],
            names=["result", "rows"],
        )

    return write_partition
