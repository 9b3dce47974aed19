"""Spark's own idiom: ``df.write.format("eosink")`` and ``df.writeStream.format("eosink")``.

A Python data source (``pyspark.sql.datasource``) that drives the same writers, coordinator
and meta store as :func:`eosink.run`. Spark calls the driver side of a Python data source in
short-lived worker processes, so this path is stateless between calls and commits *inline*:
each micro-batch's ``commit`` persists PENDING, commits and marks COMMITTED before Spark
checkpoints the batch. Spark calls ``streamWriter`` at the query's start and again for each
micro-batch's commit (its commit runner makes a new writer): each starts the stream as
``eosink.run`` does (:meth:`SinkRuntime.start_stream`). Recovery runs there and in every
``commit``: PENDING epochs left by a crash hold complete data and are committed; a replayed
committed epoch's output is discarded.

Options (strings, as Spark passes them): ``sink`` (required), ``sink_id``, ``metastore_url``,
``epoch`` (batch), ``new_checkpoint`` (streaming), ``checkpointLocation`` (streaming) and the
sink's own options. List values are written ``a,b`` or as JSON (``["a","b"]``). Spark
lowercases option keys; each key is given back the spelling the sink's options model declares
(``maxbytes`` -> ``maxBytes``), and a key that matches two declared options is an error.

Errors: what it raises reaches the user as the eosink error itself, not Spark's wrapping
(:mod:`eosink._spark_errors`, installed by :func:`register`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from . import _spark_version
from ._batch import commit_batch, end_batch, open_batch
from ._checkpoint import CheckpointDir
from ._handles import BatchResult
from ._journal import Journal
from ._metastore import BATCH
from ._paths import absolute, check_no_relative, path_options
from ._protocol import SinkRuntime
from ._rules import discard_failed_micro_batch
from ._setup import SinkSetup, open_runtime, prepare_sink
from ._spark_version import register_data_source
from ._staging import is_connect
from ._stream import commit_written_micro_batch, discard_refused
from ._tasks import TaskSink, run_writer
from ._write import Written
from .errors import ConfigError, EosinkError, SinkIdentityError
from .registry import get_sink
from .sink import SinkPlugin

log = logging.getLogger("eosink")

if _spark_version.ARROW_STREAM_WRITERS:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
else:  # pyspark 4.0: streams hand the writer Rows (converted below)
    _StreamBase = DataSourceStreamWriter  # type: ignore[misc,assignment]

__all__ = ["EosinkDataSource", "register"]

_CORE_KEYS = {
    "sink",
    "sink_id",
    "metastore_url",
    "epoch",
    "new_checkpoint",
    "checkpointlocation",
    "path",
}


@dataclass
class _Message(WriterCommitMessage):
    result: bytes | None
    rows: int
    epoch: int | None = None
    """The epoch the task wrote (a stream's: its writer's base + batchId)."""


def _value(v: str) -> Any:
    s = v.strip()
    if s[:1] in "[{":
        try:
            return json.loads(s)
        except ValueError:
            return v
    return v


def _declared_keys(plugin: SinkPlugin[Any, Any, Any], opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` (keys lowercased by Spark) with each key spelled as the sink declares it.

    A key matches a field of the options model whose name or alias is the same but for case;
    it becomes the field's alias if it has one, else its name. Keys that match no field are
    kept (the options model reports them as unknown).

    Raises:
        ConfigError: a key matches two declared options (``maxBytes`` and ``maxbytes``).
    """
    fields: dict[str, dict[str, str]] = {}  # lowercased spelling -> {field name: spelling}
    for name, info in plugin.options_model.model_fields.items():
        aliases = [a for a in (info.alias, info.validation_alias) if isinstance(a, str)]
        choices = getattr(info.validation_alias, "choices", None) or []
        aliases += [c for c in choices if isinstance(c, str)]
        spelling = aliases[0] if aliases else name
        for accepted in (name, *aliases):
            fields.setdefault(accepted.lower(), {})[name] = spelling
    out: dict[str, Any] = {}
    for key, value in opts.items():
        found = fields.get(key.lower(), {})
        if len(found) > 1:
            names = ", ".join(repr(n) for n in sorted(found))
            raise ConfigError(
                f"option {key!r} of sink {plugin.name!r} is ambiguous: Spark lowercases "
                f'option keys, and it matches the options {names}. format("eosink") '
                "cannot tell them apart; use eosink.run() for this sink"
            )
        out[next(iter(found.values())) if found else key] = value
    return out


