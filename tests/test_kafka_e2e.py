"""End to end: Kafka -> Spark -> {Kafka, Iceberg, files}, exactly once under random SIGKILLs.

A source topic (2 partitions) is filled by confluent-kafka with the rows of
``harness.make_input`` as JSON values, in committed transactions. The crash job
(``crashjob.py --source kafka``) reads it as a stream with Spark's Kafka connector
(``kafka.isolation.level=read_committed``, ``maxOffsetsPerTrigger`` for several
micro-batches, ``availableNow``) and writes it through eosink; its driver is killed at random
instants and restarted until it finishes. Independent readers then see every id exactly once:
a ``read_committed`` consumer (the kafka sink: per key in source order, since one non-empty
key's records come from one source partition), pyiceberg (the iceberg sink, and no orphan file),
pyarrow (the file sink, and nothing staged).

The pipeline is the README's second example: ``eosink.run`` on the DataFrame of
``spark.readStream.format("kafka")``.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import Job, epoch_states, fill_topic, read_ids, run_with_random_kills
from test_kafka_crash import check_topic

pytestmark = pytest.mark.crash


# Kafka's source into the transactional Kafka sink (Kafka to Kafka, exactly once). The other
# sinks' flows do not depend on the source: their crash tests kill them at every point.
@pytest.mark.release
@pytest.mark.parametrize("sink", ["kafka"])
def test_kafka_to_sink_random_kills(kafka: Any, tmp_path: Path, sink: str) -> None:
    source = f"e2e-src-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(source, partitions=2)
    expected = fill_topic(kafka.bootstrap, source, files=4, rows=60)
    opts: dict[str, Any] = {}
    if sink == "kafka":
        target = f"e2e-out-{uuid.uuid4().hex[:10]}"
        kafka.create_topic(target, partitions=2)
        opts = {
            "bootstrap_servers": kafka.bootstrap,
            "topic": target,
            "staging_path": str(tmp_path / "staging"),
        }
    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'metastore.db'}",
        sink_options=opts,
        sink=sink,
        source="kafka",
        source_options=json.dumps(
            {"bootstrap_servers": kafka.bootstrap, "topic": source, "max_offsets": 20}
        ),
    )
    run_with_random_kills(job, random.Random(f"e2e-{sink}"), window=2.0, attempts=2)

    if sink == "kafka":
        # Per key in source order over the whole topic: a key's records sit in one source
        # partition, which one task reads in order, and epochs commit in order. Not for the
        # empty key: librdkafka's partitioner spreads empty keys over the source partitions.
        check_topic(job, expected, unordered=frozenset({b""}))
    elif sink == "iceberg":
        from test_iceberg import iceberg_rows, orphan_files

        ice = job.iceberg_options()
        rows = iceberg_rows(ice)
        assert sorted(r["id"] for r in rows) == expected
        assert all(r["payload"] == f"payload-{r['id']}" for r in rows)
        assert orphan_files(ice) == []
    else:
        assert read_ids(job.out) == expected
        assert job.output().staged() == []
    states = epoch_states(job.metastore, job.sink_id)
    assert set(states) == {"COMMITTED"}, states
    # Several micro-batches (maxOffsetsPerTrigger): the kills had epochs to land between.
    assert len(states["COMMITTED"]) >= 8, states
