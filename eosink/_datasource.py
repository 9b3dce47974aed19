"""Spark's own idiom: ``df.write.format("eosink")`` and ``df.writeStream.format("eosink")``.

A Python data source (``pyspark.sql.datasource``) that drives the same writers, coordinator
and meta store as :func:`eosink.run`. Spark calls the driver side of a Python data source in
short-lived worker processes, so this path is stateless between calls and commits *inline*:
each micro-batch's ``commit`` persists PENDING, commits and marks COMMITTED before Spark
checkpoints the batch. Recovery runs in every ``commit``: PENDING epochs left by a crash hold
complete data and are committed; a replayed committed epoch's output is discarded.

Options (strings, as Spark passes them): ``sink`` (required), ``sink_id``, ``metastore_url``,
``epoch`` (batch), ``new_checkpoint`` (streaming), ``checkpointLocation`` (streaming) and the
sink's own options. List values are written ``a,b`` or as JSON (``["a","b"]``). Spark
lowercases option keys; each key is given back the spelling the sink's options model declares
(``maxbytes`` -> ``maxBytes``), and a key that matches two declared options is an error.

Errors. Spark calls a Python data source in worker processes and reports what it raises as an
``AnalysisException`` (``[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source
writer: Traceback ...``), for a stream wrapped once more in the ``StreamingQueryException`` of
the first micro-batch; the driver's Python never runs eosink code before that (``save()`` and
``start()`` are pyspark's), so options cannot be validated there first, and no Spark setting
removes the wrapping (``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled`` only
drops pyspark's frames, ``...hideTraceback.enabled`` the traceback, never the prefix).
:func:`register` therefore converts on the driver instead: it wraps pyspark's
``convert_exception`` (the function through which every JVM exception becomes a Python one),
and when a Spark error is a ``PYTHON_DATA_SOURCE_ERROR`` whose Python traceback ends with an
eosink error (``eosink.errors.ConfigError: invalid options ...``), directly or as the cause of
a ``StreamingQueryException``, the user gets that eosink error itself: same class, same
message, the worker's frames as its traceback and Spark's context as a note. Everything else
passes unchanged, and should pyspark's internals change the wrapper steps aside (the Spark
exception, which still contains the eosink message, is raised as before).
"""

from __future__ import annotations

import json
import logging
import re
import sys
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

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pyspark 4.0: streams hand the writer Rows (converted below)
    _StreamBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
from pyspark.sql.types import StructType

from . import errors
from ._checkpoint import CheckpointDir
from ._journal import Journal
from ._logs import default_logging
from ._metastore import BATCH
from ._protocol import WRITE, Epoch, SinkRuntime
from ._setup import SinkSetup, open_runtime, prepare_sink
from ._staging import is_connect
from ._tasks import run_writer
from .errors import ConfigError, EosinkError
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


def _runtime(s: SinkSetup, lineage: str = BATCH) -> SinkRuntime:
    return open_runtime(s, lineage)


def _close(rt: SinkRuntime) -> None:
    rt.close()
    rt.store.close()


def _write(
    s: SinkSetup, epoch: int, skip: bool, batches: Iterator[pa.RecordBatch], setup: Any
) -> _Message:
    if skip:
        for _ in batches:
            pass
        return _Message(None, 0)
    result, rows = run_writer(s.plugin, s.options, s.sink_id, epoch, setup, batches)
    return _Message(result, rows)