def _setup(
    raw: dict[str, str],
    checkpoint: str | None,
    *,
    streaming: bool = False,
    schema: pa.Schema | None = None,
) -> SinkSetup:
    """The shared setup step (:func:`eosink._setup.prepare_sink`) from Spark's options."""
    opts = {k.lower(): v for k, v in raw.items()}
    name = opts.get("sink")
    if not name:
        raise ConfigError('format("eosink") needs .option("sink", "<name>")')
    plugin = get_sink(name)
    # A Spark Connect server's worker runs in the session's temporary folder: a relative
    # path would land there (and be deleted with the session). The client's
    # register_datasource made them absolute; one still relative is refused.
    check_no_relative(opts, path_options(plugin.path_options))
    plugin.check_ready()
    sink_opts = {k: _value(v) for k, v in opts.items() if k not in _CORE_KEYS}
    if "path" in opts:
        sink_opts["path"] = opts["path"]
    # The driver side runs in a Python worker without a SparkSession: the master is unknown
    # (a batch write's default staging is then this machine's; the sink verifies it).
    return prepare_sink(
        name,
        _declared_keys(plugin, sink_opts),
        streaming=streaming,
        sink_id=opts.get("sink_id"),
        metastore_url=opts.get("metastore_url"),
        checkpoint_location=checkpoint,
        epoch=opts.get("epoch"),
        new_checkpoint=opts.get("new_checkpoint", "refuse"),
        schema=schema,
    )


def _runtime(s: SinkSetup, lineage: str = BATCH, *, micro_batch: bool = False) -> SinkRuntime:
    return open_runtime(s, lineage, micro_batch=micro_batch)


def _close(rt: SinkRuntime) -> None:
    rt.close()
    rt.store.close()


def _write(
    s: SinkSetup, epoch: int, skip: bool, batches: Iterator[pa.RecordBatch], setup: Any
) -> _Message:
    if skip:
        for _ in batches:
            pass
        return _Message(None, 0, epoch)
    result, rows = run_writer(TaskSink(s.plugin, s.options, s.sink_id, epoch, setup), batches)
    return _Message(result, rows, epoch)


def _written(rt: SinkRuntime, messages: list[Any], schema: pa.Schema) -> Written:
    """What the data source's tasks wrote (with ``schema``), from their commit messages."""
    codec = rt.plugin.write_result_codec
    msgs = [m for m in messages if isinstance(m, _Message) and m.result is not None]
    results = [codec.decode(m.result, codec.version) for m in msgs if m.result is not None]
    return Written(results, sum(m.rows for m in msgs), 0.0, "python", schema)


def _arrow(schema: StructType) -> pa.Schema:
    from ._arrow_schema import spark_to_arrow

    return spark_to_arrow(schema, "UTC")


class _BatchWriter(DataSourceArrowWriter):
    def __init__(
        self, s: SinkSetup, epoch: int, skip: bool, schema: pa.Schema, setup: Any, lineage: str
    ) -> None:
        self.setup, self.lineage = setup, lineage
        self.s, self.epoch, self.skip, self.schema = s, epoch, skip, schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Message:
        return _write(self.s, self.epoch, self.skip, iterator, self.setup)

    def commit(self, messages: list[Any]) -> None:
        rt = _runtime(self.s, self.lineage)
        try:
            if self.skip:
                log.info(
                    "sink %s epoch %d: already committed; output discarded", rt.sink_id, self.epoch
                )
                rt.discard(self.epoch)
                end_batch(rt, BatchResult(rt.sink_id, self.epoch, 0, 0, True, skipped=True))
                return
            ep = rt.batch_epoch_decided(self.epoch)
            commit_batch(rt, ep, _written(rt, messages, self.schema))
        finally:
            _close(rt)

    def abort(self, messages: list[Any]) -> None:
        rt = _runtime(self.s)
        try:
            rt.discard(self.epoch)
        finally:
            _close(rt)


