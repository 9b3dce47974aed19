"""docs/delta.md's change-data-capture recipe (Kafka -> Spark -> Delta), run as written.

The Debezium-shaped change events of tests/test_sql_recipe.py (``op`` c/r/u/d, ``before`` /
``after``, a tombstone after each delete) go into a real Kafka topic, keyed by id. The
recipe's code block, taken from the document with only the addresses replaced (broker, topic,
table, checkpoint), runs in a driver subprocess (Spark's Kafka connector must be on a new
SparkContext's class path). delta-rs then reads the table: the last change of each id wins,
deleted ids are gone.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_delta import delta_rows
from test_sql_recipe import _events, run_recipe

import eosink

pytestmark = pytest.mark.crash  # a Spark driver subprocess, scheduled with the crash tests

ROOT = Path(__file__).resolve().parents[1]


def _recipe() -> str:
    text = (ROOT / "docs" / "delta.md").read_text()
    section = text[text.index("### A change stream, Kafka to Delta") :]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "docs/delta.md: the recipe's code block is gone"
    return m.group(1)


def test_kafka_cdc_recipe_runs_as_written(
    kafka: Any, spark_kafka_conf: dict[str, str], tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = f"shop.public.customers.{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2)
    events, state = _events()
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for key, value in events:
        producer.produce(topic, None if value is None else json.dumps(value).encode(), key.encode())
    assert producer.flush(60) == 0

    path = tmp_path / "customers"
    recipe = _recipe()
    for old, new in (
        ('"broker:9092"', json.dumps(kafka.bootstrap)),
        ('"shop.public.customers"', json.dumps(topic)),
        ('"s3://lake/crm/customers"', json.dumps(str(path))),
        ('"s3a://lake/_checkpoints/customers"', json.dumps(str(tmp_path / "ck"))),
        ("\neosink.run(\n", "\nhandle = eosink.run(\n"),
    ):
        assert old in recipe, f"docs/delta.md's recipe no longer has {old!r}: update this test"
        recipe = recipe.replace(old, new)
    run_recipe(recipe, "docs/delta.md", spark_kafka_conf, tmp_path)
    rows = delta_rows(eosink.get_sink("delta").parse_options({"path": str(path)}))
    assert {r["id"]: (r["name"], r["email"]) for r in rows} == state