def _commit_inline(rt: SinkRuntime, epoch: int, messages: list[Any], *, stream: bool) -> None:
    """Phase 1 and 2 of an epoch written by the data source's tasks (or discard a replay).

    A stream's epoch is decided here (recovery first: this front end commits inline); a
    batch's was decided by :meth:`EosinkDataSource.writer` on the driver side."""
    if stream:
        ep = rt.stream_epoch(epoch, inline=True)
        if ep.skipped:
            log.info(
                "sink %s epoch %d: replay of a committed epoch; output discarded",
                rt.sink_id,
                epoch,
            )
            ep.discard()
            return
    else:
        rt.import_target_journal()
        ep = Epoch(rt, epoch, WRITE)
    codec = rt.plugin.write_result_codec
    msgs = [m for m in messages if isinstance(m, _Message) and m.result is not None]
    results = [codec.decode(m.result, codec.version) for m in msgs if m.result is not None]
    ep.prepare(results, sum(m.rows for m in msgs), 0.0)
    ep.commit()
    # Files that span epochs: a batch write publishes everything; a stream what is due by
    # time (this front end has no stop hook: open files roll at a later micro-batch).
    rt.roll(everything=not stream)
    if not stream:
        rt.run_returned(epoch)


def _arrow(schema: StructType) -> pa.Schema:
    from ._session import spark_to_arrow

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
                return
            _commit_inline(rt, self.epoch, messages, stream=False)
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
        rt = _runtime(self.s, self.lineage)
        location, generation = self.journal
        rt.journal = Journal(CheckpointDir(None, location), self.s.sink_id, generation)
        return rt

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Message:
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or 0) if tc else 0
        batches = _as_batches(iterator, self.schema)
        return _write(self.s, self.base + batch_id, False, batches, self.setup)

    def commit(self, messages: list[Any], batchId: int) -> None:
        epoch = self.base + batchId
        rt = self._runtime()
        try:
            _commit_inline(rt, epoch, messages, stream=True)
        finally:
            _close(rt)

    def abort(self, messages: list[Any], batchId: int) -> None:
        rt = self._runtime()
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
        arrow = _arrow(schema)
        s = _setup(dict(self.options), None, streaming=False, schema=arrow)
        rt = _runtime(s)
        try:
            ep = rt.batch_epoch(s.epoch)  # a crashed run's complete epoch is committed here
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

        rt = _runtime(s)
        try:
            ckpt = CheckpointDir(SparkSession.getActiveSession(), checkpoint)
            base = rt.open_stream(ckpt, s.new_checkpoint, inline=True)
            base = rt.rebase_stream(ckpt, base)
            setup = rt.coordinator.writer_setup(arrow)
        finally:
            _close(rt)
        assert rt.journal is not None and rt.journal.generation is not None
        return _StreamWriter(
            s, base, rt.lineage, arrow, setup, (rt.journal.ckpt.location, rt.journal.generation)
        )


def register(spark: Any) -> None:
    """Register ``format("eosink")`` with a SparkSession (``eosink.spark_session`` does it).

    Also makes the errors of ``format("eosink")`` come out as eosink's own errors on this
    driver (see the module's docstring).
    """
    default_logging()
    spark.dataSource.register(EosinkDataSource)
    _install_error_conversion(connect=is_connect(spark))


_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(r"([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)(?:: |$)")


def _eosink_error_in(text: str) -> EosinkError | None:
    """The eosink error that a Python traceback as Spark reports it ends with, rebuilt.

    ``text`` is a formatted traceback (or, with tracebacks hidden, the exception line alone).
    Its last exception is rebuilt when its class is an :class:`EosinkError` of
    ``eosink.errors`` (or of a module this process has imported); else None.
    """
    start = text.rfind(_TRACEBACK)
    lines = (text[start:] if start >= 0 else text).splitlines()
    i = 1 if start >= 0 else 0
    while i < len(lines) and (not lines[i].strip() or lines[i][0].isspace()):
        i += 1  # the frames: indented
    if i >= len(lines):
        return None
    m = _ERROR_LINE.match(lines[i])
    module = sys.modules.get(m.group(1)) if m else None
    cls = getattr(module, m.group(2), None) if m else None
    if m is None or not (isinstance(cls, type) and issubclass(cls, EosinkError)):
        return None
    message = "\n".join([lines[i][m.end() :], *lines[i + 1 :]]).rstrip()
    err = errors._rebuild(cls, (message,), {})
    for name, value in _attributes(cls, message).items():
        setattr(err, name, value)
    if start >= 0:
        try:  # the worker's frames as the traceback, as pyspark does for its own exceptions
            from pyspark.errors.exceptions.tblib import Traceback

            err = err.with_traceback(Traceback.from_string(text[start:]).as_traceback())
        except Exception:  # a nicety only
            pass
    return err


