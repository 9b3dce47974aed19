"""What the kafka sink checks before an epoch is persisted: the DataFrame's columns
(``validate_schema``), and the epoch's records: their topics exist with the partitions they
name, and no record is too large to ever be published. An epoch that fails them is refused,
its staged data deleted: the sink is never left with an epoch no commit can finish."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from eosink import SinkError

from .options import KafkaSinkOptions, check_columns, topic_name_problem
from .records import largest_record, merge_targets, targets_of
from .state import CoordinatorState

__all__ = ["BATCH_OVERHEAD_BYTES", "PRODUCER_MESSAGE_MAX_BYTES", "TargetChecks", "validate_schema"]

log = logging.getLogger("eosink.kafka")

PRODUCER_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""
BATCH_OVERHEAD_BYTES = 128
"""A record batch's header (61 bytes) and one record's framing, rounded up: what a record
adds to its key, value and headers on the wire, uncompressed."""


def validate_schema(opts: KafkaSinkOptions, schema: pa.Schema) -> None:
    """The columns of Spark's Kafka sink, with their types; a topic from somewhere."""
    from eosink import SchemaMismatchError

    check_columns(schema.names)

    def is_bytes(t: pa.DataType) -> bool:
        return bool(
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
        )

    for name in ("value", "key"):
        if name in schema.names and not is_bytes(schema.field(name).type):
            raise SchemaMismatchError(
                f"column {name!r} is {schema.field(name).type}; the kafka sink writes string or "
                f"binary {name}s: cast it (CAST({name} AS STRING)) or encode it "
                "(to_json, to_avro...)"
            )
    if "topic" in schema.names and not (
        pa.types.is_string(schema.field("topic").type)
        or pa.types.is_large_string(schema.field("topic").type)
    ):
        raise SchemaMismatchError(f"column 'topic' is {schema.field('topic').type}, not a string")
    if "partition" in schema.names and not pa.types.is_integer(schema.field("partition").type):
        raise SchemaMismatchError(
            f"column 'partition' is {schema.field('partition').type}, not an integer"
        )
    if "headers" in schema.names:
        t = schema.field("headers").type
        ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type)
        if ok:
            names = {t.value_type.field(i).name for i in range(t.value_type.num_fields)}
            ok = names == {"key", "value"}
        if not ok:
            raise SchemaMismatchError(
                f"column 'headers' is {t}; the kafka sink (as Spark's) writes "
                "array<struct<key: string, value: binary>>"
            )
    if opts.topic is None and "topic" not in schema.names:
        raise SchemaMismatchError(
            "no topic: give the option topic= or a 'topic' column naming each record's topic"
        )


