"""The kafka sink on a real Apache Kafka broker (KRaft), in process.

Independent readers are plain confluent-kafka consumers (``read_committed`` and
``read_uncommitted``) reading every partition to its end. The crash matrix with real SIGKILLs
is tests/test_kafka_crash.py; Kafka as the source, tests/test_kafka_e2e.py.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from harness import status_json

import eosink
from eosink.faults import SimulatedCrash, simulate
from eosink.testing import SinkConformance
from eosink.util import sink_key


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Any]:
    """Every record of ``topic`` visible at ``isolation``, read to the end of every partition.

    Returns ``(partition, key, value, headers)`` tuples in offset order per partition.
    """
    from confluent_kafka import Consumer, KafkaError

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    parts = len(c.list_topics(topic, timeout=30).topics[topic].partitions)
    c.subscribe([topic])
    out: list[Any] = []
    eof: set[int] = set()
    try:
        while len(eof) < parts:
            m = c.poll(30)
            assert m is not None, f"{topic}: nothing and no end of partition in 30 s"
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                eof.add(m.partition())
                continue
            eof.discard(m.partition())
            out.append((m.partition(), m.key(), m.value(), m.headers()))
    finally:
        c.close()
    return out


def _ids(records: list[Any]) -> list[int]:
    return [json.loads(v)["id"] for _, _, v, _ in records]


@pytest.fixture
def topic(kafka: Any) -> str:
    name = f"out-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions=3)
    return name


def _opts(kafka: Any, topic: str | None, tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {
        "bootstrap_servers": kafka.bootstrap,
        "topic": topic,
        "staging_path": str(tmp_path / "staging"),
        "metastore_url": f"sqlite:///{tmp_path / 'm.db'}",
        **more,
    }


def _events(spark: Any, n: int, parts: int = 4, keys: int = 10) -> Any:
    return (
        spark.range(0, n, numPartitions=parts)
        .selectExpr(
            f"cast(id % {keys} as string) as key",
            "to_json(named_struct('id', id, 'pad', repeat('x', 40))) as value",
            "array(named_struct('key', 'id', 'value', cast(cast(id as string) as binary))) "
            "as headers",
            "id",
        )
        .repartition(parts, "key")
        .sortWithinPartitions("id")
        .drop("id")
    )


def test_batch_every_record_once_in_order_with_headers(
    spark: Any, kafka: Any, topic: str, tmp_path: Path
) -> None:
    n = 3000
    # Small chunks: many transactions per slot, chunks of one Spark partition in order.
    opts = _opts(kafka, topic, tmp_path, chunk_bytes=16 * 1024, transactions=3)
    r = eosink.run(_events(spark, n), sink="kafka", epoch=7, **opts)
    assert r.committed and r.rows == n and r.files > 3  # files = chunks (transactions)
    got = read_topic(kafka.bootstrap, topic)
    ids = _ids(got)
    assert sorted(ids) == list(range(n))
    for _, key, value, headers in got:
        i = json.loads(value)["id"]
        assert key == str(i % 10).encode()
        assert headers == [("id", str(i).encode())]
    # Per key, the order of the DataFrame's partition (ascending ids) is kept.
    by_key: dict[bytes, list[int]] = {}
    for _, key, value, _ in got:
        by_key.setdefault(key, []).append(json.loads(value)["id"])
    assert all(v == sorted(v) for v in by_key.values())
    # The same epoch again is skipped: nothing is produced twice.
    again = eosink.run(_events(spark, n), sink="kafka", epoch=7, **opts)
    assert again.skipped and again.rows == 0
    assert len(read_topic(kafka.bootstrap, topic)) == n
    # The epoch's staged files are gone.
    assert not any(p.is_file() for p in (tmp_path / "staging").rglob("*"))


def test_topic_and_partition_columns_python_writers(spark: Any, kafka: Any, tmp_path: Path) -> None:
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(a, partitions=2)
    kafka.create_topic(b, partitions=2)
    df = spark.range(0, 200, numPartitions=2).selectExpr(
        f"if(id % 2 = 0, '{a}', '{b}') as topic",
        "cast(id % 2 as int) as partition",
        "cast(to_json(named_struct('id', id)) as binary) as value",
    )
    r = eosink.run(df, sink="kafka", writer="python", **_opts(kafka, None, tmp_path))
    assert r.figures is not None and r.figures.writer == "python"
    got_a = read_topic(kafka.bootstrap, a)
    got_b = read_topic(kafka.bootstrap, b)
    assert sorted(_ids(got_a)) == list(range(0, 200, 2))
    assert sorted(_ids(got_b)) == list(range(1, 200, 2))
    assert {p for p, *_ in got_a} == {0} and {p for p, *_ in got_b} == {1}


def test_stream_restarts_and_format_eosink(
    spark: Any, kafka: Any, topic: str, tmp_path: Path
) -> None:
    from harness import make_input

    ids = make_input(tmp_path / "in", files=3, rows=100)
    schema = "id long, grp string, payload string"
    sdf = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
        .selectExpr("grp as key", "to_json(struct(*)) as value")
    )
    opts = _opts(kafka, topic, tmp_path)
    h = eosink.run(
        sdf, sink="kafka", checkpoint_location=str(tmp_path / "chk"), trigger="availableNow", **opts
    )
    h.await_termination()
    assert len(h.figures) == 3
    assert sorted(_ids(read_topic(kafka.bootstrap, topic))) == sorted(ids)
    # Restarted on the same checkpoint with one more file: only the new rows.
    import pyarrow.parquet as pq

    extra = list(range(10_000, 10_050))
    pq.write_table(
        pa.table({"id": extra, "grp": ["g"] * 50, "payload": ["p"] * 50}),
        tmp_path / "in" / "in-999.parquet",
    )
    h = eosink.run(
        sdf, sink="kafka", checkpoint_location=str(tmp_path / "chk"), trigger="availableNow", **opts
    )
    h.await_termination()
    assert len(h.figures) == 1
    assert sorted(_ids(read_topic(kafka.bootstrap, topic))) == sorted(ids + extra)
    # Spark's idiom: writeStream.format("eosink") with Spark-style kafka.* options.
    other = f"fmt-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(other)
    q = (
        sdf.writeStream.format("eosink")
        .option("sink", "kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("kafka.linger.ms", "1")
        .option("topic", other)
        .option("staging_path", str(tmp_path / "staging"))
        .option("metastore_url", f"sqlite:///{tmp_path / 'm2.db'}")
        .option("checkpointLocation", str(tmp_path / "chk2"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert sorted(_ids(read_topic(kafka.bootstrap, other))) == sorted(ids + extra)


@pytest.mark.parametrize("point", ["kafka_before_commit", "mid_commit", "kafka_mid_produce"])
def test_replayed_commit_publishes_nothing_twice(
    spark: Any,
    kafka: Any,
    topic: str,
    tmp_path: Path,
    point: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The run dies inside the commit (in process); the next run's recovery finishes it.

    A ``read_uncommitted`` reader sees the records of the transaction that was open at the
    crash (aborted by the next run's ``init_transactions``) besides the committed ones, but no
    record is committed twice.
    """
    n = 2000
    opts = _opts(kafka, topic, tmp_path, chunk_bytes=8 * 1024, transactions=2)
    with simulate(point, 2), pytest.raises(SimulatedCrash):
        eosink.run(_events(spark, n), sink="kafka", epoch=3, **opts)
    # `eosink status` names the transactions the PENDING epoch's commit runs.
    pending = status_json(opts["metastore_url"], capsys)
    assert pending["pending_epochs"] == [3]
    key = sink_key(pending["sink_id"])
    txns = pending["open_at_target"]
    assert [x["transactional_id"] for x in txns] == [f"eosink-{key}-0", f"eosink-{key}-1"]
    assert {x["kind"] for x in txns} == {"transaction"} and {x["epoch"] for x in txns} == {3}
    assert sum(x["records"] for x in txns) == n
    from eosink._cli import main as cli

    assert cli(["status", "--metastore-url", opts["metastore_url"]]) == 0
    assert f"transaction: eosink-{key}-0: epoch 3" in capsys.readouterr().out
    r = eosink.run(_events(spark, n), sink="kafka", epoch=3, **opts)
    assert r.committed and r.recovered  # the PENDING epoch was committed by recovery
    done = status_json(opts["metastore_url"], capsys)
    assert done["open_at_target"] == [] and done["open_at_target_note"] == "nothing"
    committed = _ids(read_topic(kafka.bootstrap, topic))
    assert sorted(committed) == list(range(n))
    everything = _ids(read_topic(kafka.bootstrap, topic, "read_uncommitted"))
    assert set(everything) == set(range(n))
    if point == "mid_commit":  # died between transactions: nothing was aborted
        assert len(everything) == n
    else:
        assert len(everything) > n  # the open transaction's records, aborted