def _as_batches(items: Iterator[Any], schema: pa.Schema, size: int = 10_000) -> Iterator[Any]:
    """Arrow batches from what a stream writer gets: batches (pyspark 4.1+) or Rows (4.0)."""
    chunk: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
            continue
        chunk.append(item.asDict(recursive=True))
        if len(chunk) >= size:
            yield pa.RecordBatch.from_pylist(chunk, schema=schema)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk, schema=schema)


class _StreamWriter(_StreamBase):
    def __init__(
        self,
        s: SinkSetup,
        base: int,
        lineage: str,
        schema: pa.Schema,
        setup: Any,
        journal: tuple[str, int],
    ) -> None:
        self.setup = setup
        self.s, self.base, self.lineage, self.schema = s, base, lineage, schema
        self.journal = journal
        """(checkpoint location, generation) of the journal the query's start claimed."""

    def _runtime(self) -> SinkRuntime:
        # The query runs on after this micro-batch: its heartbeat stays (SinkRuntime.micro_batch).
        rt = _runtime(self.s, self.lineage, micro_batch=True)
        location, generation = self.journal
        rt.journal = Journal(CheckpointDir(None, location), self.s.sink_id, generation)
        return rt

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Message:
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or 0) if tc else 0
        return self.write_batch(iterator, batch_id)

    def write_batch(self, iterator: Iterator[Any], batch_id: int) -> _Message:
        """A task's write of micro-batch ``batch_id`` (``write`` reads it from the task's
        context)."""
        return _write(
            self.s, self.base + batch_id, False, _as_batches(iterator, self.schema), self.setup
        )

    def commit(self, messages: list[Any], batchId: int) -> None:
        epoch = self.base + batchId
        rt = self._runtime()
        try:
            written = _tasks_epochs(messages) - {epoch}
            if written:
                # This writer is Spark's commit runner's, made (and the stream started) after
                # the tasks wrote: its start moved the base above epochs another run took
                # meanwhile (rule 8), and the tasks staged this micro-batch under the old one.
                _refuse_moved(rt, batchId, min(written), epoch)
            commit_written_micro_batch(rt, epoch, lambda: _written(rt, messages, self.schema))
        finally:
            _close(rt)

    def abort(self, messages: list[Any], batchId: int) -> None:
        rt = self._runtime()
        try:
            for epoch in sorted(_tasks_epochs(messages) | {self.base + batchId}):
                if discard_failed_micro_batch(rt.status_of(epoch)):
                    rt.discard(epoch)
        finally:
            _close(rt)


def _tasks_epochs(messages: list[Any]) -> set[int]:
    """The epochs the tasks' messages say they wrote (a failed task's message is None)."""
    return {m.epoch for m in messages if isinstance(m, _Message) and m.epoch is not None}


def _refuse_moved(rt: SinkRuntime, batch_id: int, written: int, epoch: int) -> None:
    """Refuse the commit of micro-batch ``batch_id``, which the tasks wrote as epoch
    ``written`` while the stream's base has since moved it to ``epoch``: delete what they
    staged (:func:`eosink._stream.discard_refused`), and raise. The restart runs the
    micro-batch again as ``epoch``.

    Raises:
        SinkIdentityError: always.
    """
    discard_refused(rt, written)
    raise SinkIdentityError(
        f"sink {rt.sink_id!r}: another run wrote epoch(s) this query was to write while it "
        f"ran; micro-batch {batch_id}, written as epoch {written}, is discarded, and the "
        f"query's epochs now continue from epoch {epoch}. Restart the query: it writes "
        "the micro-batch again"
    )


