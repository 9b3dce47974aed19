"""``eosink demo``: an end-to-end run on embedded defaults that verifies what it wrote."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["demo"]


def _say(msg: str) -> None:
    print(f"[eosink demo] {msg}", flush=True)


def _target(sink: str, out: Path, name: str, kafka: str | None = None) -> dict[str, Any]:
    if sink == "iceberg":
        return {
            "table": f"demo.{name}",
            "warehouse": str(out / "warehouse"),
            "partition_by": ["country"],
        }
    if sink == "kafka":
        return {
            "bootstrap_servers": kafka,
            "topic": _kafka_topic(out, name),
            "staging_path": str(out / "kafka-staging"),
        }
    return {"path": str(out / name), "partition_by": ["country"]}


def _kafka_topic(out: Path, name: str) -> str:
    import hashlib

    return f"eosink-demo-{name}-{hashlib.sha1(str(out).encode()).hexdigest()[:8]}"


def _kafka_ids(bootstrap: str, topic: str) -> list[int]:
    """Every record of ``topic`` a ``read_committed`` consumer sees (to the end of each
    partition): the ids in their JSON values."""
    import json
    import uuid

    from confluent_kafka import Consumer, KafkaError

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"eosink-demo-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        parts = len(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.subscribe([topic])
        ids: list[int] = []
        eof: set[int] = set()
        while len(eof) < parts:
            m = c.poll(30)
            if m is None:
                raise RuntimeError(f"no record and no end of partition of {topic} in 30 s")
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(str(err))
                eof.add(int(m.partition() or 0))
                continue
            eof.discard(int(m.partition() or 0))
            ids.append(int(json.loads(m.value() or b"{}")["id"]))
        return ids
    finally:
        c.close()


def _read_ids(
    sink: str, out: Path, name: str, kafka: str | None = None
) -> tuple[list[int], list[str]]:
    """Ids read back by an independent reader, and data files no reader should see."""
    if sink == "kafka":
        assert kafka is not None
        staged = [str(p) for p in (out / "kafka-staging").rglob("*") if p.is_file()]
        return sorted(_kafka_ids(kafka, _kafka_topic(out, name))), staged
    if sink == "iceberg":
        from pyiceberg.catalog import load_catalog

        from .registry import get_sink

        opts = get_sink("iceberg").parse_options(_target(sink, out, name))
        table = load_catalog(opts.catalog_name, **opts.catalog_properties()).load_table(
            f"demo.{name}"
        )
        ids = table.scan().to_arrow().column("id").to_pylist()
        live = {f["file_path"].split("://")[-1] for f in table.inspect.files().to_pylist()}
        data = Path(table.location().split("://")[-1]) / "data"
        orphans = [str(p) for p in data.rglob("*.parquet") if str(p) not in live]
        return sorted(ids), orphans
    import pyarrow.dataset as ds

    t = ds.dataset(out / name, format="parquet", partitioning="hive").to_table()
    staged = [str(p) for p in (out / name).rglob("_eosink_staging/**/*") if p.is_file()]
    return sorted(t.column("id").to_pylist()), staged


def _spark_log_level(spark: Any) -> str:
    """The root level of Spark's log4j, as the JVM has it (``?`` if it cannot be read)."""
    try:
        jvm = spark.sparkContext._jvm
        return str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
    except Exception:
        return "?"