def test_empty_epoch_and_reruns(spark: Any, kafka: Any, topic: str, tmp_path: Path) -> None:
    df = _events(spark, 0)
    r = eosink.run(df, sink="kafka", **_opts(kafka, topic, tmp_path))
    assert r.committed and r.rows == 0
    assert read_topic(kafka.bootstrap, topic) == []
    # A timeout_seconds above the default transaction.timeout.ms (60 s) is accepted: the
    # request timeout is capped (librdkafka refused to create such a producer).
    r = eosink.run(
        _events(spark, 5), sink="kafka", **_opts(kafka, topic, tmp_path, timeout_seconds=120)
    )
    assert r.committed and r.rows == 5
    assert sorted(_ids(read_topic(kafka.bootstrap, topic))) == list(range(5))


def test_options_and_schema_refused_with_reasons(
    spark: Any, kafka: Any, topic: str, tmp_path: Path
) -> None:
    from eosink import ConfigError, SchemaMismatchError, SinkError

    base = _opts(kafka, topic, tmp_path)
    df = spark.range(3).selectExpr("cast(id as string) as value", "id")
    with pytest.raises(SchemaMismatchError, match=r"also has 'id'.*Select what to write"):
        eosink.run(df, sink="kafka", **base)
    with pytest.raises(SchemaMismatchError, match="no 'value' column"):
        eosink.run(spark.range(3).selectExpr("cast(id as string) as key"), sink="kafka", **base)
    with pytest.raises(SchemaMismatchError, match=r"no topic: give the option topic="):
        eosink.run(df.select("value"), sink="kafka", **{**base, "topic": None})
    with pytest.raises(SchemaMismatchError, match="column 'value' is int64"):
        eosink.run(spark.range(3).selectExpr("id as value"), sink="kafka", **base)
    with pytest.raises(ConfigError, match=r"topic 'nope-[\w-]+' does not exist.*never creates"):
        eosink.run(df.select("value"), sink="kafka", **{**base, "topic": f"nope-{topic}"})
    with pytest.raises(ConfigError, match=r"transaction.timeout.ms=5000.*Lower chunk_bytes"):
        eosink.run(
            df.select("value"),
            sink="kafka",
            **{**base, "producer_config": {"transaction.timeout.ms": 5000}},
        )
    with pytest.raises(ConfigError, match=r"'transactional.id' cannot be set"):
        eosink.run(
            df.select("value"),
            sink="kafka",
            **{**base, "producer_config": {"transactional.id": "x"}},
        )
    secret = "hunter2-very-secret"
    with pytest.raises(ConfigError) as err:
        eosink.run(
            df.select("value"),
            sink="kafka",
            **{**base, "producer_config": {"sasl.password": secret}, "transactions": 0},
        )
    assert secret not in str(err.value) and "transactions" in str(err.value)
    opts = eosink.get_sink("kafka").parse_options(
        {"bootstrap_servers": "x:1", "topic": "t", "producer_config": {"sasl.password": secret}}
    )
    assert secret not in repr(opts)
    # Nothing reachable: a clear error, quickly.
    with pytest.raises(SinkError, match=r"cannot reach Kafka at 127.0.0.1:9 \(.*broker running"):
        eosink.run(
            df.select("value"),
            sink="kafka",
            **{**base, "bootstrap_servers": "127.0.0.1:9", "timeout_seconds": 3},
        )


