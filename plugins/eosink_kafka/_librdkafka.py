"""confluent-kafka's errors as the kafka sink reads them, and librdkafka's log lines routed
to Python's logging (``eosink.kafka.librdkafka``).

This module imports confluent-kafka; nothing on the executors imports it.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException

__all__ = ["kafka_error", "kafka_exception", "rdlog"]

rdlog = logging.getLogger("eosink.kafka.librdkafka")

"""librdkafka's own log lines (otherwise printed on stderr)."""


class _Retries(logging.Filter):
    """librdkafka's "...: retrying" warnings (a coordinator still loading, a concurrent
    transaction being aborted) are routine: shown at DEBUG only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return rdlog.isEnabledFor(logging.DEBUG) or "retrying" not in record.getMessage()


rdlog.addFilter(_Retries())


def kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def kafka_exception(exc: BaseException) -> KafkaException | None:
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
