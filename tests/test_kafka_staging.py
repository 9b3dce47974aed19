"""Where the kafka sink stages an epoch: defaults that hold on a cluster, and S3.

Real components only: the session's Apache Kafka broker, moto's S3 server process
(``s3_endpoint``), Spark drivers in process and in subprocesses (tests/crashjob.py, killed
with SIGKILL at fault points). Independent readers: a confluent-kafka ``read_committed``
consumer (every id exactly once), boto3 listing the bucket (nothing left staged), plain SQL
on the meta store (where each epoch's committable says its chunks were staged).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import make_input, read_topic, s3_client
from test_kafka_crash import ROWS, check_topic, kafka_job

import eosink
from eosink._staging import resolve_staging_path

S3_CREDS = {"s3_region": "us-east-1", "s3_access_key_id": "testing"}


def _kafka_options(**more: Any) -> Any:
    return eosink.get_sink("kafka").parse_options(
        {"bootstrap_servers": "127.0.0.1:9", "topic": "t", **more}
    )


def _s3(endpoint: str) -> dict[str, Any]:
    return {**S3_CREDS, "s3_endpoint_url": endpoint, "s3_secret_access_key": "testing"}


def _bucket(endpoint: str) -> str:
    name = f"stg-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def _objects(endpoint: str, bucket: str) -> list[str]:
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _roots(metastore: str, sink_id: str) -> set[str]:
    """The staging location each epoch's committable names (plain SQL, not eosink)."""
    import sqlalchemy as sa

    eng = sa.create_engine(metastore)
    try:
        with eng.connect() as c:
            rows = c.execute(
                sa.text("select committable from pending_sink_state where sink_id = :s"),
                {"s": sink_id},
            ).all()
    finally:
        eng.dispose()
    return {json.loads(bytes(r[0]))["root"] for r in rows if r[0] is not None}


def eosink_kafka_key(sink_id: str) -> str:
    from eosink_kafka.options import sink_key

    return sink_key(sink_id)


def _ids(records: list[Any]) -> list[int]:
    return sorted(json.loads(r.value)["id"] for r in records)


@pytest.fixture
def topic(kafka: Any) -> str:
    name = f"stg-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions=3)
    return name


def _rows(spark: Any, start: int, n: int) -> Any:
    return (
        spark.range(start, start + n, numPartitions=3)
        .selectExpr("cast(id % 7 as string) as key", "to_json(named_struct('id', id)) as value")
        .repartition(3, "key")
    )


# -- the defaults -------------------------------------------------------------------------