def demo(
    sink: str,
    workdir: str | None,
    *,
    rows: int,
    batches: int,
    bootstrap_servers: str | None = None,
) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from . import BatchResult, StreamingHandle, run, spark_session
    from .errors import ConfigError

    if sink == "kafka" and not bootstrap_servers:
        raise ConfigError(
            "the kafka demo writes to a Kafka broker you run (it starts none): pass "
            "--bootstrap-servers host:port. A broker on this machine, e.g.: docker run -d "
            "-p 9092:9092 apache/kafka:4.1.1 (then --bootstrap-servers localhost:9092); "
            "see docs/kafka.md"
        )
    if sink != "kafka" and bootstrap_servers:
        raise ConfigError("--bootstrap-servers is for --sink kafka")

    base = Path(workdir or tempfile.mkdtemp(prefix="eosink-demo-")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{base / 'metastore.db'}"
    inp, out, chk = base / "input", base / "output", base / "checkpoint"
    inp.mkdir(exist_ok=True)
    _say(f"working directory {base}; meta store {url}")
    per = max(1, rows // batches)
    for i in range(batches):
        ids = list(range(i * per, (i + 1) * per))
        pq.write_table(
            pa.table(
                {
                    "id": ids,
                    "country": [("fr", "de", "us/ca")[j % 3] for j in ids],
                    "amount": [j * 0.5 for j in ids],
                }
            ),
            inp / f"part-{i:03d}.parquet",
        )
    total = per * batches
    _say(f"input: {batches} Parquet files, {total} rows")
    t0 = time.time()
    spark = spark_session(app_name="eosink-demo")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    _say(
        f"Spark {spark.version} started in {time.time() - t0:.1f}s ({spark.sparkContext.master}); "
        f"Spark's own log level {_spark_log_level(spark)} (EOSINK_SPARK_LOG_LEVEL=WARN or INFO "
        "shows more)"
    )

    # 1. Batch: an explicit epoch makes the job idempotent.
    df = spark.read.parquet(str(inp))
    schema = df.schema
    if sink == "kafka":
        assert bootstrap_servers is not None
        _kafka_topics(bootstrap_servers, [_kafka_topic(out, n) for n in ("batch", "stream")])
        # Spark's Kafka sink columns: a key and a value (the row as JSON).
        df = df.selectExpr("country AS key", "to_json(struct(*)) AS value")
    batch_target = _target(sink, out, "batch", bootstrap_servers)
    r = run(df, sink=sink, epoch=1, metastore_url=url, **batch_target)
    assert isinstance(r, BatchResult)
    _say(f"batch: epoch {r.epoch} committed, {r.rows} rows in {r.files} files")
    r2 = run(df, sink=sink, epoch=1, metastore_url=url, **batch_target)
    assert isinstance(r2, BatchResult)
    _say(f"batch re-run of epoch {r2.epoch}: skipped={r2.skipped} (nothing written twice)")

    # 2. Streaming: one micro-batch per input file, phase 2 after Spark's checkpoint.
    sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(inp))
    if sink == "kafka":
        sdf = sdf.selectExpr("country AS key", "to_json(struct(*)) AS value")
    h = run(
        sdf,
        sink=sink,
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        metastore_url=url,
        **_target(sink, out, "stream", bootstrap_servers),
    )
    assert isinstance(h, StreamingHandle)
    h.await_termination()
    for f in h.figures:
        _say(
            f"stream epoch {f.epoch}: {f.rows} rows, pre_commit {f.pre_commit_ms:.1f} ms, "
            f"commit {f.commit_ms:.1f} ms, visible {f.visibility_lag_s * 1000:.0f} ms after "
            "the batch"
        )

    # 3. Verify with an independent reader (pyarrow, or a pyiceberg scan).
    ok = True
    leftovers: list[str] = []
    for name in ("batch", "stream"):
        ids, left = _read_ids(sink, out, name, bootstrap_servers)
        leftovers += left
        good = ids == list(range(total))
        ok &= good
        _say(f"verify {name}: {len(ids)} rows read back, {'exactly once' if good else 'MISMATCH'}")
    what = "unreferenced data files" if sink == "iceberg" else "staged files"
    if sink == "kafka":
        _say(f"read back with a read_committed consumer from {bootstrap_servers}")
    _say(f"{what} left behind: {len(leftovers)}")
    ok &= not leftovers
    spark.stop()
    _say("OK: every row landed exactly once" if ok else "FAILED")
    _say(f"inspect the meta store with: eosink status --metastore-url '{url}'")
    return 0 if ok else 1


def _kafka_topics(bootstrap: str, names: list[str]) -> None:
    """Create the demo's topics (3 partitions) unless they exist: the sink never creates
    data topics, the demo does it for you."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    have = admin.list_topics(timeout=30).topics
    new = [NewTopic(n, num_partitions=3, replication_factor=-1) for n in names if n not in have]
    for name, fut in (admin.create_topics(new) if new else {}).items():
        fut.result(timeout=30)
        _say(f"created topic {name} (3 partitions)")
