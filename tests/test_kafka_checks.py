"""The kafka sink is never stuck: what can make an epoch's commit fail for good is checked
before the epoch is persisted (issue 21).

A record routed to a partition the topic does not have fails the epoch in ``pre_commit``
(nothing PENDING, staged data deleted) and the next run of the same sink with good data
succeeds (a record routed to a topic that does not exist: the rows of
tests/test_bad_inputs.py). A ``producer_config`` librdkafka refuses is a
``ConfigError`` naming the setting before any Spark job and any meta store row; an
unreachable broker is an eosink error naming the bootstrap servers, within the timeout.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_kafka_sink import _ids, read_topic

import eosink


def _store_epochs(metastore_url: str, sink_id: str) -> dict[int, str]:
    from eosink._metastore import MetaStore

    store = MetaStore(metastore_url)
    try:
        return {r.epoch: r.status for r in store.epochs(sink_id)}
    finally:
        store.close()


def _sink_row(metastore_url: str, sink_id: str) -> Any:
    from eosink._metastore import MetaStore

    store = MetaStore(metastore_url)
    try:
        return store.sink(sink_id)
    finally:
        store.close()


def _staged(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]


def _routed(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, "key string, value string, topic string")


def test_partition_the_topic_lacks_and_null_topic_refused_before_pending(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    from eosink import SinkError

    t = f"two-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(t, partitions=2)
    sid = "kafka:partitions"
    opts = {
        "bootstrap_servers": kafka.bootstrap,
        "sink_id": sid,
        "staging_path": str(tmp_path / "staging"),
        "metastore_url": f"sqlite:///{tmp_path / 'm.db'}",
    }
    df = spark.createDataFrame(
        [("a", t, 1), ("b", t, 5)], "value string, topic string, partition int"
    )
    with pytest.raises(SinkError, match=rf"'{t}' \(partition 5; it has 2\)"):
        eosink.run(df, sink="kafka", **opts)
    nulls = _routed(spark, [("k", "v", t), ("k", "w", None)])
    with pytest.raises(SinkError, match="null topic"):
        eosink.run(nulls, sink="kafka", writer="python", **opts)
    assert "PENDING" not in _store_epochs(opts["metastore_url"], sid).values()
    assert _staged(tmp_path) == []
    r = eosink.run(df.where("partition < 2"), sink="kafka", **opts)
    assert r.committed and r.rows == 1
    assert [(p, v) for p, _, v, _ in read_topic(kafka.bootstrap, t)] == [(1, b"a")]


@pytest.mark.parametrize("writer", ["spark", "python"])
def test_record_over_the_topics_limit_refused_before_pending(
    spark: Any, kafka: Any, tmp_path: Path, writer: str
) -> None:
    """A record the broker would refuse for its size (the topic's max.message.bytes, no
    compression) fails the epoch before it is persisted, on both writer paths: the sink is
    not left with an epoch no commit can publish. The next run with good data succeeds."""
    import secrets

    from eosink import SinkError

    t = f"small-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(t, **{"max.message.bytes": "4000"})
    sid = f"kafka:sizes-{writer}"
    opts = {
        "bootstrap_servers": kafka.bootstrap,
        "topic": t,
        "sink_id": sid,
        "writer": writer,
        "staging_path": str(tmp_path / "staging"),
        "metastore_url": f"sqlite:///{tmp_path / 'm.db'}",
    }
    big = secrets.token_hex(3000)  # 6000 bytes, barely compressible
    bad = spark.createDataFrame([("k", '{"id": 0}'), ("k", big)], "key string, value string")
    with pytest.raises(SinkError) as err:
        eosink.run(bad, sink="kafka", **opts)
    msg = str(err.value)
    assert "a record is 6001 bytes" in msg, msg
    assert f"{t!r} (max.message.bytes 4000)" in msg, msg
    assert "PENDING" not in _store_epochs(opts["metastore_url"], sid).values()
    assert _staged(tmp_path) == []
    assert read_topic(kafka.bootstrap, t) == []
    ok = spark.createDataFrame(
        [("k", f'{{"id": {i}}}') for i in range(3)], "key string, value string"
    )
    r = eosink.run(ok, sink="kafka", **opts)
    assert r.committed and r.rows == 3
    assert sorted(_ids(read_topic(kafka.bootstrap, t))) == [0, 1, 2]


def test_record_sizes_with_compression_and_the_producers_limit(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    """With compression the broker checks compressed batches: a large record that
    compresses under the topic's limit is published, not refused. Over the producers'
    message.max.bytes (librdkafka's own limit, 1,000,000 by default) a record is refused
    before the epoch is persisted, whatever the compression."""
    from eosink import SinkError

    t = f"small-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(t, **{"max.message.bytes": "4000"})
    opts = {
        "bootstrap_servers": kafka.bootstrap,
        "topic": t,
        "writer": "python",
        "staging_path": str(tmp_path / "staging"),
        "metastore_url": f"sqlite:///{tmp_path / 'm.db'}",
        "producer_config": {"compression.type": "lz4"},
    }
    value = '{"id": 7, "pad": "' + "a" * 6000 + '"}'
    df = spark.createDataFrame([("k", value)], "key string, value string")
    r = eosink.run(df, sink="kafka", sink_id="kafka:lz4", **opts)
    assert r.committed and r.rows == 1
    assert _ids(read_topic(kafka.bootstrap, t)) == [7]
    huge = spark.createDataFrame([("k", "x" * 1_100_000)], "key string, value string")
    with pytest.raises(SinkError, match=r"over the producers' message.max.bytes of 1000000"):
        eosink.run(huge, sink="kafka", sink_id="kafka:huge", **opts)
    assert "PENDING" not in _store_epochs(opts["metastore_url"], "kafka:huge").values()
    assert _staged(tmp_path) == []
    assert _ids(read_topic(kafka.bootstrap, t)) == [7]


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"no.such.setting": "1"}, r"no.such.setting='1'.*No such configuration property"),
        ({"compression.type": "zzz"}, r"compression.type='zzz'.*Invalid value"),
        ({"linger.ms": "5", "acks": "some"}, r"acks='some'"),
    ],
)
def test_bad_producer_config_is_a_config_error_before_anything(
    spark: Any, kafka: Any, tmp_path: Path, config: dict[str, Any], named: str
) -> None:
    from eosink import ConfigError

    t = f"cfg-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(t, partitions=1)
    murl = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.createDataFrame([("v",)], "value string")
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    with pytest.raises(ConfigError, match=named) as err:
        eosink.run(
            df,
            sink="kafka",
            bootstrap_servers=kafka.bootstrap,
            topic=t,
            sink_id="kafka:cfg",
            producer_config=config,
            staging_path=str(tmp_path / "staging"),
            metastore_url=murl,
        )
    assert "linger.ms" not in str(err.value) or "acks" not in config
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs
    assert _sink_row(murl, "kafka:cfg") is None


def test_bad_secret_setting_is_named_without_its_value() -> None:
    from eosink import ConfigError

    secret = "hunter2-very-secret"
    opts = eosink.get_sink("kafka").parse_options(
        {
            "bootstrap_servers": "127.0.0.1:9",
            "topic": "t",
            "producer_config": {"sasl.password": secret, "security.protocol": "bogus"},
        }
    )
    from eosink_kafka.admin import check_producer_config

    with pytest.raises(ConfigError, match=r"security.protocol='bogus'") as err:
        check_producer_config(opts)
    assert secret not in str(err.value)


def test_unreachable_broker_named_within_the_timeout(spark: Any, tmp_path: Path) -> None:
    from eosink import SinkError

    df = _routed(spark, [("k", "v", "t")])
    murl = f"sqlite:///{tmp_path / 'm.db'}"
    t0 = time.monotonic()
    with pytest.raises(SinkError, match=r"cannot reach Kafka at 127.0.0.1:9 \("):
        eosink.run(
            df,
            sink="kafka",
            bootstrap_servers="127.0.0.1:9",
            sink_id="kafka:down",
            timeout_seconds=3,
            staging_path=str(tmp_path / "staging"),
            metastore_url=murl,
        )
    took = time.monotonic() - t0
    print(f"\nunreachable broker: failed in {took:.1f} s (timeout_seconds=3)")
    assert took < 15, took
    assert _sink_row(murl, "kafka:down") is None
