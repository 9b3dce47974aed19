"""docs/sql.md's change-data-capture recipe (Kafka -> Spark -> PostgreSQL), run as written.

Debezium-shaped change events (``op`` c/u/d, ``before``/``after``, a tombstone after each
delete) of a ``customers`` table go into a real Kafka topic, keyed by id. The recipe's code
block, taken from the document with only the addresses replaced (broker, topic, database,
table, checkpoint), runs in a driver subprocess (Spark's Kafka connector must be on a new
SparkContext's class path). A plain SQL query then compares the table with the state the
events leave: the last change of each id wins, deleted ids are gone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.crash  # a Spark driver subprocess, scheduled with the crash tests

ROOT = Path(__file__).resolve().parents[1]

DRIVER = """
import json, sys
import eosink
conf = json.loads(sys.argv[1])
spark = eosink.spark_session(
    "local[2]", **{k.replace(".", "__"): v for k, v in conf["spark"].items()}
)
spark.sparkContext.setLogLevel("ERROR")
ns = {"spark": spark, "eosink": eosink}
exec(compile(open(conf["recipe"]).read(), "docs/sql.md", "exec"), ns)
handle = ns["handle"]
handle.process_all_available()
handle.stop()
print("RECIPE DONE", flush=True)
"""


def run_recipe(recipe: str, page: str, spark_conf: dict[str, str], tmp_path: Path) -> None:
    """Run a recipe's code (``handle = eosink.run(...)``) in a Spark driver subprocess with
    ``spark_conf`` (Spark's Kafka connector) until its stream has processed all its input."""
    (tmp_path / "recipe.py").write_text(recipe)
    conf = {"spark": spark_conf, "recipe": str(tmp_path / "recipe.py")}
    from jvm import fast_driver_env

    env = fast_driver_env({**os.environ, "PYSPARK_PYTHON": sys.executable})
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER.replace("docs/sql.md", page), json.dumps(conf)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "RECIPE DONE" in proc.stdout, proc.stderr[-5000:]


def _recipe() -> str:
    text = (ROOT / "docs" / "sql.md").read_text()
    section = text[text.index("### A change-data-capture stream, Kafka to PostgreSQL") :]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "docs/sql.md: the recipe's code block is gone"
    return m.group(1)


def _events() -> tuple[list[tuple[str, dict[str, Any] | None]], dict[int, tuple[str, str]]]:
    """(key, Debezium value or None for a tombstone) in order; the final state by id."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    state: dict[int, tuple[str, str]] = {}

    def change(op: str, i: int, name: str | None = None) -> None:
        after = None if op == "d" else {"id": i, "name": name, "email": f"{name}@example.com"}
        out.append((str(i), {"op": op, "before": {"id": i}, "after": after, "source": {}}))
        if op == "d":
            out.append((str(i), None))
            state.pop(i, None)
        else:
            assert name is not None
            state[i] = (name, f"{name}@example.com")

    for i in range(40):
        change("r" if i < 10 else "c", i, f"c{i}")  # r: Debezium's snapshot read
    for rnd in range(3):
        for i in range(0, 40, 3):
            change("u", i, f"c{i}-v{rnd}")
        for i in range(rnd * 5, 40, 11):
            change("d", i)
        for i in range(rnd * 5, 40, 22):
            change("c", i, f"c{i}-back{rnd}")
    return out, state


def test_kafka_cdc_recipe_runs_as_written(
    kafka: Any, pg_url: str, spark_kafka_conf: dict[str, str], tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = f"shop.public.customers.{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2)
    events, state = _events()
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for key, value in events:
        producer.produce(topic, None if value is None else json.dumps(value).encode(), key.encode())
    assert producer.flush(60) == 0

    table = f"customers_{uuid.uuid4().hex[:8]}"
    eng = sa.create_engine(sa.engine.make_url(pg_url).set(drivername="postgresql+psycopg"))
    with eng.begin() as c:
        c.execute(
            sa.text(
                f"CREATE TABLE {table} "
                '(id BIGINT PRIMARY KEY, name TEXT, email TEXT, "offset" BIGINT)'
            )
        )

    recipe = _recipe()
    for old, new in (
        ('"broker:9092"', json.dumps(kafka.bootstrap)),
        ('"shop.public.customers"', json.dumps(topic)),
        ('"postgresql://app:secret@db:5432/crm"', json.dumps(pg_url)),
        ('table="customers"', f"table={json.dumps(table)}"),
        ('"s3://bucket/checkpoints/customers"', json.dumps(str(tmp_path / "ck"))),
        ("\neosink.run(\n", "\nhandle = eosink.run(\n"),
    ):
        assert old in recipe, f"docs/sql.md's recipe no longer has {old!r}: update this test"
        recipe = recipe.replace(old, new)
    run_recipe(recipe, "docs/sql.md", spark_kafka_conf, tmp_path)

    with eng.connect() as c:
        got = {
            r[0]: (r[1], r[2]) for r in c.execute(sa.text(f"SELECT id, name, email FROM {table}"))
        }
    eng.dispose()
    assert got == state
