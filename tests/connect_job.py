"""A Spark Connect client that the Connect tests run as a subprocess (tests/connect.py).

``python connect_job.py '{"url": "sc://127.0.0.1:PORT", "steps": [STEP, ...]}'`` connects to
the server and runs the steps one after the other in one session. Each step prints one line
``RESULT {"step": i, ...}`` or, when an exception escapes it, ``ERROR {"step": i, "class",
"module", "eosink_class", "message"}`` (``eosink_class``: the ``eosink.errors`` class the
exception is or, for Spark's exceptions that carry an eosink error as text, names); the
client then exits 3, unless the step says ``"expect_error": true`` (the next step runs).
``python connect_job.py --probe URL`` runs one trivial query (the server's readiness check).

A step (JSON object)::

    front       "run" (eosink.run) or "format" (format("eosink"))
    mode        "batch" or "stream"
    sink        "file", "iceberg", "kafka" or "sql"
    options     the sink's options (path, table, topic, partition_by, ...)
    metastore_url, sink_id, epoch (batch), checkpoint_location (stream): eosink's options
    input       a directory of Parquet files (``harness.make_input``: id, grp, payload),
                read as a batch or as a file stream (explicit schema, one file per
                micro-batch: ``max_files_per_trigger``, default 1)
    rows        batch: rows [[id, grp, payload], ...] instead of ``input``
    trigger     stream: eosink.run's trigger (a dict); format: DataStreamWriter.trigger's
                keyword arguments (default {"availableNow": true})
    end         stream: "await" (await_termination / awaitTermination), {"run_s": N} (run N
                seconds, then stop), {"until_committed": N} (eosink.run: run until the
                handle's ``committed_epochs()`` holds N epochs while the query runs, 180 s at
                most, then stop; the result's ``committed_while_running`` is what it held),
                or "forever" (sleep until the client is killed, whatever happens to the query)
    register    format: "eosink" (eosink.register_datasource(spark), default), "spark"
                (spark.dataSource.register(EosinkDataSource)) or "none" (nothing is
                registered: Spark's own lookup of installed data sources finds it)
    run_options more keyword arguments of eosink.run (commit_mode, new_checkpoint, ...;
                ``restart``: the keyword arguments of an ``eosink.RestartPolicy``)
    background  stream: start it and go on with the next step; the client finishes the
                background streams (as ``end`` says) after the last step, in order
    wait_for    a path: the step starts once it exists (the test says when)
    expect_error  go on with the next step if this one raises

Rows go to the file, iceberg and sql sinks as they are (3 Spark partitions); to the kafka sink as
tests/crashjob.py writes them (key = grp, value = the row as JSON, partitioned by key).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.pop("SPARK_REMOTE", None)
T0 = time.monotonic()


def probe(url: str) -> int:
    """One query through a bare Connect client (no SparkSession: 2 s of imports)."""
    import pyspark.sql.connect.proto as pb
    from pyspark.sql.connect.client import SparkConnectClient

    client = SparkConnectClient(url, retry_policy={"max_retries": 0})
    try:
        plan = pb.Plan(root=pb.Relation(range=pb.Range(start=0, end=3, step=1)))
        # pyspark 4 takes the observations too; 3.5 the plan alone.
        try:
            table, *_ = client.to_table(plan, {})
        except TypeError:
            table, *_ = client.to_table(plan)
        assert table.num_rows == 3, table
    finally:
        client.close()
    return 0


def _error(step: int, exc: BaseException) -> dict[str, Any]:
    import eosink.errors

    cls = type(exc)
    message = str(exc)
    if isinstance(exc, eosink.errors.EosinkError):
        eosink_class: str | None = cls.__name__
    else:
        found = re.findall(r"eosink\.errors\.([A-Za-z]+Error)\b", message)
        eosink_class = found[-1] if found else None
    return {
        "step": step,
        "t": round(time.monotonic() - T0, 1),
        "class": cls.__name__,
        "module": cls.__module__,
        "eosink_class": eosink_class,
        "message": message[:8000],
    }


def _input(spark: Any, step: dict[str, Any], stream: bool) -> Any:
    from crashjob import SCHEMA

    if stream:
        return (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", int(step.get("max_files_per_trigger", 1)))
            .parquet(step["input"])
        )
    if "rows" in step:
        return spark.createDataFrame([tuple(r) for r in step["rows"]], SCHEMA)
    return spark.read.schema(SCHEMA).parquet(step["input"])


def _rows(df: Any, step: dict[str, Any], batch: bool) -> Any:
    from crashjob import _kafka_rows

    if step.get("sink", "file") == "kafka":
        return _kafka_rows(df, batch=batch)
    return df.repartition(3) if batch else df


def _as_option(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _end_query(
    step: dict[str, Any], stop: Any, await_: Any, active: Any, committed: Any = None
) -> list[int]:
    """End the query as the step says; returns the committed epochs seen while it ran
    (``until_committed``), else []."""
    end = step.get("end", "await")
    if end == "await":
        await_()
    elif isinstance(end, dict) and "until_committed" in end:
        print("RUNNING", flush=True)
        deadline = time.monotonic() + 180
        seen: list[int] = []
        while time.monotonic() < deadline and active():
            seen = list(committed())
            if len(seen) >= int(end["until_committed"]):
                break
            time.sleep(0.2)
        stop()
        return seen
    elif end == "forever":  # until the test kills this client; never reacts to the query
        print("RUNNING", flush=True)
        while True:
            time.sleep(1)
    else:
        deadline = time.monotonic() + float(end["run_s"])
        print("RUNNING", flush=True)
        while time.monotonic() < deadline and active():
            time.sleep(0.2)
        stop()
    return []


Finish = Callable[[], dict[str, Any]]


def run_step(spark: Any, step: dict[str, Any]) -> Finish:
    """Start the step; return what finishes it (ends a stream as ``end`` says) and gives
    its result. A batch step is done when this returns."""
    import eosink

    if step.get("wait_for"):
        deadline = time.monotonic() + 600
        while not os.path.exists(step["wait_for"]) and time.monotonic() < deadline:
            time.sleep(0.1)
    sink = step.get("sink", "file")
    core = {k: step[k] for k in ("metastore_url", "sink_id") if k in step}
    stream = step["mode"] == "stream"
    df = _rows(_input(spark, step, stream), step, batch=not stream)
    if step["front"] == "run":
        opts = {**step.get("options", {}), **core, **step.get("run_options", {})}
        if isinstance(opts.get("restart"), dict):
            opts["restart"] = eosink.RestartPolicy(**opts["restart"])
        if not stream:
            r = eosink.run(df, sink=sink, epoch=step.get("epoch"), **opts)
            return lambda: {"batch": _asdict(r)}
        h = eosink.run(
            df,
            sink=sink,
            checkpoint_location=step["checkpoint_location"],
            trigger=step.get("trigger", {"availableNow": True}),
            **opts,
        )
        print(f"STARTED {h.id} t={time.monotonic() - T0:.1f}", flush=True)

        def finish_run() -> dict[str, Any]:
            seen = _end_query(
                step, h.stop, h.await_termination, lambda: h.is_active, h.committed_epochs
            )
            return {
                "committed_while_running": seen,
                "query_id": h.id,
                "figures": [f.as_dict() for f in h.figures],
                "committed_epochs": list(h.committed_epochs()),
                "restarts": h.restarts,
                "observed_rows": _observed_rows(h.query.recentProgress),
            }

        return finish_run
    register = step.get("register", "eosink")
    if register == "eosink":
        eosink.register_datasource(spark)
    elif register == "spark":
        from eosink._datasource import EosinkDataSource

        spark.dataSource.register(EosinkDataSource)
    w = (df.writeStream if stream else df.write).format("eosink").option("sink", sink)
    for k, v in {**step.get("options", {}), **core}.items():
        w = w.option(k, _as_option(v))
    if not stream:
        if step.get("epoch") is not None:
            w = w.option("epoch", str(step["epoch"]))
        w.mode("append").save()
        return lambda: {"batch": "saved"}
    q = (
        w.option("checkpointLocation", step["checkpoint_location"])
        .trigger(**step.get("trigger", {"availableNow": True}))
        .start()
    )
    print(f"STARTED {q.id} t={time.monotonic() - T0:.1f}", flush=True)

    def finish_format() -> dict[str, Any]:
        _end_query(step, q.stop, q.awaitTermination, lambda: q.isActive)
        progress = [_progress(p) for p in q.recentProgress]
        return {"query_id": q.id, "batches": [p["batchId"] for p in progress]}

    return finish_format


def _observed_rows(progress: list[Any]) -> list[int]:
    """The rows of eosink's observed metrics ("eosink") in each micro-batch's progress that
    has them. Over Spark Connect (pyspark 4.3) the client's progress has no
    ``numInputRows`` and gives an observed metric as ``Row(values=[...], schema=...)``."""
    out: list[int] = []
    for p in progress:
        observed = (p.get("observedMetrics") if isinstance(p, dict) else p.observedMetrics) or {}
        row = observed.get("eosink")
        if row is None:
            continue
        d = row if isinstance(row, dict) else row.asDict()
        out.append(int(d["rows"] if "rows" in d else d["values"][0]))
    return out


def _progress(p: Any) -> dict[str, Any]:
    """A StreamingQueryProgress (an object over Spark Connect, a dict on classic) as a dict."""
    return p if isinstance(p, dict) else {"batchId": p.batchId}


# Spark waits 10 s, hard-coded (PythonWorkerFactory.createSimpleWorker), for a Python worker
# it starts without the daemon to connect back: Spark Connect's foreachBatch worker, which
# imports pyspark's Connect client first. On a loaded 2-core machine that can take longer,
# and the stream's start fails. A user would start the query again; so does this client
# (4 times at most, each retry printed as RETRY), and the test goes on.
_NO_WORKER = "Python worker failed to connect back"
_RETRIES = 4


def start_step(spark: Any, step: dict[str, Any], i: int) -> Finish:
    for retry in range(_RETRIES + 1):
        try:
            return run_step(spark, step)
        except Exception as exc:
            if _NO_WORKER not in str(exc) or retry == _RETRIES:
                raise
            print(f"RETRY {i} {_NO_WORKER}", flush=True)
            time.sleep(2)
    raise AssertionError("unreachable")


def _asdict(r: Any) -> dict[str, Any]:
    import dataclasses

    out = dataclasses.asdict(r)
    return json.loads(json.dumps(out, default=str))


def main() -> int:
    if sys.argv[1] == "--probe":
        return probe(sys.argv[2])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    for noisy in ("py4j", "grpc", "pyspark", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spec = json.loads(sys.argv[1])
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(spec["url"]).getOrCreate()
    print(f"CONNECTED {spark.version} t={time.monotonic() - T0:.1f}", flush=True)
    code = 0
    background: list[tuple[int, dict[str, Any], Finish]] = []

    def attempt(i: int, step: dict[str, Any], action: Callable[[], Any]) -> Any:
        try:
            return action()
        except Exception as exc:
            print("ERROR", json.dumps(_error(i, exc)), flush=True)
            logging.getLogger("connect_job").exception("step %d failed", i)
            if not step.get("expect_error"):
                raise SystemExit(3) from None
            return None

    def report(i: int, result: dict[str, Any] | None) -> None:
        if result is not None:
            out = {"step": i, "t": round(time.monotonic() - T0, 1), **result}
            print("RESULT", json.dumps(out, default=str), flush=True)

    try:
        for i, step in enumerate(spec["steps"]):
            finish = attempt(i, step, functools.partial(start_step, spark, step, i))
            if finish is None:
                continue
            if step.get("background"):
                background.append((i, step, finish))
            else:
                report(i, attempt(i, step, finish))
        for i, step, finish in background:
            report(i, attempt(i, step, finish))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    # Not spark.stop(): it would release the session on the server, and a test may want to
    # see what a client's end (or death) leaves running there.
    return code


if __name__ == "__main__":
    sys.exit(main())
