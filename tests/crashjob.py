"""A Spark driver program that the crash tests start, kill with SIGKILL and restart.

It writes the Parquet files of --input to a sink (file, iceberg, kafka, sql or delta) exactly
once, as a batch job (one explicit epoch) or a stream (one micro-batch per input file), through
``eosink.run`` (modes ``batch``, ``stream``) or ``format("eosink")`` (``ds-batch``,
``ds-stream``), then exits 0.
With ``--source kafka`` the stream reads a Kafka topic instead (Spark's Kafka connector,
``read_committed``, a few records per micro-batch; the connector's jars come with
``--jars``). It prints nothing the tests rely on; they check the output with independent
readers.

The kafka sink writes ``key = grp`` and ``value = to_json(struct(id, grp, payload))``; rows
are hash-partitioned by ``grp`` into 3 Spark partitions, so the records of one key come from
one partition, in ascending ``id`` within an epoch (a batch sorts within partitions; a
stream's micro-batch reads one file in one task, in file order).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable


def _hold(batches):  # type: ignore[no-untyped-def]
    """Executor side of ``CRASHJOB_HOLD=<file>``: the first non-empty Arrow batch of the run
    passes (it claims ``<file>.first``); every later one waits while ``file`` exists (120 s
    at most), so a test can keep this driver inside its stream until something else
    happened (tests/harness.py ``run_overlapping``)."""
    path = os.environ.get("CRASHJOB_HOLD", "")
    for b in batches:
        if path and b.num_rows:
            try:
                os.close(os.open(path + ".first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                deadline = time.monotonic() + 120
                while os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.05)
        yield b


SCHEMA = "id long, grp string, payload string"


def _kafka_source(spark, a):  # type: ignore[no-untyped-def]
    """The rows of the JSON values of a Kafka topic (``--source-options``: bootstrap_servers,
    topic, max_offsets per micro-batch), read with ``read_committed``."""
    src = json.loads(a.source_options)
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", src["bootstrap_servers"])
        .option("subscribe", src["topic"])
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("maxOffsetsPerTrigger", int(src.get("max_offsets", 100)))
        .load()
    )
    return raw.selectExpr(f"from_json(CAST(value AS STRING), '{SCHEMA}') AS r").select("r.*")


def _sql_rows(df, opts):  # type: ignore[no-untyped-def]
    """The sql sink's change stream: with ``op_column`` "op", every 7th id is a delete."""
    if opts.get("op_column") != "op":
        return df
    from pyspark.sql import functions as F

    return df.withColumn("op", F.when(F.col("id") % 7 == 0, "d").otherwise("u"))


def _kafka_rows(df, batch: bool):  # type: ignore[no-untyped-def]
    """The columns of the kafka sink: key = grp, value = the row as JSON; one key's rows in
    one Spark partition, by ascending id within it."""
    df = df.repartition(3, "grp")
    if batch:
        df = df.sortWithinPartitions("id")
    return df.selectExpr("grp AS key", "to_json(struct(id, grp, payload)) AS value")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["batch", "stream", "ds-stream", "ds-batch"], required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--metastore", required=True)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--commit-mode", default="after_checkpoint")
    p.add_argument("--partition-by", default="")
    p.add_argument("--format", default="parquet")
    p.add_argument("--sink", default="file", choices=["file", "iceberg", "kafka", "sql", "delta"])
    p.add_argument("--source", default="files", choices=["files", "kafka"])
    p.add_argument(
        "--source-options",
        default="{}",
        help='--source kafka: {"bootstrap_servers": ..., "topic": ..., "max_offsets": 100}',
    )
    p.add_argument("--jars", default="", help="spark.jars of the driver (Kafka connector)")
    p.add_argument("--writer", default="", help="the sink's writer option (default: its own)")
    p.add_argument("--catalog-uri", default="", help="iceberg: SQL catalog URL (default SQLite)")
    p.add_argument("--catalog-json", default="", help="iceberg: all catalog properties, JSON")
    p.add_argument(
        "--sink-options",
        default="",
        help="more options of the sink as a JSON object, merged over the ones built above "
        '(\'{"path": "s3://bucket/prefix", "max_row_count": 600}\')',
    )
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    import eosink

    conf = {"spark__jars": a.jars} if a.jars else {}
    spark = eosink.spark_session(a.master, app_name="eosink-crashjob", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    # Executors registered with the driver (the driver itself is not counted). On a
    # local-cluster master they register asynchronously: wait for all of them (60 s at most).
    wanted = int(a.master.split("[", 1)[1].split(",", 1)[0]) if "cluster" in a.master else 0
    deadline = time.monotonic() + 60
    while True:
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        if executors >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(f"EXECUTORS {executors}", flush=True)
    print(f"SPARK {spark.version}", flush=True)
    schema = SCHEMA
    # "default": eosink's own default meta store ($EOSINK_HOME, else ~/.eosink: the machine's)
    opts: dict[str, object] = {} if a.metastore == "default" else {"metastore_url": a.metastore}
    if a.sink == "file":
        opts.update(path=a.out, format=a.format)
    elif a.sink in ("kafka", "sql"):
        pass  # bootstrap_servers, topic... / url, table...: --sink-options
    elif a.sink == "delta":
        opts["path"] = a.out
    else:
        opts["table"] = "db.events"
        if a.catalog_json:
            opts["catalog"] = json.loads(a.catalog_json)
        elif a.catalog_uri:
            opts["catalog"] = {"type": "sql", "uri": a.catalog_uri, "warehouse": f"file://{a.out}"}
        else:
            opts["warehouse"] = a.out
    if a.partition_by:
        opts["partition_by"] = a.partition_by.split(",")
    if a.writer:
        opts["writer"] = a.writer
    if a.sink_options:
        opts.update(json.loads(a.sink_options))
    if a.mode in ("batch", "ds-batch"):
        df = spark.read.schema(schema).parquet(a.input)
        df = _kafka_rows(df, batch=True) if a.sink == "kafka" else _sql_rows(df, opts)
        df = df if a.sink == "kafka" else df.repartition(3)
        if a.mode == "batch":
            r = eosink.run(df, sink=a.sink, epoch=5, **opts)
            print("RESULT", r, flush=True)
        else:
            w = df.write.format("eosink").option("sink", a.sink).option("epoch", "5")
            for k, v in opts.items():
                w = w.option(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v))
            w.mode("append").save()
    elif a.mode == "stream":
        if a.source == "kafka":
            sdf = _kafka_source(spark, a)
        else:
            sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(a.input)
        if os.environ.get("CRASHJOB_HOLD"):
            sdf = sdf.mapInArrow(_hold, schema)
        if a.sink == "kafka":
            sdf = _kafka_rows(sdf, batch=False)
        sdf = _sql_rows(sdf, opts)
        h = eosink.run(
            sdf,
            sink=a.sink,
            checkpoint_location=a.checkpoint,
            trigger={"availableNow": True},
            commit_mode=a.commit_mode,
            **opts,
        )
        h.await_termination()
        print("RESULT", [f.as_dict() for f in h.figures], flush=True)
    else:
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(a.input)
        if a.sink == "kafka":
            sdf = _kafka_rows(sdf, batch=False)
        sdf = _sql_rows(sdf, opts)
        w = sdf.writeStream.format("eosink").option("sink", a.sink)
        for k, v in opts.items():
            w = w.option(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v))
        q = w.option("checkpointLocation", a.checkpoint).trigger(availableNow=True).start()
        q.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