class EosinkDataSource(DataSource):
    """``format("eosink")``: exactly-once writes through an eosink sink plugin."""

    @classmethod
    def name(cls) -> str:
        return "eosink"

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        if overwrite:
            raise ConfigError('format("eosink") appends exactly once; use mode("append")')
        arrow = _arrow(schema)
        s = _setup(dict(self.options), None, streaming=False, schema=arrow)
        rt = _runtime(s)
        try:
            ep = open_batch(rt, s.epoch)  # a crashed run's complete epoch is committed here
            setup = None if ep.skipped else ep.setup(arrow)
        finally:
            _close(rt)
        return _BatchWriter(s, ep.epoch, ep.skipped, arrow, setup, rt.lineage)

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        opts = {k.lower(): v for k, v in dict(self.options).items()}
        checkpoint = opts.get("checkpointlocation")
        if not checkpoint:
            raise ConfigError('format("eosink") streams need .option("checkpointLocation", ...)')
        arrow = _arrow(schema)
        s = _setup(opts, checkpoint, streaming=True, schema=arrow)
        from pyspark.sql import SparkSession

        rt = _runtime(s, micro_batch=True)  # the query runs on: its heartbeat stays
        try:
            ckpt = CheckpointDir(SparkSession.getActiveSession(), checkpoint)
            # Spark calls this at the query's start and again for each micro-batch's
            # commit (its commit runner makes a new writer): each is a start of the stream.
            base = rt.start_stream(ckpt, s.new_checkpoint, inline=True)
            setup = rt.coordinator.writer_setup(arrow)
        finally:
            _close(rt)
        assert rt.journal is not None and rt.journal.generation is not None
        return _StreamWriter(
            s, base, rt.lineage, arrow, setup, (rt.journal.ckpt.location, rt.journal.generation)
        )


def register(spark: Any) -> None:
    """Register ``format("eosink")`` with a SparkSession and, over Spark Connect, make its
    path-like options absolute on this client. :func:`eosink._session.prepare_session`
    calls it (after installing eosink's error conversion) where Spark has Python data
    sources."""
    register_data_source(spark, EosinkDataSource)
    if is_connect(spark):
        _absolute_paths_on_client(spark)


def _absolute_paths_on_client(spark: Any) -> None:
    """Make a Spark Connect client session send ``format("eosink")``'s path-like options
    absolute (see :mod:`eosink._paths`).

    Wraps the session's ``client.execute_command`` (once): a command that writes through
    ``format("eosink")`` (Spark Connect's ``WriteOperation`` / ``WriteStreamOperationStart``
    messages, part of its public protocol) gets its ``path`` and path-like options made
    absolute against this process's working directory before it is sent.
    """
    client = getattr(spark, "client", None)
    original = getattr(client, "execute_command", None)
    if client is None or original is None or getattr(original, "__eosink__", False):
        return

    def execute_command(command: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _absolute_command_paths(command)
        except Exception as exc:  # never make a write fail here: the server checks again
            log.debug("cannot make format('eosink') paths absolute: %s", exc)
        return original(command, *args, **kwargs)

    execute_command.__eosink__ = True  # type: ignore[attr-defined]
    client.execute_command = execute_command


def _absolute_command_paths(command: Any) -> None:
    """Rewrite, in place, the path-like options of a Spark Connect command that writes
    through ``format("eosink")``; other commands are left alone."""
    if command.HasField("write_operation"):
        op, fmt = command.write_operation, command.write_operation.source
    elif command.HasField("write_stream_operation_start"):
        op, fmt = command.write_stream_operation_start, command.write_stream_operation_start.format
    else:
        return
    if fmt.lower() != EosinkDataSource.name():
        return
    options = dict(op.options)
    sink = next((v for k, v in options.items() if k.lower() == "sink"), None)
    try:
        declared = get_sink(sink).path_options if sink else ()
    except EosinkError:  # an unknown sink: the server says so
        declared = ()
    names = path_options(declared)
    for key, value in options.items():
        if key.lower() in names and absolute(value) != value:
            op.options[key] = absolute(value)
    if op.HasField("path") and op.path:
        op.path = absolute(op.path)