def test_smaller_pool_finishes_a_larger_pools_pending_epoch(
    spark: Any, kafka: Any, topic: str, tmp_path: Path
) -> None:
    """A run with transactions=4 dies inside its commit; the next run asks for 2: it still
    fences all 4 ids (the sink's marker records the pool) and finishes every slot's chunks."""
    n = 2000
    opts = _opts(kafka, topic, tmp_path, chunk_bytes=8 * 1024)
    with simulate("kafka_before_commit", 3), pytest.raises(SimulatedCrash):
        eosink.run(_events(spark, n, parts=4), sink="kafka", epoch=1, transactions=4, **opts)
    r = eosink.run(_events(spark, n, parts=4), sink="kafka", epoch=1, transactions=2, **opts)
    assert r.committed and r.recovered
    assert sorted(_ids(read_topic(kafka.bootstrap, topic))) == list(range(n))
    r = eosink.run(_events(spark, 10, parts=4), sink="kafka", epoch=2, transactions=2, **opts)
    assert r.committed and not r.recovered
    assert len(read_topic(kafka.bootstrap, topic)) == n + 10


def test_marker_read_is_not_cut_short_by_another_open_transaction(kafka: Any) -> None:
    """A ``read_committed`` consumer's end of partition is the last stable offset: with
    another producer's transaction open on the control topic, markers committed after it
    were missed (a stale marker republishes a chunk). The read goes to the high watermark,
    waiting for the open transaction to end."""
    import threading
    import time

    from confluent_kafka import Producer
    from eosink_kafka.control import read_markers
    from eosink_kafka.options import KafkaSinkOptions

    ctl = f"ctl-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(ctl, **{"cleanup.policy": "compact"})

    def producer(tid: str) -> Any:
        p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": tid})
        p.init_transactions(30)
        return p

    ours, other = producer(f"ours-{ctl}"), producer(f"other-{ctl}")
    ours.begin_transaction()
    ours.produce(ctl, json.dumps({"epoch": 1}).encode(), b"k/0")
    ours.commit_transaction(30)
    other.begin_transaction()
    other.produce(ctl, b"{}", b"someone-else/0")
    other.flush(30)
    ours.begin_transaction()
    ours.produce(ctl, json.dumps({"epoch": 2}).encode(), b"k/0")
    ours.commit_transaction(30)
    threading.Timer(2.0, lambda: other.abort_transaction(30)).start()
    opts = KafkaSinkOptions(bootstrap_servers=kafka.bootstrap, topic="t", timeout_seconds=30)
    t0 = time.monotonic()
    assert read_markers(opts, ctl, "k/") == {"k/0": {"epoch": 2}}
    assert time.monotonic() - t0 >= 1.5  # it waited for the open transaction
    # Without committed: every record, open transactions' too.
    assert "k/0" in read_markers(opts, ctl, "k/", committed=False)


