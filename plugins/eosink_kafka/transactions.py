"""The fixed pool of transactional producers and the markers in the control topic.

Every transactional id ``eosink-<sink key>-<slot>`` of the pool has a marker in the compacted
control topic, key ``<sink key>/<slot>``: the epoch and chunk its last transaction published,
written *in the same transaction* as the chunk's records. So a chunk's records are visible
(to ``read_committed`` consumers) if and only if the marker says so, and a commit that is
replayed after a crash skips what the marker covers. ``init_transactions`` comes first: it
fences any other producer of the id (a zombie driver) and aborts its open transaction, so
the marker read after it is final.

This module imports confluent-kafka; nothing on the executors imports it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from eosink import (
    CommitStateUnknownError,
    ConfigError,
    FencedError,
    SinkError,
    fault_point,
)
from eosink.util import is_secret_name

from .options import KafkaSinkOptions, redact

__all__ = ["Admin", "Slot", "check_producer_config", "covered", "read_markers"]

log = logging.getLogger("eosink.kafka")
rdlog = logging.getLogger("eosink.kafka.librdkafka")
"""librdkafka's own log lines (otherwise printed on stderr)."""


class _Retries(logging.Filter):
    """librdkafka's "...: retrying" warnings (a coordinator still loading, a concurrent
    transaction being aborted) are routine: shown at DEBUG only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return rdlog.isEnabledFor(logging.DEBUG) or "retrying" not in record.getMessage()


rdlog.addFilter(_Retries())

RECENT = 64
"""How many fully published epochs a slot's marker remembers (replays of older ones)."""

_FENCED = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def marker_top(marker: dict[str, Any] | None) -> int:
    """The newest epoch a slot's marker says the slot published (-1: none); markers written
    before ``top`` was recorded give their current epoch."""
    if not marker:
        return -1
    return int(marker.get("top", marker.get("epoch", -1)))


def covered(marker: dict[str, Any] | None, epoch: int, chunk: int) -> bool:
    """Whether a slot's marker says chunk ``chunk`` of ``epoch`` is published."""
    if not marker:
        return False
    if epoch in marker.get("recent", ()):
        return True
    return int(marker.get("epoch", -1)) == epoch and int(marker.get("chunk", -1)) >= chunk