def _attributes(cls: type[EosinkError], message: str) -> dict[str, Any]:
    """The attributes of the errors that have some, recovered from their message."""
    if issubclass(cls, errors.MissingExtraError):
        m = re.search(r"module '([^']+)'.*pip install '(([^'\[]+)(?:\[([^\]]+)\])?)'", message)
        if m:
            return {
                "name": m.group(1),
                "extra": m.group(4) or m.group(2),
                "install": m.group(2),
                "pip": f"pip install '{m.group(2)}'",
            }
    if issubclass(cls, errors.UnknownSinkError):
        m = re.match(r"unknown sink '([^']*)'; installed sinks: (.*?)\. Run", message)
        if m:
            known = [] if m.group(2) == "(none)" else m.group(2).split(", ")
            return {"name": m.group(1), "known": known}
    return {}


def _eosink_error_of(exc: Any) -> EosinkError | None:
    """The eosink error a converted Spark exception carries, with Spark's context as a note.

    A ``PYTHON_DATA_SOURCE_ERROR`` whose traceback ends with an eosink error, or a
    ``STREAM_FAILED`` caused by one (pyspark converts the cause first, through the same
    wrapper, so the cause is already the eosink error); anything else: None.
    """
    if isinstance(exc, EosinkError):
        return exc
    condition = exc.getCondition() if hasattr(exc, "getCondition") else None
    if condition not in ("PYTHON_DATA_SOURCE_ERROR", "STREAM_FAILED"):
        return None
    params = exc.getMessageParameters() or {}
    if condition == "STREAM_FAILED":
        cause = getattr(exc, "_cause", None)
        err = _eosink_error_of(cause) if cause is not None else None
        if err is None:  # a Spark Connect client's exception: the cause is text only
            from ._stream import eosink_error_of_stream

            err = eosink_error_of_stream(exc)
        where = f"the streaming query id={params.get('id')} runId={params.get('runId')} stopped"
    else:
        err = _eosink_error_in(str(params.get("msg", "")))
        where = f'raised in Spark by format("eosink"), {params.get("action")} {params.get("type")}'
    if err is not None:
        _note(err, f"({where}: {condition})")
        # pyspark raises the converted error ``from None``: keep Spark's own for the callers
        # that re-raise it with its cause (StreamingHandle.await_termination).
        err._spark_error = exc  # type: ignore[attr-defined]
    return err


def _note(err: BaseException, note: str) -> None:
    add_note = getattr(err, "add_note", None)  # Python 3.11+
    if add_note is not None and note not in getattr(err, "__notes__", ()):
        add_note(note)


def _install_error_conversion(connect: bool = False) -> None:
    """Wrap pyspark's ``convert_exception`` once per process (see the module's docstring):
    classic sessions' (``pyspark.errors.exceptions.captured``) and, for a Spark Connect
    client, the one its client module imported (``pyspark.sql.connect.client.core``)."""
    try:
        from pyspark.errors.exceptions import captured
    except ImportError:  # pragma: no cover - pyspark without the classic exception module
        pass
    else:
        _wrap(captured, "convert_exception")
    if not connect:
        return
    try:
        from pyspark.sql.connect.client import core
    except ImportError:  # the Spark Connect client packages are not installed
        return
    _wrap(core, "convert_exception")


def _wrap(module: Any, name: str) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "__eosink__", False):
        return

    def convert_exception(*args: Any, **kwargs: Any) -> Any:
        converted = original(*args, **kwargs)
        try:
            return _eosink_error_of(converted) or converted
        except Exception:  # never make an error worse
            return converted

    convert_exception.__eosink__ = True  # type: ignore[attr-defined]
    convert_exception.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, name, convert_exception)
