"""Options of the ``kafka`` sink, and the producer configuration built from them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from eosink._s3 import S3Options, is_s3, normalize_s3, split_s3
from eosink.util import redact as _redact
from eosink.util import sink_key as sink_key

__all__ = [
    "COLUMNS",
    "KafkaSinkOptions",
    "check_columns",
    "redact",
    "sink_key",
    "topic_name_problem",
    "transactional_id",
]

COLUMNS = ("value", "key", "headers", "topic", "partition")
"""The columns the sink writes, as Spark's own Kafka sink: ``value`` is required."""

# librdkafka settings the sink owns: a user value would break exactly-once.
_OWNED = {
    "transactional.id": "the sink's pool of transactional ids is eosink-<sink key>-<slot>",
    "enable.idempotence": "transactions need the idempotent producer",
    "bootstrap.servers": "pass bootstrap_servers=",
    "delivery.report.only.error": "the sink sets it",
}

# What the sink assumes a producer sends at the least: a chunk must fit in the transaction
# timeout at this rate (checked when the options are read).
MIN_RATE_BYTES_PER_S = 1024 * 1024


_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
TOPIC_MAX_CHARS = 249
"""The longest topic name Kafka accepts."""


def topic_name_problem(name: str) -> str | None:
    """Why Kafka refuses ``name`` as a topic name (its rule: ASCII letters, digits, ``.``,
    ``_`` and ``-``, at most 249 characters, not ``.`` or ``..``), else None."""
    if name in (".", ".."):
        return f"{name!r} is not a valid Kafka topic name ('.' and '..' are refused)"
    if len(name) > TOPIC_MAX_CHARS:
        return (
            f"{name[:40]!r}... ({len(name)} characters) is not a valid Kafka topic name "
            f"(at most {TOPIC_MAX_CHARS} characters)"
        )
    if not _TOPIC_CHARS.match(name):
        bad = "".join(dict.fromkeys(c for c in name if not _TOPIC_CHARS.match(c)))
        return (
            f"{name!r} is not a valid Kafka topic name (it has {bad!r}; Kafka allows ASCII "
            "letters, digits, '.', '_' and '-')"
        )
    return None


def transactional_id(key: str, slot: int | str) -> str:
    """The transactional id of slot ``slot`` of the pool of the sink whose key is ``key``."""
    return f"eosink-{key}-{slot}"


