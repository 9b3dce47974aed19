"""The Kafka broker fixture: a real Apache Kafka (KRaft) from Maven Central jars.

Proves the JVM artifact cache and the broker the Kafka sink's tests build on: a topic is
created, records are produced and consumed with confluent-kafka, and a committed and an
aborted transaction are read back with ``read_committed`` (only committed records appear)
and ``read_uncommitted`` (the aborted ones are there too).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from jvm import KAFKA_RUNTIME, MissingToolError, cache_root, fetch, java


def _consume(bootstrap: str, topic: str, isolation: str, partitions: int = 1) -> list[bytes]:
    """Every record of ``topic`` visible at ``isolation``, read to the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            msg = consumer.poll(30)
            assert msg is not None, f"{topic}: no record or end of partition in 30 s (got {got})"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_jar_cache_is_reused(kafka: Any) -> None:
    jars = fetch(KAFKA_RUNTIME)  # the fixture fetched them: this is a cache hit
    assert any(j.name.startswith("kafka_2.13-") for j in jars)
    assert all(cache_root() in j.parents for j in jars)


def test_missing_maven_or_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOSINK_JAR_CACHE", str(tmp_path / "jars"))  # nothing cached
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn, no java
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(MissingToolError, match=r"'mvn' is not installed.*apt-get install maven"):
        fetch(KAFKA_RUNTIME)
    with pytest.raises(MissingToolError, match=r"'java' is not installed.*Java 17"):
        java()


def test_produce_and_consume(kafka: Any) -> None:
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    sent = [f"r{i}".encode() for i in range(50)]
    for i, value in enumerate(sent):
        producer.produce(topic, value, key=str(i % 5).encode())
    assert producer.flush(30) == 0
    got = _consume(kafka.bootstrap, topic, "read_committed", partitions=2)
    assert sorted(got) == sorted(sent)


def test_read_committed_hides_aborted_transaction(kafka: Any) -> None:
    topic = f"tx-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, f"committed-a{i}".encode())
    producer.commit_transaction(60)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, f"aborted-{i}".encode())
    assert producer.flush(30) == 0  # the aborted records reach the log first
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(topic, b"committed-b0")
    producer.commit_transaction(60)

    committed = [b"committed-a0", b"committed-a1", b"committed-a2", b"committed-b0"]
    assert _consume(kafka.bootstrap, topic, "read_committed") == committed
    everything = _consume(kafka.bootstrap, topic, "read_uncommitted")
    assert everything == [*committed[:3], b"aborted-0", b"aborted-1", b"aborted-2", b"committed-b0"]
