"""A transactional producer of the fixed pool (:class:`Slot`): a chunk and its marker in one
transaction.

Every transactional id ``eosink-<sink key>-<slot>`` of the pool has a marker in the compacted
control topic, key ``<sink key>/<slot>``: the epoch and chunk its last transaction published,
written *in the same transaction* as the chunk's records. So a chunk's records are visible
(to ``read_committed`` consumers) if and only if the marker says so, and a commit that is
replayed after a crash skips what the marker covers. ``init_transactions`` comes first: it
fences any other producer of the id (a zombie driver) and aborts its open transaction, so
the marker read after it is final (:mod:`~eosink_kafka.control` reads the markers;
:mod:`~eosink_kafka.admin` checks the cluster and the producers' settings).

This module imports confluent-kafka; nothing on the executors imports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from eosink import (
    CommitStateUnknownError,
    ConfigError,
    FencedError,
    SinkError,
    fault_point,
)

from ._librdkafka import kafka_error, kafka_exception, rdlog
from .control import RECENT, marker_top
from .options import KafkaSinkOptions, redact

__all__ = ["Slot"]


_FENCED = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


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
            err = kafka_error(exc)
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
            return kafka_exception(probe)
        return None

    def _failed(self, exc: BaseException, epoch: int, index: int) -> None:
        kafka_exc = kafka_exception(exc)
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
        err = kafka_error(exc) or (self.errors[0] if self.errors else None)
        self.errors = []
        if err is not None and err.code() == KafkaError._FATAL and self.producer is not None:
            # The producer turned fatal in the background (e.g. fenced while this chunk was
            # produced): produce() and delivery reports then only say "Local: Fatal error".
            # A transactional call on a fatal producer returns the error that made it fatal.
            cause = self._ask_producer()
            if cause is not None and kafka_error(cause) is not None:
                exc, err = cause, kafka_error(cause)
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
