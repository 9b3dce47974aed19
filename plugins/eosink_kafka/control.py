"""The markers in the control topic, read back: every transactional id
``eosink-<sink key>-<slot>`` of the pool has a marker, key ``<sink key>/<slot>``, written in
the same transaction as its chunk's records (:mod:`~eosink_kafka.transactions`), so what it
says is published is, and a replayed commit skips what it covers.

This module imports confluent-kafka; nothing on the executors imports it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from eosink import (
    CommitStateUnknownError,
)

from ._librdkafka import kafka_error, kafka_exception, rdlog
from .options import KafkaSinkOptions, redact

__all__ = ["RECENT", "covered", "marker_top", "read_markers"]

RECENT = 64

"""How many fully published epochs a slot's marker remembers (replays of older ones)."""


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
        kafka_exc = kafka_exception(exc)
        err = kafka_error(kafka_exc) if kafka_exc is not None else None
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