def test_fenced_inside_flush_is_a_fenced_error(kafka: Any, topic: str) -> None:
    """A zombie whose producer is fenced while it flushes a chunk (the broker refuses to add
    the chunk's partitions to its transaction) gets eosink's FencedError, and nothing of the
    chunk is visible. confluent-kafka sometimes raises that case as a ``SystemError`` (it
    calls the delivery callbacks of the purged records with the ``KafkaException`` already
    set, or returns without one): seen in CI as a zombie driver's last error instead of the
    fence. Eight zombies: which form the error takes is timing."""
    from eosink_kafka.options import KafkaSinkOptions
    from eosink_kafka.transactions import Slot

    ctl = f"ctl-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(ctl, **{"cleanup.policy": "compact"})
    opts = KafkaSinkOptions(bootstrap_servers=kafka.bootstrap, topic=topic, timeout_seconds=30)
    records = [(topic, b'{"id": %d}' % i, b"k", None, i % 3) for i in range(300)]
    for n in range(8):
        tid = f"zombie-{ctl}-{n}"
        zombie, live = (Slot(opts, tid, ctl, f"k/{n}") for _ in range(2))
        zombie.init()
        zombie.ready = True
        live.init()  # fences the zombie's producer
        with pytest.raises(eosink.FencedError, match="Kafka fenced this producer"):
            zombie.publish(0, 0, True, records)
        live.ready = True
        live.publish(0, 0, True, records[n : n + 1])
        live.close()
    assert sorted(_ids(read_topic(kafka.bootstrap, topic))) == list(range(8))


