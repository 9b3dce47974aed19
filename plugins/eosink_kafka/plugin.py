"""The ``kafka`` sink's entry point: :data:`SINK` and the ``eosink_sinks`` hook.

The sink is a package:

* ``options.py``: the options model, the producers' settings, secrets kept out of messages;
* ``stage.py``: the staging location (local or S3); ``writer.py``: the Python writer;
  ``records.py``: staged records' topics and sizes, chunks, a chunk's records read back;
* ``transactions.py``: a transactional producer of the pool (a chunk and its marker in one
  transaction); ``control.py``: the control topic's markers read back; ``admin.py``: the
  producers' settings, the topics and the control topic checked; ``_librdkafka.py``:
  confluent-kafka's errors and log lines;
* ``coordinator.py``: chunk planning, commit, abort, recovery; made of ``checks.py`` (the
  columns, and an epoch's records before it is persisted), ``native.py`` (Spark's writer
  staging an epoch), ``pool.py`` (the pool of transactional ids), ``marker.py`` (the markers
  in the control topic);
* ``status.py``: what a PENDING epoch leaves open, for ``eosink status``.

Nothing here imports confluent-kafka: without it the sink is still listed (``eosink plugins``),
and executors never need it (they only stage).
"""

from __future__ import annotations

from typing import Any

import eosink
from eosink import JsonCodec, SinkPlugin, WriterContext

from .checks import validate_schema
from .coordinator import make_coordinator
from .options import KafkaSinkOptions
from .status import describe_open
from .writer import KafkaWriter

__all__ = ["SINK", "eosink_sinks"]


def make_writer(opts: KafkaSinkOptions, ctx: WriterContext) -> KafkaWriter:
    return KafkaWriter(opts, ctx)


def _default_sink_id(o: KafkaSinkOptions) -> str:
    # Not the broker list: adding a broker to bootstrap_servers must not make a new sink
    # (with no history, a re-run would publish again). The cluster is checked by target_id:
    # the same topic name on another cluster is refused until it gets its own sink_id.
    return f"kafka:{o.topic if o.topic is not None else '*'}"


SINK: SinkPlugin[KafkaSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="kafka",
    options_model=KafkaSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    committable_codec=JsonCodec[dict[str, Any]](version=1),
    default_sink_id=_default_sink_id,
    validate_schema=validate_schema,
    description="Apache Kafka topics, exactly once through transactions (confluent-kafka)",
    # confluent-kafka is imported by the coordinator (the driver) only.
    requires={"confluent_kafka": "eosink[kafka]"},
    describe_open=describe_open,
    capabilities=eosink.Capabilities(
        target_marker=True, staged_epochs=True, spark_writer=True, retirable=True
    ),
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    """The kafka sink."""
    return [SINK]
