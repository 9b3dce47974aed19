"""Kafka as a Spark source: Spark's Kafka connector of pyspark's line
(``jvm.spark_kafka_coordinates()``).

Records are produced with confluent-kafka into a real broker: two committed transactions with
an aborted one between them, over two partitions. A Spark driver with the connector's jars
(a subprocess: this process's workers may already run a SparkContext without them) reads
the topic as a stream with ``kafka.isolation.level=read_committed`` and sees exactly the
committed records, with their keys, headers and per-partition order; a batch read with
``read_uncommitted`` sees the aborted ones too (the option is what hides them). Spark's own
Kafka sink, batch and streaming, copies the committed records to other topics, read back
with confluent-kafka.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from jvm import fast_driver_env, spark_kafka_coordinates, spark_kafka_jars

DRIVER = r"""
import json, sys
import eosink

bootstrap, topic, out, conf_json, result = sys.argv[1:6]
conf = {k.replace(".", "__"): v for k, v in json.loads(conf_json).items()}
spark = eosink.spark_session("local[2]", app_name="kafka-source", **conf)


def reader(r, isolation):
    return (
        r.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", isolation)
    )


def rows(df):
    got = df.selectExpr(
        "partition", "offset", "cast(key as string) as key", "cast(value as string) as value",
        "transform(headers, h -> concat(h.key, '=', cast(h.value as string))) as headers",
    ).collect()
    return [r.asDict() for r in got]


sdf = reader(spark.readStream, "read_committed").option("includeHeaders", "true").load()
q = (
    sdf.writeStream.format("memory").queryName("committed")
    .option("checkpointLocation", out + "/chk-memory").trigger(availableNow=True).start()
)
q.awaitTermination()
streamed = rows(spark.table("committed"))

everything = rows(reader(spark.read, "read_uncommitted").option("includeHeaders", "true").load())

committed = reader(spark.read, "read_committed").load().selectExpr("key", "value")
committed.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
    "topic", topic + "-batch-copy"
).save()
q = (
    reader(spark.readStream, "read_committed").load().selectExpr("key", "value")
    .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    .option("topic", topic + "-stream-copy").option("checkpointLocation", out + "/chk-kafka")
    .trigger(availableNow=True).start()
)
q.awaitTermination()
jars = spark.sparkContext.getConf().get("spark.jars")
spark.stop()
with open(result, "w") as f:
    json.dump({"streamed": streamed, "everything": everything, "jars": jars}, f)
"""


def _produce(bootstrap: str, topic: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Committed transaction A (20 records), aborted transaction (6 records, flushed to the
    log first), committed transaction B (4 records); records alternate between the two
    partitions. Returns the committed (key, value) pairs in production order and the
    aborted values."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"src-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(60)
    committed: list[tuple[str, str]] = []
    aborted: list[str] = []

    def tx(prefix: str, n: int, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(n):
            key, value = f"k{i % 3}", f"{prefix}{i}"
            producer.produce(
                topic, value.encode(), key=key.encode(), partition=i % 2, headers=[("src", b"t")]
            )
            if commit:
                committed.append((key, value))
            else:
                aborted.append(value)
        if commit:
            producer.commit_transaction(60)
        else:
            assert producer.flush(30) == 0  # the aborted records reach the log first
            producer.abort_transaction(60)

    tx("a", 20, commit=True)
    tx("x", 6, commit=False)
    tx("b", 4, commit=True)
    return committed, aborted


def _consume(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """Every (key, value) of a one-partition ``topic`` with ``read_committed``, to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[str, str]] = []
    try:
        while True:
            msg = consumer.poll(30)
            assert msg is not None, f"{topic}: nothing in 30 s (got {got})"
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                return got
            key, value = msg.key(), msg.value()
            assert isinstance(key, bytes) and isinstance(value, bytes)
            got.append((key.decode(), value.decode()))
    finally:
        consumer.close()


def test_connector_jars_leave_out_what_pyspark_ships() -> None:
    import pyspark

    jars = spark_kafka_jars()
    names = {j.name for j in jars}
    _, artifact, version = spark_kafka_coordinates().split(":")
    assert f"{artifact}-{version}.jar" in names
    line = ".".join(pyspark.__version__.split(".")[:2])
    # the running line's own connector, or (4.3: none on Maven Central yet) an older line's
    assert tuple(map(int, version.split(".")[:2])) <= tuple(map(int, line.split(".")))
    assert any(n.startswith("kafka-clients-") for n in names)
    shipped = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert not any(n.startswith(("scala-library-", "hadoop-client-", "slf4j-api-")) for n in names)
    assert not names & shipped
    assert spark_kafka_jars() is jars  # cached


def test_spark_reads_only_committed_records(
    kafka: Any, spark_kafka_conf: dict[str, str], tmp_path: Path
) -> None:
    topic = f"src-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}-batch-copy")
    kafka.create_topic(f"{topic}-stream-copy")
    committed, aborted = _produce(kafka.bootstrap, topic)

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYSPARK_SUBMIT_ARGS", None)  # the CDS archive is for pyspark's classpath alone
    env = fast_driver_env(env, archive="0")  # a short-lived driver: C1 JIT, no archive
    result = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            kafka.bootstrap,
            topic,
            str(tmp_path),
            json.dumps(spark_kafka_conf),
            str(result),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = json.loads(result.read_text())
    assert spark_kafka_coordinates().split(":")[1] in got["jars"]

    streamed = got["streamed"]
    # Exactly the committed records, once each, with their keys and headers.
    assert sorted((r["key"], r["value"]) for r in streamed) == sorted(committed)
    assert all(r["headers"] == ["src=t"] for r in streamed)
    assert {r["partition"] for r in streamed} == {0, 1}
    # Per partition, in production order (offsets rise; transaction markers leave gaps).
    order = {value: i for i, (_, value) in enumerate(committed)}
    for part in (0, 1):
        mine = sorted((r for r in streamed if r["partition"] == part), key=lambda r: r["offset"])
        assert [order[r["value"]] for r in mine] == sorted(order[r["value"]] for r in mine)
    # read_uncommitted sees the aborted records as well: the isolation level is what hid them.
    assert sorted(r["value"] for r in got["everything"]) == sorted(
        [v for _, v in committed] + aborted
    )

    # Spark's own Kafka sink (batch and streaming) wrote the committed records once each.
    for suffix in ("batch-copy", "stream-copy"):
        assert sorted(_consume(kafka.bootstrap, f"{topic}-{suffix}")) == sorted(committed), suffix
