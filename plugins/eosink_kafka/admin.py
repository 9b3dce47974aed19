"""The kafka sink's checks of the cluster and of its settings: the producers' settings as
librdkafka sees them (before anything runs), the topics and their limits, and the control
topic (created when missing, compacted).

This module imports confluent-kafka; nothing on the executors imports it.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from eosink import (
    ConfigError,
    SinkError,
)
from eosink.util import is_secret_name

from ._librdkafka import kafka_error, rdlog
from .options import KafkaSinkOptions, redact

__all__ = ["Admin", "check_producer_config"]

log = logging.getLogger("eosink.kafka")


def _config_refused(conf: dict[str, Any]) -> str | None:
    """librdkafka's reason to refuse ``conf`` (it validates a configuration when a client is
    constructed, without contacting any broker), or None."""
    try:
        producer = Producer(conf, logger=rdlog)
    except (KafkaException, TypeError, ValueError) as exc:
        err = kafka_error(exc)
        return err.str() if err is not None else str(exc)
    producer.close()
    return None


def check_producer_config(opts: KafkaSinkOptions) -> None:
    """Raise :class:`ConfigError` naming the setting of ``producer_config`` librdkafka refuses.

    Checked when the coordinator starts, before any Spark job and any meta store row: a bad
    setting would otherwise fail every commit (with librdkafka's raw error).
    """
    conf = opts.producer_settings("eosink-config-check")
    del conf["bootstrap.servers"]  # validated without connecting to anything
    reason = _config_refused(conf)
    if reason is None:
        return
    base = {k: v for k, v in conf.items() if k not in opts.producer_config}
    bad = [k for k in opts.producer_config if _config_refused({**base, k: opts.producer_config[k]})]

    def shown(k: str) -> str:
        v = opts.producer_config[k]
        return f"{k}=***" if is_secret_name(k) else f"{k}={v!r}"

    what = (
        ", ".join(shown(k) for k in bad)
        if bad
        else "a combination of " + ", ".join(map(shown, opts.producer_config))
    )
    raise ConfigError(
        redact(
            f"producer_config: librdkafka refuses {what} ({reason}); see librdkafka's "
            "CONFIGURATION.md for the producer settings and their values",
            opts,
        )
    )


class Admin:
    """Topic checks and the control topic (created when missing, compacted)."""

    def __init__(self, opts: KafkaSinkOptions) -> None:
        self.opts = opts
        self.client = AdminClient(opts.client_settings(), logger=rdlog)

    def _metadata(self) -> Any:
        try:
            return self.client.list_topics(timeout=self.opts.timeout_seconds)
        except KafkaException as exc:
            err = kafka_error(exc)
            raise SinkError(
                redact(
                    f"cannot reach Kafka at {self.opts.bootstrap_servers} "
                    f"({err.str() if err is not None else exc}); is the broker running and "
                    "bootstrap_servers right?",
                    self.opts,
                )
            ) from None

    def cluster_id(self) -> str:
        return str(self._metadata().cluster_id)

    def topics(self) -> dict[str, int]:
        md = self._metadata()
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}

    def partitions(self) -> dict[str, int]:
        """The partition count of every topic the cluster reports: also of one with a
        transient error (no leader yet), whose count may then be 0 (unknown)."""
        out: dict[str, int] = {}
        for name, t in self._metadata().topics.items():
            if t.error is None or t.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                out[name] = len(t.partitions)
        return out

    def max_message_bytes(self, topics: list[str]) -> dict[str, int]:
        """Each topic's ``max.message.bytes`` (the largest record batch its brokers accept).

        Raises:
            SinkError: the cluster did not answer (unreachable, or DescribeConfigs denied).
        """
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
        out: dict[str, int] = {}
        try:
            futures = self.client.describe_configs(
                resources, request_timeout=self.opts.timeout_seconds
            )
            for res, fut in futures.items():
                entry = fut.result(timeout=self.opts.timeout_seconds).get("max.message.bytes")
                if entry is not None and entry.value is not None:
                    out[res.name] = int(entry.value)
        except Exception as exc:
            raise SinkError(
                redact(f"cannot read the topics' configs from Kafka ({exc})", self.opts)
            ) from None
        return out

    def check_topic(self, topic: str) -> None:
        if topic not in self.topics():
            raise ConfigError(
                f"topic {topic!r} does not exist on {self.opts.bootstrap_servers}; create it "
                "first (kafka-topics.sh --create --topic ... with the partitions and "
                "replication you want): the kafka sink never creates data topics"
            )

    def ensure_control_topic(self, name: str) -> None:
        """Create the compacted control topic if it is missing; warn if it is not compacted."""
        if name not in self.topics():
            config = {
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "0",
                "segment.ms": "600000",
            }
            fut = self.client.create_topics(
                [NewTopic(name, num_partitions=1, replication_factor=-1, config=config)]
            )[name]
            try:
                fut.result(timeout=self.opts.timeout_seconds)
                log.info("kafka sink: created control topic %s (compacted)", name)
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise SinkError(
                        redact(f"cannot create the control topic {name!r}: {exc}", self.opts)
                    ) from None
            return
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        try:
            conf = self.client.describe_configs([res])[res].result(
                timeout=self.opts.timeout_seconds
            )
            policy = conf["cleanup.policy"].value
        except Exception:  # describing needs DescribeConfigs rights: not essential
            return
        if "compact" not in str(policy):
            log.warning(
                "kafka sink: control topic %s has cleanup.policy=%s; with 'delete' the markers "
                "expire with the topic's retention and a replay after that could publish twice. "
                "Set cleanup.policy=compact",
                name,
                policy,
            )