class KafkaSinkOptions(S3Options):
    """Options of the ``kafka`` sink.

    The DataFrame's columns are those of Spark's own Kafka sink: ``value`` (string or
    binary, required; null writes a tombstone), ``key`` (string or binary), ``headers``
    (``array<struct<key: string, value: binary>>``), ``topic`` (string) and ``partition``
    (int). Any other column is refused (select what to write, e.g.
    ``to_json(struct(*)) AS value``).

    Attributes:
        bootstrap_servers: the brokers, ``host:port[,host:port...]``. Spark's spelling
            ``kafka.bootstrap.servers`` is accepted too.
        topic: the topic every record goes to. Without it, each row's ``topic`` column
            names it; with both, the option wins (as in Spark's Kafka sink).
        producer_config: librdkafka settings of the producers (``{"compression.type":
            "lz4", "sasl.password": ...}``); options ``kafka.<setting>`` (Spark's style,
            e.g. ``.option("kafka.linger.ms", "10")``) are added to it. Values of
            credential-like keys are never logged or stored. ``transactional.id``,
            ``enable.idempotence`` and ``bootstrap.servers`` are the sink's. librdkafka
            checks the settings when the sink starts: one it refuses is a ``ConfigError``
            naming it, before any Spark job.
        control_topic: the compacted topic holding the sink's markers (which epoch and chunk
            each transactional id committed last). Default ``eosink-control-<sink key>``;
            created when missing (one partition, ``cleanup.policy=compact``).
        transactions: the size of the sink's fixed pool of transactional ids
            ``eosink-<sink key>-<slot>``: how many transactions publish an epoch in
            parallel. Records of one Spark partition go through one of them, in order. A
            later run with a smaller pool still fences and finishes the ids of a larger one
            (every id that wrote a marker in the control topic).
        chunk_bytes: the most bytes (uncompressed, as staged) one transaction publishes.
            Transactions stay short: ``transaction.timeout.ms`` must leave room for a chunk
            at 1 MiB/s.
        staging_path: where the writers stage an epoch's records before the commit
            publishes them (Parquet files; deleted once published or aborted): a local or
            mounted directory, or ``s3://bucket/prefix`` (boto3, extra ``eosink[s3]``;
            staged by the Python writers, with the ``s3_*`` options). Default (None): a
            stream's under its checkpoint location (``<checkpoint>/eosink/staging``, an
            ``s3a://`` checkpoint giving ``s3://``); a batch run's
            ``$EOSINK_HOME/kafka-staging`` on a local master, and on any other master the
            run is refused until it is set. On a cluster it must be a location every
            executor and the driver reach (a shared mount or S3).
        writer: ``auto`` (default): Spark writes the staged files (the native path) under
            ``eosink.run``, Python writers in Spark tasks under ``format("eosink")`` and
            for staging on S3; ``spark`` or ``python`` force one.
        fsync: fsync staged files before the epoch is checkpointed (local staging).
        timeout_seconds: how long one Kafka operation (init, commit, marker read) may take
            before it counts as failed (and the commit is retried).
        s3_endpoint_url: ``s3://`` staging: the S3 endpoint (default: AWS's).
        s3_region: ``s3://`` staging: the region (default: boto3's configuration).
        s3_access_key_id: ``s3://`` staging: the access key (default: boto3's credential
            chain).
        s3_secret_access_key: ``s3://`` staging: the secret key; never logged or stored.
        s3_session_token: ``s3://`` staging: a session token; never logged or stored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = Field(min_length=1)
    topic: str | None = Field(default=None, min_length=1)
    producer_config: dict[str, Any] = Field(default_factory=dict, repr=False)
    control_topic: str | None = Field(default=None, min_length=1)
    transactions: int = Field(default=4, ge=1, le=64)
    chunk_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    staging_path: str | None = Field(default=None, min_length=1)
    writer: Literal["auto", "spark", "python"] = "auto"
    fsync: bool = True
    timeout_seconds: float = Field(default=30.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _spark_style(cls, data: Any) -> Any:
        """``kafka.bootstrap.servers`` and ``kafka.<setting>`` options, as in Spark's sink."""
        if not isinstance(data, dict):
            return data
        out = {k: v for k, v in data.items() if not str(k).startswith("kafka.")}
        extra = {str(k)[6:]: v for k, v in data.items() if str(k).startswith("kafka.")}
        if "bootstrap.servers" in extra:
            out.setdefault("bootstrap_servers", extra.pop("bootstrap.servers"))
        if extra:
            given = out.get("producer_config") or {}
            if isinstance(given, str):
                given = _json_dict(given)
            out["producer_config"] = {**extra, **dict(given)}
        return out

    @field_validator("topic", "control_topic")
    @classmethod
    def _topic_name(cls, v: str | None) -> str | None:
        problem = None if v is None else topic_name_problem(v)
        if problem:
            raise ValueError(f"{problem}; no topic can have this name")
        return v

    @field_validator("producer_config", mode="before")
    @classmethod
    def _config(cls, v: Any) -> Any:
        if isinstance(v, str):  # .option("producer_config", '{"linger.ms": 10}')
            v = _json_dict(v)
        if isinstance(v, dict):
            for k in v:
                if k in _OWNED:
                    raise ValueError(f"{k!r} cannot be set: {_OWNED[k]}")
        return v

    @field_validator("staging_path")
    @classmethod
    def _staging(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if is_s3(v):
            if not split_s3(v)[0]:
                raise ValueError(f"{v!r} names no bucket; use s3://bucket/prefix")
            return normalize_s3(v)
        if "://" in v and not v.startswith("file://"):
            raise ValueError(
                "staging_path is a local (or shared, mounted) directory or s3://bucket/prefix; "
                f"got {v.split('://')[0]}://"
            )
        return str(Path(v.removeprefix("file://")).expanduser().resolve())

    @model_validator(mode="after")
    def _s3(self) -> KafkaSinkOptions:
        given = self.s3_options_set()
        if self.staging_path is not None and not self.staging_on_s3 and given:
            raise ValueError(
                f"{', '.join(given)} only apply to staging on s3:// "
                f"(staging_path={self.staging_path!r})"
            )
        if self.staging_on_s3 and self.writer == "spark":
            raise ValueError(
                "writer='spark' cannot stage on s3:// (Spark would need hadoop-aws and its own "
                "S3A credentials); use writer='auto': the Python writers upload through boto3"
            )
        return self

    @property
    def staging_on_s3(self) -> bool:
        """Whether the staging location is an S3 prefix."""
        return self.staging_path is not None and self.staging_path.startswith("s3://")

    @model_validator(mode="after")
    def _timeout(self) -> KafkaSinkOptions:
        timeout_ms = int(self.producer_config.get("transaction.timeout.ms", 60000))
        needed_ms = self.chunk_bytes * 1000 // MIN_RATE_BYTES_PER_S
        if needed_ms > timeout_ms:
            raise ValueError(
                f"chunk_bytes={self.chunk_bytes} may take {needed_ms / 1000:.0f} s to produce "
                f"(at 1 MiB/s), longer than the producers' transaction.timeout.ms={timeout_ms}: "
                "the broker would abort such transactions. Lower chunk_bytes or raise "
                "producer_config['transaction.timeout.ms'] (the broker caps it at its "
                "transaction.max.timeout.ms, 15 min by default)"
            )
        return self

    def control(self, sink_id: str) -> str:
        """The control topic of ``sink_id``."""
        return self.control_topic or f"eosink-control-{sink_key(sink_id)}"

    def producer_settings(self, transactional_id: str) -> dict[str, Any]:
        """librdkafka settings of the producer of one transactional id."""
        # librdkafka refuses a request timeout above the transaction timeout (+100 ms).
        txn_ms = int(self.producer_config.get("transaction.timeout.ms", 60000))
        conf: dict[str, Any] = {
            "linger.ms": 5,
            "socket.timeout.ms": min(int(self.timeout_seconds * 1000), txn_ms),
            **self.producer_config,
            "bootstrap.servers": self.bootstrap_servers,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "delivery.report.only.error": True,
        }
        return conf

    def client_settings(self) -> dict[str, Any]:
        """Settings for the admin client and the marker consumer: connection and security
        settings of ``producer_config`` (``security.protocol``, ``sasl.*``, ``ssl.*``...)."""
        keep = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "api.")
        conf = {k: v for k, v in self.producer_config.items() if k.startswith(keep)}
        conf["bootstrap.servers"] = self.bootstrap_servers
        return conf


