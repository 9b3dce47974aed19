"""A Spark-less driver of ``eosink.run``: the real lifecycle, a simulated Spark.

``python tests/lifecycle_driver.py METASTORE_URL OUT CHECKPOINT BATCHES ROWS SINK_ID [OPTIONS]``
(``OPTIONS``: JSON of sink options and of the driver's own keys, :func:`main`; or one run per
line given to ``--zygote``: :func:`zygote`) runs, by default, the stream of
``eosink.run(df, sink="file", sink_options={"path": OUT, "format": "parquet",
"partition_by": "grp"}, checkpoint_location=CHECKPOINT)`` with everything of eosink real:
:func:`eosink._setup.prepare_sink` and :func:`~eosink._setup.open_runtime` (validation, the
sink acquired in the meta store), :func:`eosink._stream.open_stream_batches` (the one place
that orders a stream's start: lineage, recovery, rebase, the held decision),
:class:`~eosink._stream.StreamBatches` (each micro-batch: backpressure, resume, phase 1, the
:class:`~eosink._protocol.AsyncCommitter` that commits after the checkpoint) and
:func:`~eosink._stream.close_live` (the end: drain, close). Another sink (sql, kafka), or a
batch run (:func:`eosink._batch.run_batch`, the function ``eosink.run`` runs a batch with),
are options. The sink's writers run through eosink's task code in this process
(:func:`eosink.testing.drive_writers`), as Spark's tasks would run them.

Only Spark is simulated, as its micro-batch execution behaves: batch ``b``'s offsets entry
(``offsets/b``) is written before the batch runs and its commit entry (``commits/b``) after
the ``foreachBatch`` function returned, each atomically (a temporary file renamed into
place); a restart resumes at the first batch without a commit entry and replays it with the
same data (batch ``b`` holds ids ``b*ROWS .. (b+1)*ROWS-1``: a deterministic source). So a
SIGKILL of this process lands where a Spark driver's would, at a fraction of the cost: it
starts in well under a second, where a Spark driver takes 7-11 CPU-seconds
(tests/test_lifecycle_kills.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from harness import GROUPS, payload

from eosink._batch import run_batch
from eosink._checkpoint import CheckpointDir
from eosink._protocol import Epoch
from eosink._setup import open_runtime, prepare_sink
from eosink._stream import close_live, open_stream_batches
from eosink._write import Written
from eosink.testing import drive_writers

BATCH_EPOCH = 5
"""The epoch of a batch run (option ``batch``), as tests/crashjob.py's batch jobs."""
DRIVER_KEYS = frozenset({"batch", "front", "sink", "tasks", "kafka_rows", "pad", "input"})
"""The options that are this driver's, not the sink's (:func:`main`; ``op_column`` is both)."""
SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("payload", pa.string())])


def batch_rows(batch_id: int, rows: int, pad: int = 0) -> pa.RecordBatch:
    """Batch ``batch_id`` of the simulated source (the same at every replay): the rows of
    the crash tests' input file ``batch_id`` (``harness.make_input``: ids, their group, their
    payload, ``pad`` characters longer)."""
    ids = list(range(batch_id * rows, (batch_id + 1) * rows))
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([GROUPS[i % len(GROUPS)] for i in ids]),
            pa.array([payload(i, pad) for i in ids]),
        ],
        SCHEMA,
    )


def _source(input_dir: str | None, op: bool, pad: int = 0) -> Callable[[int, int], pa.RecordBatch]:
    """Batch ``b`` of ``rows`` rows: :func:`batch_rows` (payloads ``pad`` characters
    longer), or the ``b``-th file of ``input_dir``; with ``op``, an ``op`` column added."""
    files = sorted(Path(input_dir).glob("*.parquet")) if input_dir else []

    def read(b: int, rows: int) -> pa.RecordBatch:
        if not input_dir:
            data = batch_rows(b, rows, pad)
        else:
            table = pq.read_table(files[b]).combine_chunks()
            [data] = table.to_batches() or [pa.RecordBatch.from_pylist([], table.schema)]
        if op:
            ids = data.column("id").to_pylist()
            ops = pa.array(["d" if i % 7 == 0 else "u" for i in ids])
            data = pa.RecordBatch.from_arrays(
                [*data.columns, ops], names=[*data.schema.names, "op"]
            )
        return data

    return read


def _as_kafka_rows(
    source: Callable[[int, int], pa.RecordBatch],
) -> Callable[[int, int], pa.RecordBatch]:
    """The kafka sink's columns, as tests/crashjob.py makes them: ``key`` the row's group,
    ``value`` the row as JSON."""

    def read(b: int, rows: int) -> pa.RecordBatch:
        data = source(b, rows)
        recs = data.to_pylist()
        return pa.record_batch(
            [
                pa.array([r["grp"] for r in recs], pa.string()),
                pa.array([json.dumps(r, separators=(",", ":")) for r in recs], pa.string()),
            ],
            names=["key", "value"],
        )

    return read