def _err(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _kafka_exception(exc: BaseException) -> KafkaException | None:
    """The ``KafkaException`` that ``exc`` is or was raised from, if any.

    When a producer turns fatal (e.g. fenced) inside ``flush``, confluent-kafka sets the
    ``KafkaException`` and then still calls the delivery callback of every purged record:
    Python reports that as ``SystemError: ... returned a result with an exception set``,
    raised from the ``KafkaException``. The Kafka error is the one that counts.
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, KafkaException):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _config_refused(conf: dict[str, Any]) -> str | None:
    """librdkafka's reason to refuse ``conf`` (it validates a configuration when a client is
    constructed, without contacting any broker), or None."""
    try:
        producer = Producer(conf, logger=rdlog)
    except (KafkaException, TypeError, ValueError) as exc:
        err = _err(exc)
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
            err = _err(exc)
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
                err = _err(exc)
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


def read_markers(
    opts: KafkaSinkOptions, topic: str, prefix: str, committed: bool = True
) -> dict[str, dict[str, Any]]:
    """The markers of the control topic whose key starts with ``prefix`` (last value wins).

    ``committed``: read with ``read_committed`` up to the partitions' *high watermarks*,
    taken now with ``read_uncommitted`` (a ``read_committed`` consumer's end of partition and
    watermarks are the last stable offset: an open transaction of another producer would
    hide every marker committed after it, and a stale marker republishes a chunk). So call it
    after ``init_transactions`` of the ids whose markers count: their zombies can write
    nothing after that, and whatever they committed before is below the watermark. The read
    waits while another producer's transaction below the watermark is open (at most its
    transaction timeout; past ``timeout_seconds``: :class:`CommitStateUnknownError`).

    Not ``committed``: every marker record, those of open transactions too (which
    transactional ids of the sink ever wrote markers).

    Raises:
        CommitStateUnknownError: Kafka could not be read (broker down, no leader for the
            control topic yet): transient, the core retries the commit.
    """
    base = {
        **opts.client_settings(),
        "group.id": f"eosink-marker-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        # A fetch that finds nothing new returns at once (the default waits 500 ms for
        # data, and the read ends only at the end of every partition): ~0.5 s per read.
        "fetch.wait.max.ms": 20,
    }
    try:
        return _read_markers(opts, topic, prefix, committed, base)
    except (KafkaException, SystemError) as exc:
        # A broker outage (transport failure, no leader yet...): transient, the core retries.
        kafka_exc = _kafka_exception(exc)
        err = _err(kafka_exc) if kafka_exc is not None else None
        raise CommitStateUnknownError(
            redact(
                f"cannot read the markers of control topic {topic!r} on "
                f"{opts.bootstrap_servers}: {err.str() if err is not None else exc}",
                opts,
            )
        ) from None


def _read_markers(
    opts: KafkaSinkOptions, topic: str, prefix: str, committed: bool, base: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    consumer = Consumer({**base, "isolation.level": "read_uncommitted"}, logger=rdlog)
    reader = consumer
    try:
        # A topic error (e.g. LEADER_NOT_AVAILABLE while a broker starts or just after the
        # topic was created) is waited out for timeout_seconds, then transient.
        deadline = time.monotonic() + opts.timeout_seconds
        while True:
            md = consumer.list_topics(topic, timeout=opts.timeout_seconds)
            meta = md.topics.get(topic)
            if meta is None or meta.error is None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if meta is not None and meta.error is not None:
            raise CommitStateUnknownError(f"control topic {topic!r}: {meta.error}")
        parts = sorted(meta.partitions) if meta is not None else []
        if not parts:
            raise CommitStateUnknownError(
                f"control topic {topic!r} has no partitions (was it deleted? the sink "
                "creates it at start)"
            )
        ends: dict[int, int] = {}
        for p in parts:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=opts.timeout_seconds, cached=False
            )
            if high > low:
                ends[p] = int(high)
        if committed:
            consumer.close()
            reader = Consumer({**base, "isolation.level": "read_committed"}, logger=rdlog)
            # The new consumer learns the topic's leaders before it is assigned: assigned
            # first, its first fetch waits ~0.5 s for them.
            reader.list_topics(topic, timeout=opts.timeout_seconds)
        out: dict[str, dict[str, Any]] = {}
        if not ends:
            return out
        tps = [TopicPartition(topic, p, -2) for p in sorted(ends)]  # OFFSET_BEGINNING
        reader.assign(tps)
        deadline = time.monotonic() + opts.timeout_seconds
        left = set(ends)
        while left:
            if time.monotonic() > deadline:
                raise CommitStateUnknownError(
                    f"reading the markers of control topic {topic!r} took more than "
                    f"{opts.timeout_seconds:.0f} s (a transaction of another producer on it "
                    "may be open)"
                )
            msg = reader.poll(0.5)
            if msg is not None:
                error = msg.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise CommitStateUnknownError(f"reading control topic {topic!r}: {error}")
                raw_key = msg.key() if error is None else None
                key = raw_key.decode() if isinstance(raw_key, bytes) else ""
                if error is None and key.startswith(prefix):
                    value = msg.value()
                    if value is None:
                        out.pop(key, None)
                    else:
                        out[key] = json.loads(value)
            for tp in reader.position([TopicPartition(topic, p) for p in left]):
                if tp.offset >= ends[tp.partition]:
                    left.discard(tp.partition)
        return out
    finally:
        reader.close()


@dataclass
class Slot:
    """One transactional id of the pool: its producer and its marker."""

    opts: KafkaSinkOptions
    transactional_id: str
    control_topic: str
    marker_key: str
    producer: Any = None
    marker: dict[str, Any] | None = None
    ready: bool = False
    errors: list[KafkaError] = field(default_factory=list)

    def init(self) -> None:
        """Create the producer and ``init_transactions`` (fences zombies, aborts theirs)."""
        self.close()
        self.errors = []
        conf = self.opts.producer_settings(self.transactional_id)
        conf["on_delivery"] = self._delivered
        self.producer = Producer(conf, logger=rdlog)
        try:
            self.producer.init_transactions(self.opts.timeout_seconds)
        except KafkaException as exc:
            err = _err(exc)
            self.close()
            if err is not None and err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise ConfigError(
                    f"the broker refuses transaction.timeout.ms of the producers ({exc}): it "
                    "must not exceed the broker's transaction.max.timeout.ms"
                ) from None
            raise CommitStateUnknownError(
                redact(f"init_transactions of {self.transactional_id}: {exc}", self.opts)
            ) from None
        fault_point("kafka_after_init")

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)

    def close(self) -> None:
        if self.producer is not None:
            try:
                self.producer.flush(0)
            except Exception:
                pass
            self.producer = None
        self.ready = False

    def publish(self, epoch: int, index: int, last: bool, records: Any) -> None:
        """One transaction: ``records`` and the new marker of this slot.

        Raises:
            FencedError: another driver initialised this transactional id.
            CommitStateUnknownError: a transient failure (broker down, timeout): the slot
                must be initialised again and its marker re-read before going on.
            SinkError: a record the broker cannot take (unknown topic, too large...).
        """
        p = self.producer
        assert p is not None and self.ready
        recent = list((self.marker or {}).get("recent", ()))
        if last:
            recent = [*recent[-(RECENT - 1) :], epoch]
        # The newest epoch this slot ever published: a backfill (an older epoch committed
        # after newer ones) must not lower the sink's last_epoch (read_marker).
        top = max(marker_top(self.marker), epoch)
        marker = {"epoch": epoch, "chunk": index, "last": last, "recent": recent, "top": top}
        try:
            p.begin_transaction()
            produce = p.produce
            n = 0
            for topic, value, key, headers, partition in records:
                while True:
                    try:
                        produce(topic, value, key, partition, headers=headers)
                        break
                    except BufferError:
                        p.poll(0.05)
                n += 1
                if n % 10000 == 0:
                    p.poll(0)
                    if n == 10000:
                        fault_point("kafka_mid_produce")
            if n < 10000:
                fault_point("kafka_mid_produce")
            produce(self.control_topic, json.dumps(marker).encode(), self.marker_key.encode())
            p.flush(self.opts.timeout_seconds)
            if self.errors:
                raise KafkaException(self.errors[0])
            fault_point("kafka_before_commit")
            p.commit_transaction(self.opts.timeout_seconds)
        except (KafkaException, SystemError) as exc:
            self._failed(exc, epoch, index)
        self.marker = marker

    def write_marker(self, key: str, value: dict[str, Any]) -> None:
        """A transaction with one record of the control topic (the sink's own marker)."""
        p = self.producer
        assert p is not None
        try:
            p.begin_transaction()
            p.produce(self.control_topic, json.dumps(value).encode(), key.encode())
            p.commit_transaction(self.opts.timeout_seconds)
        except (KafkaException, SystemError) as exc:
            self._failed(exc, -1, -1)

    def delete_marker(self) -> None:
        """A transaction with the tombstone of this id's marker (``eosink retire``)."""
        p = self.producer
        assert p is not None
        try:
            p.begin_transaction()
            p.produce(self.control_topic, None, self.marker_key.encode())
            p.commit_transaction(self.opts.timeout_seconds)
        except (KafkaException, SystemError) as exc:
            self._failed(exc, -1, -1)
        self.marker = None

    def _ask_producer(self) -> KafkaException | None:
        """Abort the producer's transaction; the Kafka error that raises, if any (on a fenced
        or fatal producer: the error that made it so)."""
        try:
            if self.producer is not None:
                self.producer.abort_transaction(self.opts.timeout_seconds)
        except (KafkaException, SystemError) as probe:
            return _kafka_exception(probe)
        return None

    def _failed(self, exc: BaseException, epoch: int, index: int) -> None:
        kafka_exc = _kafka_exception(exc)
        if kafka_exc is None:
            # A SystemError of confluent-kafka's that carries no Kafka error (also seen:
            # "flush returned NULL without setting an exception" when the producer turned
            # fatal). Ask the producer: aborting a fenced producer's transaction raises the
            # fence; otherwise the transaction is aborted and the failure is transient.
            kafka_exc = self._ask_producer()
        if kafka_exc is None:
            where = f"{self.transactional_id} epoch {epoch} chunk {index}"
            self.close()
            raise CommitStateUnknownError(
                redact(f"{where}: the Kafka client failed ({type(exc).__name__}: {exc})", self.opts)
            ) from None
        exc = kafka_exc
        err = _err(exc) or (self.errors[0] if self.errors else None)
        self.errors = []
        if err is not None and err.code() == KafkaError._FATAL and self.producer is not None:
            # The producer turned fatal in the background (e.g. fenced while this chunk was
            # produced): produce() and delivery reports then only say "Local: Fatal error".
            # A transactional call on a fatal producer returns the error that made it fatal.
            cause = self._ask_producer()
            if cause is not None and _err(cause) is not None:
                exc, err = cause, _err(cause)
        where = f"{self.transactional_id} epoch {epoch} chunk {index}"
        code = err.code() if err is not None else None
        if code in _FENCED:
            self.producer = None  # fenced: never used again, nothing to flush
            self.ready = False
            raise FencedError(
                f"{where}: Kafka fenced this producer ({err}): another driver runs this sink "
                "and took over its transactional ids; this one stops without publishing"
            ) from None
        try:
            if self.producer is not None and err is not None and not err.fatal():
                self.producer.abort_transaction(self.opts.timeout_seconds)
        except Exception:
            pass
        self.close()  # re-initialised (and the marker re-read) before the next try
        permanent = {
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
            KafkaError._UNKNOWN_PARTITION,
            KafkaError.MSG_SIZE_TOO_LARGE,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.RECORD_LIST_TOO_LARGE,
            KafkaError.INVALID_RECORD,
        }
        if code in permanent:
            raise SinkError(
                redact(
                    f"{where}: Kafka refused a record ({err}); nothing of this chunk is "
                    "visible. Fix the topic or the record and run again",
                    self.opts,
                )
            ) from None
        raise CommitStateUnknownError(redact(f"{where}: {exc}", self.opts)) from None