def _json_dict(v: str) -> dict[str, Any]:
    try:
        parsed = json.loads(v)
    except ValueError:
        raise ValueError("producer_config given as a string must be a JSON object") from None
    if not isinstance(parsed, dict):
        raise ValueError("producer_config given as a string must be a JSON object")
    return parsed


def redact(text: str, opts: KafkaSinkOptions) -> str:
    """``text`` without the secrets of ``producer_config`` (:func:`eosink.util.redact`)."""
    return _redact(text, opts.producer_config)


def check_columns(names: list[str]) -> None:
    """Raise unless ``names`` are columns the sink writes, ``value`` among them."""
    unknown = [n for n in names if n not in COLUMNS]
    if unknown or "value" not in names:
        from eosink import SchemaMismatchError

        what = f"also has {', '.join(map(repr, unknown))}" if unknown else "has no 'value' column"
        raise SchemaMismatchError(
            "the kafka sink writes the columns value (required), key, headers, topic and "
            f"partition, as Spark's Kafka sink; this DataFrame {what}. Select what to write, "
            "e.g. df.selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value')"
        )


def require_kafka() -> None:
    """Raise :class:`~eosink.MissingExtraError` naming the extra unless confluent-kafka imports."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
        from eosink import MissingExtraError

        raise MissingExtraError("confluent_kafka", "kafka", "the kafka sink") from exc