def _parts(data: pa.RecordBatch, tasks: int, kafka_rows: bool) -> list[pa.RecordBatch]:
    """``data`` split among ``tasks`` tasks: by key for the kafka sink (one key's rows in one
    task: Spark's ``repartition(tasks, "grp")``), in slices otherwise."""
    if kafka_rows:
        keys = data.column("key").to_pylist()
        return [
            data.filter(pa.array([GROUPS.index(k) % tasks == t for k in keys]))
            for t in range(tasks)
        ]
    step = -(-data.num_rows // tasks) or 1
    return [data.slice(i, step) for i in range(0, max(data.num_rows, 1), step)]


def _format(
    url: str,
    checkpoint: str,
    batches: int,
    rows: int,
    sink_id: str,
    sink: str,
    options: dict[str, Any],
    stream: bool,
    schema: pa.Schema,
    source: Callable[[int, int], pa.RecordBatch],
    parts: Callable[[pa.RecordBatch], list[pa.RecordBatch]],
) -> None:
    """``format("eosink")``'s run, its real data source (:mod:`eosink._datasource`) driven
    as Spark drives a Python data source: the options as strings; ``streamWriter`` (or
    ``writer``) once at the query's start, its tasks' ``write`` through it (a stream's through
    ``write_batch``, given the micro-batch ``write`` reads from the task's context); a
    stream's ``commit`` of each micro-batch (``abort`` when a task failed) on another
    ``streamWriter``, which Spark's commit runner makes for each
    (pyspark/sql/worker/python_streaming_sink_runner.py); a batch's ``commit`` on a pickled
    copy of its writer."""
    import pickle

    from pyspark.sql.pandas.types import from_arrow_schema

    from eosink import _spark_version

    _spark_version.require_python_data_sources()  # pyspark 3.5: eosink's refusal, said once
    from eosink._datasource import EosinkDataSource

    raw = {
        "sink": sink,
        "sink_id": sink_id,
        **({} if url == "default" else {"metastore_url": url}),
        **{k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in options.items()},
    }
    spark_schema = from_arrow_schema(schema)
    ds = EosinkDataSource(
        {**raw, "checkpointLocation": checkpoint} if stream else {**raw, "epoch": str(BATCH_EPOCH)}
    )
    if not stream:
        bw = ds.writer(spark_schema, False)
        messages = [bw.write(iter([p])) for p in parts(_all_rows(source, batches, rows))]
        pickle.loads(pickle.dumps(bw)).commit(messages)
        return
    sw = ds.streamWriter(spark_schema, False)
    for b in _micro_batches(checkpoint, batches):
        try:
            messages = [sw.write_batch(iter([p]), b) for p in parts(source(b, rows))]
        except BaseException:
            ds.streamWriter(spark_schema, False).abort([], b)
            raise
        ds.streamWriter(spark_schema, False).commit(messages, b)


def _all_rows(
    source: Callable[[int, int], pa.RecordBatch], batches: int, rows: int
) -> pa.RecordBatch:
    """Every batch's rows in one record batch: a batch run's one epoch."""
    whole = pa.Table.from_batches([source(b, rows) for b in range(batches)])
    [data] = whole.combine_chunks().to_batches()
    return data


def _micro_batches(checkpoint: str, batches: int) -> Iterator[int]:
    """Spark's micro-batch loop over the checkpoint: from the first batch without a commit
    entry, each batch's offsets entry written before it runs (the caller's loop body) and
    its commit entry after the body returned (not when it raised)."""
    root = Path(checkpoint)
    last = CheckpointDir(None, checkpoint).last_committed_batch()
    for b in range(0 if last is None else last + 1, batches):
        _log_entry(root, "offsets", b, f'v1\n{{"batch": {b}}}\n')
        yield b
        _log_entry(root, "commits", b, 'v1\n{"nextBatchWatermarkMs":0}\n')


def _log_entry(ckpt: Path, log: str, batch_id: int, text: str) -> None:
    """Spark's HDFSMetadataLog: a temporary file renamed into ``<log>/<batch_id>``."""
    d = ckpt / log
    d.mkdir(parents=True, exist_ok=True)
    final = d / str(batch_id)
    if final.exists():
        return
    tmp = d / f".{batch_id}.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, final)


def main(
    url: str,
    out: str,
    checkpoint: str,
    batches: int,
    rows: int,
    sink_id: str,
    more: dict[str, Any] | None = None,
) -> None:
    """``more``: sink options over the file sink's defaults (Parquet partitioned by ``grp``
    in ``out``); a None value removes one (``{"partition_by": None}``). The driver's own keys:

    * ``batch``: true runs ``eosink.run``'s batch of epoch :data:`BATCH_EPOCH`
      (:func:`eosink._batch.run_batch`, every batch's rows in that one epoch) instead of a
      stream;
    * ``front``: ``"format"`` runs ``format("eosink")``'s data source (:func:`_format`)
      instead of ``eosink.run``;
    * ``sink``: another sink than the file sink (its options are ``more`` alone);
    * ``tasks``: how many writers share a micro-batch's rows, as Spark's tasks would (1);
    * ``kafka_rows``: true makes the kafka sink's ``key`` and ``value`` columns of the
      rows, one key's rows in one task, as tests/crashjob.py makes them;
    * ``pad``: each row's payload that many characters longer (harness's ``payload``);
    * ``input``: a directory of Parquet files, the ``b``-th in name order being batch
      ``b`` (tests/harness.py's ``make_cdc_input``);
    * ``op_column``: given ``"op"``, a column ``op`` is added, ``"d"`` for every 7th id,
      ``"u"`` otherwise, as tests/crashjob.py adds it (it is a sink option too).
    """
    more = dict(more or {})
    sink = more.pop("sink", "file")
    tasks = int(more.pop("tasks", 1))
    kafka_rows = bool(more.pop("kafka_rows", False))
    stream = not more.pop("batch", False)
    front = more.pop("front", "run")
    pad = int(more.pop("pad", 0))
    source = _source(more.pop("input", None), more.get("op_column") == "op", pad)
    options: dict[str, Any] = (
        {"path": out, "format": "parquet", "partition_by": "grp"} if sink == "file" else {}
    )
    options.update(more)
    options = {k: v for k, v in options.items() if v is not None}
    if kafka_rows:
        source = _as_kafka_rows(source)
    schema = source(0, rows).schema
    if front == "format":
        _format(
            url, checkpoint, batches, rows, sink_id, sink, options, stream, schema, source,
            lambda data: _parts(data, tasks, kafka_rows),
        )  # fmt: skip
        return
    setup = prepare_sink(
        sink,
        options,
        streaming=stream,
        sink_id=sink_id,
        metastore_url=None if url == "default" else url,  # eosink's default: the machine's
        schema=schema,
        epoch=None if stream else BATCH_EPOCH,
        checkpoint_location=checkpoint if stream else None,
        master=lambda: "local[1]",
    )

    def written(ep: Epoch, data: pa.RecordBatch) -> Written:
        """``data`` written by ``tasks`` writers (Spark's tasks); on an error the epoch is
        discarded (as :func:`eosink._write.write_or_discard` does)."""
        t0 = time.perf_counter()
        parts = [[p] for p in _parts(data, tasks, kafka_rows)]
        try:
            results = drive_writers(
                setup.plugin, setup.options, setup.sink_id, ep.epoch, parts, ep.setup(schema)
            )
        except BaseException:
            ep.discard()
            raise
        return Written(results, data.num_rows, time.perf_counter() - t0, "python")

    runtime = open_runtime(setup)
    if not stream:  # eosink.run's batch: every batch's rows in one epoch
        try:
            data = _all_rows(source, batches, rows)
            run_batch(runtime, BATCH_EPOCH, lambda ep: written(ep, data))
        finally:
            runtime.close()
            runtime.store.close()
        return
    ckpt = CheckpointDir(None, checkpoint)
    try:
        fn, _, _ = open_stream_batches(runtime, setup, ckpt, inline=False, max_pending_epochs=8)
    except BaseException:
        runtime.close()
        runtime.store.close()
        raise
    live = fn.live
    assert live is not None

    def write(batch: Any, ep: Any) -> Written:
        return written(ep, source(int(batch), rows))

    live.write = write
    try:
        for b in _micro_batches(checkpoint, batches):
            fn(b, b)
    finally:
        close_live(live)


def _main(a: list[str]) -> None:
    main(a[0], a[1], a[2], int(a[3]), int(a[4]), a[5], json.loads(a[6]) if len(a) > 6 else None)


def zygote() -> None:
    """Serve runs from a process that imported everything once: each line of standard input
    (JSON: ``argv``, ``env``, ``log``) forks a driver, which runs ``argv`` with ``env``
    added to the environment (``EOSINK_FAULT``, ``EOSINK_FAULT_MARK``), its output in
    ``log``; this prints ``pid <pid>`` when it started and ``exit <code>`` when it ended
    (``-9``: killed). A forked driver costs a few milliseconds where a new interpreter
    costs about 0.9 s of imports; what it does after the fork is the same."""
    import threading
    import traceback

    from eosink import faults
    from eosink.registry import get_sink

    # What a driver would import on its way: the plugins (entry points), pandas (pyarrow's
    # conversion of Python lists), Alembic (the meta store's migrations), PostgreSQL's driver.
    get_sink("file")
    get_sink("sql")
    get_sink("kafka")
    import confluent_kafka  # noqa: F401
    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

    batch_rows(0, 1)
    import alembic.command
    import alembic.runtime.migration  # noqa: F401

    assert threading.active_count() == 1, "no thread may run in the zygote: it forks"
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the driver
            code = 1
            try:
                fd = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                for k in [k for k in os.environ if k.startswith("EOSINK_FAULT")]:
                    del os.environ[k]
                os.environ.update(cmd["env"])
                faults._ARMED = faults._parse(os.environ.get("EOSINK_FAULT"))
                faults._SEEN.clear()
                _main(cmd["argv"])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        _main(sys.argv[1:])
