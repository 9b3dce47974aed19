"""Spark's own idiom: ``df.write.format("eosink")`` and ``df.writeStream.format("eosink")``.

A Python data source (``pyspark.sql.datasource``) that drives the same writers, coordinator
and meta store as :func:`eosink.run`. Spark calls the driver side of a Python data source in
short-lived worker processes, so this path is stateless between calls and commits *inline*:
each micro-batch's ``commit`` persists PENDING, commits and marks COMMITTED before Spark
checkpoints the batch. Recovery runs in every ``commit``: PENDING epochs left by a crash hold
complete data and are committed; a replayed committed epoch's output is discarded.

Options (strings, as Spark passes them): ``sink`` (required), ``sink_id``, ``metastore_url``,
``epoch`` (batch), ``new_checkpoint`` (streaming), ``checkpointLocation`` (streaming) and the
sink's own options. List values are written ``a,b`` or as JSON (``["a","b"]``).
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
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ._checkpoint import CheckpointDir
from ._metastore import BATCH, PENDING, MetaStore, default_url
from ._protocol import FINISH, SKIP, SinkRuntime
from ._spark import run_writer
from .errors import ConfigError
from .registry import get_sink
from .sink import SinkPlugin

log = logging.getLogger("eosink")

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


def _value(v: str) -> Any:
    s = v.strip()
    if s[:1] in "[{":
        try:
            return json.loads(s)
        except ValueError:
            return v
    return v


@dataclass(frozen=True)
class _Setup:
    plugin: SinkPlugin[Any, Any, Any]
    options: Any
    sink_id: str
    metastore_url: str


def _setup(raw: dict[str, str], checkpoint: str | None) -> _Setup:
    opts = {k.lower(): v for k, v in raw.items()}
    name = opts.get("sink")
    if not name:
        raise ConfigError('format("eosink") needs .option("sink", "<name>")')
    plugin = get_sink(name)
    sink_opts = {k: _value(v) for k, v in opts.items() if k not in _CORE_KEYS}
    if "path" in opts:
        sink_opts["path"] = opts["path"]
    options = plugin.parse_options(sink_opts)
    return _Setup(
        plugin,
        options,
        opts.get("sink_id") or plugin.default_sink_id(options),
        opts.get("metastore_url") or default_url(checkpoint),
    )


def _runtime(s: _Setup, lineage: str = BATCH) -> SinkRuntime:
    rt = SinkRuntime(s.plugin, s.options, s.sink_id, MetaStore(s.metastore_url))
    try:
        rt.start()
    except BaseException:
        rt.store.close()
        raise
    rt.lineage = lineage
    return rt


def _close(rt: SinkRuntime) -> None:
    rt.close()
    rt.store.close()


def _write(
    s: _Setup, epoch: int, skip: bool, batches: Iterator[pa.RecordBatch], setup: Any
) -> _Message:
    if skip:
        for _ in batches:
            pass
        return _Message(None, 0)
    result, rows = run_writer(s.plugin, s.options, s.sink_id, epoch, setup, batches)
    return _Message(result, rows)


def _commit_inline(rt: SinkRuntime, epoch: int, messages: list[Any], schema: pa.Schema) -> None:
    codec = rt.plugin.write_result_codec
    msgs = [m for m in messages if isinstance(m, _Message) and m.result is not None]
    results = [codec.decode(m.result, codec.version) for m in msgs if m.result is not None]
    committable, fig = rt.pre_commit(
        epoch, results, rt.add_columns(schema), rows=sum(m.rows for m in msgs), write_s=0.0
    )
    rt.commit_epoch(epoch, committable, fig)


def _arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class _BatchWriter(DataSourceArrowWriter):
    def __init__(self, s: _Setup, epoch: int, skip: bool, schema: pa.Schema, setup: Any) -> None:
        self.setup = setup
        self.s, self.epoch, self.skip, self.schema = s, epoch, skip, schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Message:
        return _write(self.s, self.epoch, self.skip, iterator, self.setup)

    def commit(self, messages: list[Any]) -> None:
        rt = _runtime(self.s)
        try:
            if self.skip:
                log.info(
                    "sink %s epoch %d: already committed; output discarded", rt.sink_id, self.epoch
                )
                rt.discard(self.epoch)
                return
            _commit_inline(rt, self.epoch, messages, self.schema)
        finally:
            _close(rt)

    def abort(self, messages: list[Any]) -> None:
        rt = _runtime(self.s)
        try:
            rt.discard(self.epoch)
        finally:
            _close(rt)


class _StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, s: _Setup, base: int, lineage: str, schema: pa.Schema, setup: Any) -> None:
        self.setup = setup
        self.s, self.base, self.lineage, self.schema = s, base, lineage, schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Message:
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or 0) if tc else 0
        return _write(self.s, self.base + batch_id, False, iterator, self.setup)

    def commit(self, messages: list[Any], batchId: int) -> None:
        epoch = self.base + batchId
        rt = _runtime(self.s, self.lineage)
        try:
            # Inline-mode recovery: PENDING epochs left by a crash hold complete data.
            rt.recover(
                first_epoch=epoch + 1 if rt.status_of(epoch) == PENDING else epoch,
                keep_staged=frozenset({epoch}),
            )
            if rt.stream_decision(epoch) == SKIP:
                log.info(
                    "sink %s epoch %d: replay of a committed epoch; output discarded",
                    rt.sink_id,
                    epoch,
                )
                rt.discard(epoch)
                return
            _commit_inline(rt, epoch, messages, self.schema)
        finally:
            _close(rt)

    def abort(self, messages: list[Any], batchId: int) -> None:
        rt = _runtime(self.s, self.lineage)
        try:
            if rt.status_of(self.base + batchId) is None:
                rt.discard(self.base + batchId)
        finally:
            _close(rt)


class EosinkDataSource(DataSource):
    """``format("eosink")``: exactly-once writes through an eosink sink plugin."""

    @classmethod
    def name(cls) -> str:
        return "eosink"

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        if overwrite:
            raise ConfigError('format("eosink") appends exactly once; use mode("append")')
        s = _setup(dict(self.options), None)
        arrow = _arrow(schema)
        if s.plugin.validate_schema is not None:
            s.plugin.validate_schema(s.options, arrow)
        rt = _runtime(s)
        try:
            raw = {k.lower(): v for k, v in dict(self.options).items()}.get("epoch")
            try:
                wanted = int(raw) if raw is not None else None
            except ValueError:
                raise ConfigError(f"option epoch must be an integer, not {raw!r}") from None
            decision, epoch = rt.batch_decision(wanted)
            skip = decision == SKIP
            if decision == FINISH:
                rt.recover(first_epoch=epoch + 1)  # a crashed run's complete epoch: finish it
                skip = True
            elif not skip:
                rt.recover(first_epoch=epoch)
            setup = None if skip else rt.coordinator.writer_setup(arrow)
        finally:
            _close(rt)
        return _BatchWriter(s, epoch, skip, arrow, setup)

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        opts = {k.lower(): v for k, v in dict(self.options).items()}
        checkpoint = opts.get("checkpointlocation")
        if not checkpoint:
            raise ConfigError('format("eosink") streams need .option("checkpointLocation", ...)')
        s = _setup(opts, checkpoint)
        arrow = _arrow(schema)
        if s.plugin.validate_schema is not None:
            s.plugin.validate_schema(s.options, arrow)
        from pyspark.sql import SparkSession

        rt = _runtime(s)
        try:
            ckpt = CheckpointDir(SparkSession.getActiveSession(), checkpoint)
            base = rt.open_stream(ckpt, opts.get("new_checkpoint", "refuse"))
            base = rt.rebase_stream(ckpt, base)
            setup = rt.coordinator.writer_setup(arrow)
        finally:
            _close(rt)
        return _StreamWriter(s, base, rt.lineage, arrow, setup)


def register(spark: Any) -> None:
    """Register ``format("eosink")`` with a SparkSession (``eosink.spark_session`` does it)."""
    spark.dataSource.register(EosinkDataSource)