def test_fatal_error_of_a_fenced_producer_is_a_fenced_error(kafka: Any, topic: str) -> None:
    """Once a fenced producer has turned fatal in the background, produce() only raises
    ``Local: Fatal error`` (code _FATAL): seen in CI as a zombie's CommitStateUnknownError.
    The slot asks the producer what made it fatal and raises eosink's FencedError."""
    from confluent_kafka import KafkaError, KafkaException
    from eosink_kafka.options import KafkaSinkOptions
    from eosink_kafka.transactions import Slot

    ctl = f"ctl-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(ctl, **{"cleanup.policy": "compact"})
    opts = KafkaSinkOptions(bootstrap_servers=kafka.bootstrap, topic=topic, timeout_seconds=30)
    tid = f"fatal-{ctl}"
    zombie, live = Slot(opts, tid, ctl, "k/0"), Slot(opts, tid, ctl, "k/0")
    zombie.init()
    live.init()  # fences the zombie's producer
    p = zombie.producer
    assert p is not None
    p.begin_transaction()
    p.produce(topic, b'{"id": 0}', b"k")
    with contextlib.suppress(KafkaException, SystemError):
        p.flush(30)  # the broker refuses the partitions: the producer turns fatal
    with pytest.raises(KafkaException) as raised:
        p.produce(topic, b'{"id": 1}', b"k")
    assert raised.value.args[0].code() == KafkaError._FATAL
    with pytest.raises(eosink.FencedError, match="Kafka fenced this producer"):
        zombie._failed(raised.value, 0, 0)
    live.close()
    assert _ids(read_topic(kafka.bootstrap, topic)) == []


class _Producer:
    """A stand-in for confluent-kafka's Producer whose flush fails with a bare SystemError
    (pure logic of how a Slot names it; the real case is the test above)."""

    def __init__(self, abort: Exception | None) -> None:
        self.abort = abort

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        if timeout:
            raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL")
        return 0

    def abort_transaction(self, timeout: float) -> None:
        if self.abort is not None:
            raise self.abort


def test_bare_system_error_is_named_by_the_producers_state() -> None:
    from confluent_kafka import KafkaError, KafkaException
    from eosink_kafka.options import KafkaSinkOptions
    from eosink_kafka.transactions import Slot

    opts = KafkaSinkOptions(bootstrap_servers="127.0.0.1:1", topic="t", timeout_seconds=1)
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    slot = Slot(opts, "tid", "ctl", "k/0", producer=_Producer(fenced), ready=True)
    with pytest.raises(eosink.FencedError, match="Kafka fenced this producer"):
        slot.publish(0, 0, True, [("t", b"v", None, None, None)])
    # The producer is not fatal: its transaction was aborted, the failure is transient.
    slot = Slot(opts, "tid", "ctl", "k/0", producer=_Producer(None), ready=True)
    with pytest.raises(eosink.CommitStateUnknownError, match="SystemError: <method 'flush'"):
        slot.publish(0, 0, True, [("t", b"v", None, None, None)])
    assert slot.producer is None and not slot.ready  # initialised again before a retry


def test_marker_read_during_an_outage_is_transient(tmp_path: Path) -> None:
    """Reading the markers while the broker is down (nothing listens on the port) is a
    transient CommitStateUnknownError, which the core retries, not a raw KafkaException
    that failed the run (met in CI: a commit's retry re-read the markers mid-restart)."""
    import socket

    from eosink_kafka.control import read_markers
    from eosink_kafka.options import KafkaSinkOptions

    with socket.socket() as s:  # a free port, closed again: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = KafkaSinkOptions(bootstrap_servers=f"127.0.0.1:{port}", topic="t", timeout_seconds=2)
    with pytest.raises(eosink.CommitStateUnknownError, match="cannot read the markers") as info:
        read_markers(opts, "ctl", "k/")
    assert info.value.transient