class TargetChecks(CoordinatorState):
    """The coordinator's part that checks an epoch's records against the cluster."""

    def _targets_of_file(self, path: Any) -> dict[str | None, int]:
        """:func:`targets_of` a staged file (its ``topic`` and ``partition`` columns only)."""
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        topic = self.opts.topic
        cols = ["partition"] if "partition" in names else []
        if topic is None:
            if "topic" not in names:
                return {}
            cols.insert(0, "topic")
        elif not cols:
            return {topic: -1}
        return targets_of(pq.read_table(path, columns=cols), topic)

    def _check_targets(self, epoch: int, files: Sequence[dict[str, Any]]) -> None:
        """Every topic the epoch's records go to exists, with the partitions they name, and
        no record lacks a topic: else the epoch could never be published. Raised before the
        epoch is persisted, its staged data deleted: the sink is not left with an epoch no
        commit can finish."""
        targets: dict[str | None, int] = {}
        for f in files:
            found = f.get("targets")
            if found is None:  # written without the summary: read the file's columns
                table = self.stage.read_table(str(f["staged"]))
                more = targets_of(table, self.opts.topic) if table is not None else {}
            else:
                more = {t: int(n) for t, n in found}
            merge_targets(targets, more)
        if not targets:
            return
        problems: list[str] = []
        if None in targets:
            problems.append(
                "some rows have a null topic and the sink has no topic option (every record "
                "needs one: fix the topic column, or filter those rows)"
            )
        try:
            existing = self.admin.partitions()
        except SinkError as exc:
            # A broker outage: the commit waits it out (retried while transient); the
            # topics are then not checked beforehand.
            log.warning("kafka sink %s epoch %d: topics not checked: %s", self.sink_id, epoch, exc)
            existing = None
        if existing is None:
            if None in targets:
                self.abort(epoch, None)
                raise SinkError(
                    f"kafka sink {self.sink_id} epoch {epoch} cannot be published: " + problems[0]
                )
            return
        invalid = sorted(t for t in targets if t is not None and topic_name_problem(t))
        if invalid:
            problems.append(
                "the topic column holds names Kafka refuses: "
                + "; ".join(str(topic_name_problem(t)) for t in invalid)
                + ". Fix the topic column"
            )
        missing = sorted(
            t for t in targets if t is not None and t not in existing and t not in invalid
        )
        if missing:
            problems.append(
                f"topic(s) {', '.join(map(repr, missing))} do not exist on "
                f"{self.opts.bootstrap_servers} (the kafka sink never creates data topics): "
                "create them, or fix the topic column"
            )
        beyond = sorted(
            f"{t!r} (partition {n}; it has {existing[t]})"
            for t, n in targets.items()
            if t is not None and existing.get(t, 0) > 0 and n >= existing[t]
        )
        if beyond:
            problems.append(
                f"rows name partitions the topic does not have: {', '.join(beyond)}; fix the "
                "partition column or add partitions"
            )
        problems += self._size_problems(epoch, files, sorted(t for t in targets if t))
        if problems:
            self.abort(epoch, None)
            raise SinkError(
                f"kafka sink {self.sink_id} epoch {epoch} cannot be published: "
                + "; ".join(problems)
                + ". Nothing of the epoch was published or recorded (its staged data is "
                "deleted); run again once fixed"
            )

    def _size_problems(
        self, epoch: int, files: Sequence[dict[str, Any]], topics: list[str]
    ) -> list[str]:
        """Records too large to ever be published: over the producers' ``message.max.bytes``
        (librdkafka refuses them), or, without compression, over a target topic's
        ``max.message.bytes`` with a record batch's overhead (the broker refuses them). With
        compression the broker checks compressed batches, which only the commit knows: not
        checked here (a refusal then is a commit failure; docs/kafka.md says what to do)."""
        largest = 0
        for f in files:
            if "largest" in f:
                n = int(f["largest"])
            else:  # written without the summary: read the file
                table = self.stage.read_table(str(f["staged"]))
                n = largest_record(table) if table is not None else 0
            largest = max(largest, n)
        if not largest:
            return []
        conf = self.opts.producer_config
        problems: list[str] = []
        producer_max = int(conf.get("message.max.bytes", PRODUCER_MESSAGE_MAX_BYTES))
        if largest > producer_max:
            problems.append(
                f"a record is {largest} bytes (key, value and headers), over the producers' "
                f"message.max.bytes of {producer_max}: raise "
                "producer_config['message.max.bytes'] (and the topic's max.message.bytes), "
                "or make the record smaller"
            )
        compression = str(conf.get("compression.type", conf.get("compression.codec", "none")))
        if compression != "none" or not topics:
            return problems
        try:
            limits = self.admin.max_message_bytes(topics)
        except SinkError as exc:
            log.warning(
                "kafka sink %s epoch %d: record sizes not checked against the topics' "
                "max.message.bytes: %s",
                self.sink_id,
                epoch,
                exc,
            )
            return problems
        over = sorted(
            f"{t!r} (max.message.bytes {limit})"
            for t, limit in limits.items()
            if largest + BATCH_OVERHEAD_BYTES > limit
        )
        if over:
            problems.append(
                f"a record is {largest} bytes (key, value and headers; about "
                f"{largest + BATCH_OVERHEAD_BYTES} in a record batch), over the limit of "
                f"topic(s) {', '.join(over)}: raise the topic's max.message.bytes, or make the "
                "record smaller"
            )
        return problems