def test_default_staging_is_resolved_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream stages under its checkpoint location (s3a:// written s3://); a batch run on a
    local master in $EOSINK_HOME; on any other master an unset staging_path is refused. A
    given staging_path is kept, and the sink_id never depends on it."""
    plugin = eosink.get_sink("kafka")
    opts = _kafka_options(**{"kafka.linger.ms": "3"})
    assert opts.staging_path is None

    def resolve(checkpoint: str | None, master: Any) -> Any:
        return resolve_staging_path(
            opts, sink="kafka", checkpoint_location=checkpoint, master=master
        )

    def never() -> str:
        raise AssertionError("a stream needs no master")

    chk = tmp_path / "chk"
    for given in (str(chk), f"file://{chk}", f"file:{chk}", f"{chk}/"):
        got = resolve(given, never)
        assert got.staging_path == f"{chk}/eosink/staging", given
        assert got.producer_config == {"linger.ms": "3"}
        assert plugin.default_sink_id(got) == plugin.default_sink_id(opts) == "kafka:t"
    monkeypatch.chdir(tmp_path)  # a relative checkpoint is the driver's working directory's
    assert resolve("rel/chk", never).staging_path == f"{tmp_path}/rel/chk/eosink/staging"
    for given in ("s3a://bucket/chk", "s3://bucket/chk/", "s3n://bucket/chk"):
        assert resolve(given, never).staging_path == "s3://bucket/chk/eosink/staging"

    home = Path(os.environ["EOSINK_HOME"]).resolve()
    for master in ("local", "local[2]", "local[*]", "local[2,3]", None):
        assert resolve(None, master).staging_path == f"{home}/kafka-staging", master
    assert resolve(None, lambda: "local[4]").staging_path == f"{home}/kafka-staging"
    for master in (
        "spark://10.0.0.1:7077",
        "yarn",
        "k8s://https://api:6443",
        "local-cluster[2,1,1024]",
    ):
        with pytest.raises(eosink.ConfigError, match=r"Set staging_path .*s3://bucket/prefix"):
            resolve(None, master)
        with pytest.raises(eosink.ConfigError, match=r"master .*different machines"):
            resolve(None, lambda m=master: m)

    # Given: kept as given on any master (a shared mount is the user's word), and S3.
    shared = _kafka_options(staging_path=str(tmp_path / "nfs"))
    got = resolve_staging_path(
        shared, sink="kafka", checkpoint_location=None, master="spark://h:7077"
    )
    assert got is shared
    on_s3 = _kafka_options(staging_path="s3a://b/stage/", s3_endpoint_url="http://h:1")
    assert on_s3.staging_path == "s3://b/stage" and on_s3.staging_on_s3
    # Sinks without the option are untouched.
    file_opts = eosink.get_sink("file").parse_options({"path": str(tmp_path / "out")})
    assert (
        resolve_staging_path(file_opts, sink="file", checkpoint_location=None, master="yarn")
        is file_opts
    )

    # A derived location goes through the sink's own validation, before anything is written.
    with pytest.raises(eosink.ConfigError, match=r"hdfs://nn/chk/eosink/staging.*got hdfs://"):
        resolve("hdfs://nn/chk", never)
    spark_writer = _kafka_options(writer="spark", **_s3("http://h:1"))
    with pytest.raises(eosink.ConfigError, match=r"writer='spark' cannot stage on s3://"):
        resolve_staging_path(
            spark_writer, sink="kafka", checkpoint_location="s3a://b/chk", master=None
        )
    with pytest.raises(eosink.ConfigError, match=r"s3_endpoint_url.* only apply to staging on s3"):
        resolve_staging_path(spark_writer, sink="kafka", checkpoint_location=str(chk), master=None)
    # Refusals of given values, naming the field; secrets never shown.
    with pytest.raises(eosink.ConfigError, match=r"staging_path.*got hdfs://"):
        _kafka_options(staging_path="hdfs://nn/x")
    with pytest.raises(eosink.ConfigError, match=r"names no bucket"):
        _kafka_options(staging_path="s3://")
    with pytest.raises(eosink.ConfigError) as err:
        _kafka_options(staging_path=str(tmp_path), s3_secret_access_key="hunter2-secret")
    assert "only apply to staging on s3://" in str(err.value)
    assert "hunter2-secret" not in str(err.value)


def test_batch_default_staging_on_local_master(
    spark: Any, kafka: Any, topic: str, tmp_path: Path
) -> None:
    """eosink.run on local[2] without staging_path stages in $EOSINK_HOME/kafka-staging (as
    the committable records) and leaves nothing there."""
    metastore = f"sqlite:///{tmp_path / 'm.db'}"
    r = eosink.run(
        _rows(spark, 0, 500),
        sink="kafka",
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        metastore_url=metastore,
        epoch=1,
    )
    assert r.committed and r.rows == 500
    staging = Path(os.environ["EOSINK_HOME"]).resolve() / "kafka-staging"
    assert _roots(metastore, r.sink_id) == {str(staging)}
    assert _ids(read_topic(kafka.bootstrap, topic)) == list(range(500))
    key_dir = staging / eosink_kafka_key(r.sink_id)
    assert key_dir.is_dir() and not any(p.is_file() for p in key_dir.rglob("*"))


def test_stream_default_staging_under_checkpoint(
    spark: Any, kafka: Any, topic: str, tmp_path: Path
) -> None:
    """A stream without staging_path stages under <checkpoint>/eosink/staging, through
    eosink.run (Spark's writer) and format("eosink") (Python writers)."""
    make_input(tmp_path / "in", files=3, rows=100)
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
        .selectExpr("grp as key", "to_json(named_struct('id', id)) as value")
    )
    metastore = f"sqlite:///{tmp_path / 'm.db'}"
    chk = tmp_path / "chk"
    h = eosink.run(
        sdf,
        sink="kafka",
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        metastore_url=metastore,
        checkpoint_location=str(chk),
        trigger="availableNow",
    )
    h.await_termination()
    assert len(h.figures) == 3
    assert _roots(metastore, h.sink_id) == {f"{chk}/eosink/staging"}
    assert _ids(read_topic(kafka.bootstrap, topic)) == list(range(300))
    staged = chk / "eosink" / "staging" / eosink_kafka_key(h.sink_id)
    assert staged.is_dir() and not any(p.is_file() for p in staged.rglob("*"))

    other = f"fmt-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(other)
    chk2 = tmp_path / "chk2"
    q = (
        sdf.writeStream.format("eosink")
        .option("sink", "kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", other)
        .option("metastore_url", metastore)
        .option("checkpointLocation", str(chk2))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert _ids(read_topic(kafka.bootstrap, other)) == list(range(300))
    assert _roots(metastore, f"kafka:{other}") == {f"{chk2}/eosink/staging"}


def test_unshared_staging_is_refused_before_phase_1(kafka: Any, topic: str, tmp_path: Path) -> None:
    """A staging_path that is not shared (a local path on a cluster): the staged file a task
    on another host reported is not on the driver's disk, or not as written, and Spark's
    writer staged rows the driver does not find. Each is a SinkError saying so, raised
    before the epoch is persisted (pre_commit; the native path's check)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from eosink_kafka.coordinator import KafkaCoordinator

    opts = _kafka_options(
        bootstrap_servers=kafka.bootstrap, topic=topic, staging_path=str(tmp_path / "s")
    )
    coord = KafkaCoordinator(opts, "kafka:t")
    rel = f"{coord.key}/1/p00000-a0-x/part-00000.parquet"
    result = {"staged": rel, "rows": 3, "bytes": 0, "raw": 30, "host": "executor-7"}
    with pytest.raises(eosink.SinkError, match=r"written by a task on executor-7, is not there"):
        coord.pre_commit(1, [{"files": [result]}])
    (tmp_path / "s" / rel).parent.mkdir(parents=True)
    pq.write_table(pa.table({"value": ["a", "b", "c"]}), tmp_path / "s" / rel)
    size = (tmp_path / "s" / rel).stat().st_size
    with pytest.raises(eosink.SinkError, match=rf"has {size} bytes, not 0 .*is not shared"):
        coord.pre_commit(1, [{"files": [result]}])
    prepared = coord.pre_commit(1, [{"files": [{**result, "bytes": size}]}])
    assert prepared.committable["root"] == str(tmp_path / "s")
    assert prepared.committable["rows"] == 3
    with pytest.raises(eosink.SinkError, match=r"Spark staged 5 rows .* finds 3 there"):
        coord.check_spark_write(1, [{"files": [{**result, "bytes": size}]}], 5)
    coord.check_spark_write(1, [{"files": [{**result, "bytes": size}]}], 3)
    coord.close()


# -- staging on S3 ------------------------------------------------------------------------


def test_s3_staging_batch_and_stream(
    spark: Any, kafka: Any, topic: str, tmp_path: Path, s3_endpoint: str
) -> None:
    """staging_path=s3://bucket/prefix: Python writers upload each task's Parquet file, the
    coordinator reads the chunks back from S3 at commit and deletes them; batch, a stream
    restarted on its checkpoint, and format("eosink")."""
    bucket = _bucket(s3_endpoint)
    staging = f"s3://{bucket}/kafka/stage"
    metastore = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {
        "bootstrap_servers": kafka.bootstrap,
        "topic": topic,
        "staging_path": staging,
        "metastore_url": metastore,
        "chunk_bytes": 4096,  # several transactions per staged file
        **_s3(s3_endpoint),
    }
    r = eosink.run(_rows(spark, 0, 2000), sink="kafka", epoch=1, **opts)
    assert r.committed and r.rows == 2000 and r.files > 3
    assert r.figures is not None and r.figures.writer == "python"  # Spark has no s3://
    assert _roots(metastore, r.sink_id) == {staging}
    assert _ids(read_topic(kafka.bootstrap, topic)) == list(range(2000))
    assert _objects(s3_endpoint, bucket) == []
    again = eosink.run(_rows(spark, 0, 2000), sink="kafka", epoch=1, **opts)
    assert again.skipped
    assert len(read_topic(kafka.bootstrap, topic)) == 2000

    make_input(tmp_path / "in", files=3, rows=100)
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
        .selectExpr("grp as key", "to_json(named_struct('id', id + 10000)) as value")
    )
    stream_topic = f"s-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(stream_topic, partitions=2)
    sopts = {**opts, "topic": stream_topic}
    for files in (3, 1):
        if files == 1:  # restarted on the same checkpoint with one more input file
            make_input(tmp_path / "more", files=1, rows=50)
            (tmp_path / "more" / "in-000.parquet").rename(tmp_path / "in" / "in-999.parquet")
        h = eosink.run(
            sdf,
            sink="kafka",
            checkpoint_location=str(tmp_path / "chk"),
            trigger="availableNow",
            **sopts,
        )
        h.await_termination()
        assert len(h.figures) == files
    got = _ids(read_topic(kafka.bootstrap, stream_topic))
    assert got == sorted([i + 10000 for i in range(300)] + [i + 10000 for i in range(50)])
    assert _objects(s3_endpoint, bucket) == []

    fmt = f"f-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(fmt)
    w = (
        sdf.writeStream.format("eosink")
        .option("sink", "kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", fmt)
        .option("metastore_url", metastore)
        .option("checkpointLocation", str(tmp_path / "chk-fmt"))
    )
    for k, v in _s3(s3_endpoint).items():
        w = w.option(k, v)
    w.option("staging_path", staging).trigger(availableNow=True).start().awaitTermination()
    assert len(read_topic(kafka.bootstrap, fmt)) == 350
    assert _objects(s3_endpoint, bucket) == []

    # A bucket that does not exist: refused at the start, naming it.
    with pytest.raises(eosink.ConfigError, match=r"bucket 'no-such-bucket-[0-9a-f]+'"):
        eosink.run(
            _rows(spark, 0, 5),
            sink="kafka",
            **{**opts, "staging_path": f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/x"},
        )


@pytest.mark.cluster
def test_cluster_batch_needs_shared_staging(kafka: Any, tmp_path: Path, s3_endpoint: str) -> None:
    """On a multi-process cluster (local-cluster: executors in their own JVMs), a batch run
    without staging_path is refused before anything is written (no meta store, no staged
    file, nothing in the topic); with staging on S3 the executors' Python writers upload
    and the run publishes every row once."""
    metastore = tmp_path / "m.db"
    job, topic = kafka_job(
        kafka, tmp_path, "batch", f"sqlite:///{metastore}", master="local-cluster[2,1,1024]"
    )
    job.sink_options.pop("staging_path")
    expected = make_input(job.input, files=2, rows=ROWS)
    assert job.run() == 1, job.last_log()
    log = job.last_log()
    assert "eosink.errors.ConfigError" in log and "Set staging_path" in log, log
    assert not metastore.exists()
    assert job.kafka_staged() == []
    assert read_topic(kafka.bootstrap, topic) == []

    bucket = _bucket(s3_endpoint)
    job.sink_options.update(staging_path=f"s3://{bucket}/stage", **_s3(s3_endpoint))
    assert job.run() == 0, job.last_log()
    assert "EXECUTORS 2" in job.logs[-1]
    check_topic(job, expected)
    assert _objects(s3_endpoint, bucket) == []