def test_topic_option_tombstones_secrets_and_a_changed_broker_list(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    """What docs/kafka.md promises: the ``topic`` option wins over a ``topic`` column; a null
    value is a tombstone (key kept, value null); a secret of ``producer_config`` is never in
    the meta store, the staging files or ``eosink status``; the default ``sink_id`` does not
    name the broker list, so the same job with a broker added is the same sink (its epoch
    is skipped, nothing produced twice)."""
    import subprocess
    import sys

    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(a, partitions=1)
    kafka.create_topic(b, partitions=1)
    secret = "hunter2-never-stored"
    df = spark.range(0, 40, numPartitions=2).selectExpr(
        f"'{b}' as topic",
        "cast(id as string) as key",
        "if(id % 4 = 0, null, to_json(named_struct('id', id))) as value",
    )
    opts = _opts(kafka, a, tmp_path, producer_config={"sasl.password": secret})
    r = eosink.run(df, sink="kafka", epoch=3, **opts)
    assert r.committed and r.rows == 40
    got = read_topic(kafka.bootstrap, a)
    assert read_topic(kafka.bootstrap, b) == []  # the option won over the column
    assert sorted(int(k) for _, k, _, _ in got) == list(range(40))
    tombstones = sorted(int(k) for _, k, v, _ in got if v is None)
    assert tombstones == list(range(0, 40, 4))
    assert all(json.loads(v)["id"] == int(k) for _, k, v, _ in got if v is not None)

    assert secret.encode() not in (tmp_path / "m.db").read_bytes()
    for f in (tmp_path / "staging").rglob("*"):
        assert not f.is_file() or secret.encode() not in f.read_bytes(), f
    status = subprocess.run(
        [sys.executable, "-m", "eosink._cli", "status", "--metastore-url", opts["metastore_url"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert secret not in status and f"kafka:{a}" in status

    port = kafka.bootstrap.rsplit(":", 1)[1]
    more = {**opts, "bootstrap_servers": f"{kafka.bootstrap},localhost:{port}"}
    again = eosink.run(df, sink="kafka", epoch=3, **more)
    assert again.skipped and again.sink_id == r.sink_id == f"kafka:{a}"
    assert len(read_topic(kafka.bootstrap, a)) == 40


class TestKafkaConformance(SinkConformance):
    """The plugin contract suite every sink passes (eosink.testing), on a real broker: a new
    2-partition topic per test, read back ``read_committed`` by an independent consumer;
    leftovers are the staged chunks no committable references."""

    sink_name = "kafka"

    @pytest.fixture(autouse=True)
    def _broker(self, kafka: Any) -> None:
        self.kafka = kafka

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        # The sink's marker and transactional ids live on the broker, which every test shares.
        self.sink_id = f"conformance:{uuid.uuid4().hex[:8]}"
        self.topic = f"conf-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(self.topic, partitions=2)
        self.staging = tmp_path / "staging"
        return {
            "bootstrap_servers": self.kafka.bootstrap,
            "topic": self.topic,
            "staging_path": str(self.staging),
            "timeout_seconds": 20,
        }

    def batches(self, start: int, n: int) -> list[pa.RecordBatch]:
        """Kafka's columns: the id as the key, the row as JSON in the value."""
        ids = range(start, start + n)
        return [
            pa.record_batch(
                {
                    "key": pa.array([str(i).encode() for i in ids], pa.binary()),
                    "value": pa.array(
                        [json.dumps({"id": i, "name": f"row-{i}"}) for i in ids], pa.string()
                    ),
                }
            )
        ]

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        rows = []
        for _, key, value, _ in read_topic(self.kafka.bootstrap, self.topic):
            row = json.loads(value)
            assert key == str(row["id"]).encode(), (key, row)
            rows.append(row)
        return rows

    def leftovers(self, options: Any) -> list[str]:
        root = self.staging
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
