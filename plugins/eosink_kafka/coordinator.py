"""The kafka sink's coordinator: stage, then publish each chunk with its marker in one transaction.

``pre_commit`` cuts the epoch's staged files into chunks and assigns every file to a slot of
the fixed pool of transactional ids (file ``i`` to slot ``i % transactions``); the
committable lists, per slot, the chunks in order. ``commit`` publishes the slots in parallel
(one thread per slot on the driver): per chunk ``begin_transaction`` -> the records -> the
slot's new marker -> ``commit_transaction``, skipping what the marker already covers, so a
replayed commit publishes nothing twice. No transaction is open across a checkpoint: a new
driver never needs to finish a transaction a dead one opened (librdkafka cannot).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from eosink import (
    ConfigError,
    FencedError,
    Prepared,
    Retirable,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)

from .options import (
    KafkaSinkOptions,
    check_columns,
    sink_key,
    topic_name_problem,
    transactional_id,
)
from .staging import (
    LocalStage,
    S3Stage,
    Stage,
    chunks_of,
    fsync_path,
    largest_record,
    merge_targets,
    read_chunk,
    stage_of,
    staged_file_info,
    targets_of,
)

__all__ = ["KafkaCoordinator", "describe_open", "make_coordinator", "validate_schema"]

log = logging.getLogger("eosink.kafka")

PRODUCER_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""
BATCH_OVERHEAD_BYTES = 128
"""A record batch's header (61 bytes) and one record's framing, rounded up: what a record
adds to its key, value and headers on the wire, uncompressed."""


def describe_open(
    sink_id: str, last: dict[str, Any] | None, pending: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The transactions a PENDING epoch's commit runs, for ``eosink status``.

    No transaction is open across a checkpoint, so a COMMITTED epoch leaves none. A PENDING
    one is published by its slots' transactional ids; if a commit was interrupted, the
    transaction it had begun stays open at the broker (holding back ``read_committed``
    readers of its partitions) until the sink's next start or ``eosink recover`` fences the
    id, or the broker's ``transaction.timeout.ms`` aborts it.
    """
    key = sink_key(sink_id)
    out = []
    for epoch in sorted(pending):
        for n, chunks in sorted(pending[epoch]["slots"].items(), key=lambda kv: int(kv[0])):
            if not chunks:
                continue
            txn = transactional_id(key, n)
            records = sum(int(c[2]) - int(c[1]) for c in chunks)
            out.append(
                {
                    "kind": "transaction",
                    "what": f"{txn}: epoch {epoch}, {len(chunks)} transaction(s) of "
                    f"{records} records to publish (one may be open at the broker if a "
                    "commit was interrupted)",
                    "transactional_id": txn,
                    "epoch": epoch,
                    "chunks": len(chunks),
                    "records": records,
                }
            )
    return out


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


def _observe_largest(df: Any) -> tuple[Any, Any]:
    """``df`` observed for its largest record (key, value and headers bytes, as librdkafka
    counts them), and a function that returns it once the write ran (None: not observed)."""
    try:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        names = set(df.columns)
        parts = [
            F.coalesce(F.octet_length(F.col(c)), F.lit(0)) for c in ("value", "key") if c in names
        ]
        if "headers" in names:
            parts.append(
                F.coalesce(
                    F.expr(
                        "aggregate(headers, 0L, (acc, h) -> acc + "
                        "coalesce(octet_length(h.key), 0) + coalesce(octet_length(h.value), 0))"
                    ),
                    F.lit(0),
                )
            )
        size = parts[0]
        for more in parts[1:]:
            size = size + more
        obs = Observation(f"eosink_largest_{uuid.uuid4().hex[:8]}")
        observed = df.observe(obs, F.max(size.cast("long")).alias("largest"))
    except Exception as exc:  # a front end without observe(): the files are read instead
        log.debug("kafka sink: records not observed (%s)", exc)
        return df, lambda: None

    def largest() -> int | None:
        try:
            value = obs.get.get("largest")
        except Exception as exc:
            log.debug("kafka sink: no observed record size (%s)", exc)
            return None
        return int(value or 0)

    return observed, largest


def _largest_of_file(path: Any) -> int:
    """:func:`largest_record` of a staged file (its key, value and headers columns)."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    cols = [c for c in ("value", "key", "headers") if c in names]
    return largest_record(pq.read_table(path, columns=cols)) if cols else 0


def _per_slot(fn: Callable[[int], None], numbers: list[int], prefer: type[Exception]) -> None:
    """``fn(n)`` for every slot number, one thread each (inline for one). Once all have
    finished, the first error is raised, the first of type ``prefer`` if any."""
    if len(numbers) == 1:
        fn(numbers[0])
        return
    with ThreadPoolExecutor(max_workers=len(numbers)) as pool:
        futures = [pool.submit(fn, n) for n in numbers]
        errors = [exc for exc in (fut.exception() for fut in futures) if exc is not None]
    if errors:
        raise ([e for e in errors if isinstance(e, prefer)] or errors)[0]


class KafkaCoordinator(
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    SparkWriter[dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    Retirable,
):
    """Publishes staged chunks through a fixed pool of transactional ids (see the module)."""

    def __init__(self, opts: KafkaSinkOptions, sink_id: str) -> None:
        from .transactions import Admin, check_producer_config

        check_producer_config(opts)  # first: a bad setting would fail every commit
        self.opts = opts
        self.sink_id = sink_id
        self.key = sink_key(sink_id)
        self.stage = stage_of(opts)
        self.control_topic = opts.control(sink_id)
        self.admin = Admin(opts)
        self.slots: dict[int, Any] = {}
        self.sink_marker: dict[str, Any] | None = None
        self.cluster = ""

    # -- the pool --------------------------------------------------------------------------
    def _slot(self, n: int) -> Any:
        from .transactions import Slot

        slot = self.slots.get(n)
        if slot is None:
            slot = self.slots[n] = Slot(
                self.opts, transactional_id(self.key, n), self.control_topic, f"{self.key}/{n}"
            )
        return slot

    def _ready(self, numbers: Iterable[int]) -> None:
        """Initialise the slots that are not, then read their markers.

        Order matters: ``init_transactions`` of a slot fences its zombies (aborting their
        open transaction) *before* its marker is read, so the marker read is final. Slots of
        the sink that are not asked for but left marker records in open transactions (a
        larger pool of an earlier run) are initialised too: their open transactions would
        hold the control topic's last stable offset back until they time out.
        """
        from .transactions import read_markers

        want = set(numbers)
        todo = {n for n in want if not self._slot(n).ready}
        if not todo:
            return
        prefix = f"{self.key}/"
        for key in read_markers(self.opts, self.control_topic, prefix, committed=False):
            number = key[len(prefix) :]
            if number.isdigit() and not self._slot(int(number)).ready:
                todo.add(int(number))
        # At once: each waits ~0.3 s for the broker (one after the other, a pool of 16
        # took ~4 s per start and per format("eosink") micro-batch).
        _per_slot(lambda n: self._slot(n).init(), sorted(todo), ConfigError)
        markers = read_markers(self.opts, self.control_topic, prefix)
        for n in todo:
            slot = self._slot(n)
            slot.marker = markers.get(slot.marker_key)
            slot.ready = True
        self.sink_marker = markers.get(f"{self.key}/sink", self.sink_marker)

    def init(self) -> None:
        """Fence every id of the pool (aborting lingering transactions), read the markers."""
        self.stage.ensure(self.key)  # first: a missing bucket is a configuration error
        if self.opts.topic is not None:
            self.admin.check_topic(self.opts.topic)
        self.cluster = self.admin.cluster_id()
        self.admin.ensure_control_topic(self.control_topic)
        # Every id of the pool, and every id of the sink that ever wrote a marker (a larger
        # pool of an earlier run): fenced, lingering transactions aborted.
        self._ready(range(self.opts.transactions))
        log.info(
            "kafka sink %s: %d transactional id(s) eosink-%s-<n> ready; control topic %s",
            self.sink_id,
            len(self.slots),
            self.key,
            self.control_topic,
        )

    def target_id(self) -> str:
        where = self.opts.topic if self.opts.topic is not None else "<topic column>"
        return f"kafka:{self.cluster}/{where}"

    # -- the marker ------------------------------------------------------------------------
    def _last_epoch(self) -> int:
        from .transactions import marker_top

        last = int((self.sink_marker or {}).get("last_epoch", -1))
        for slot in self.slots.values():
            last = max(last, marker_top(slot.marker))
        return last

    def read_marker(self) -> dict[str, Any] | None:
        last = self._last_epoch()
        if self.sink_marker is None and last < 0:
            return None
        out = dict(self.sink_marker or {})
        out["last_epoch"] = last
        return out

    def write_marker(self, marker: dict[str, Any]) -> None:
        value = {**marker, "last_epoch": self._last_epoch()}
        slot = self._slot(0)
        self._ready([0])
        slot.write_marker(f"{self.key}/sink", value)
        self.sink_marker = value

    def retire_records(self, dry_run: bool) -> list[str]:
        """``eosink retire``: tombstones for the markers of the sink's transactional ids in
        the control topic (the sink's own marker, the retirement's, stays)."""
        from .transactions import read_markers

        prefix = f"{self.key}/"
        numbers = sorted(
            int(k[len(prefix) :])
            for k in read_markers(self.opts, self.control_topic, prefix)
            if k[len(prefix) :].isdigit()
        )
        if not numbers:
            return []
        if not dry_run:
            self._ready(numbers)
            for n in numbers:
                self._slot(n).delete_marker()
        return [
            f"{len(numbers)} marker record(s) of transactional ids eosink-{self.key}-<n> in "
            f"control topic {self.control_topic} (tombstones)"
        ]

    # -- staging ---------------------------------------------------------------------------
    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        if self.opts.writer == "python":
            return "the kafka sink's option writer='python'"
        if isinstance(self.stage, S3Stage):
            return (
                "the kafka sink stages on S3 (Spark has no s3:// file system without "
                "hadoop-aws): the Python writers upload through boto3"
            )
        return None

    def write_with_spark(
        self, df: Any, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Spark's Parquet writer stages the epoch's records (one file per partition)."""
        assert isinstance(self.stage, LocalStage)
        root = self.stage.root
        stage = root / self.key / str(epoch) / attempt
        df, largest = _observe_largest(df)
        df.write.mode("error").option(
            "mapreduce.fileoutputcommitter.marksuccessfuljobs", "false"
        ).parquet(str(stage))
        biggest = largest()
        files: list[dict[str, Any]] = []
        for p in sorted(stage.glob("part-*")) if stage.is_dir() else []:
            if not p.is_file():
                continue
            rows, size = staged_file_info(p)
            if rows == 0:
                p.unlink()
                continue
            rel = p.relative_to(root).as_posix()
            f = {"staged": rel, "rows": rows, "bytes": p.stat().st_size, "raw": size}
            f["targets"] = [[t, n] for t, n in self._targets_of_file(p).items()]
            f["largest"] = biggest if biggest is not None else _largest_of_file(p)
            files.append(f)
        if self.opts.fsync:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(fsync_path, [root / str(f["staged"]) for f in files]))
            if stage.is_dir():
                fsync_path(stage)
        return [{"files": files}]

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        """The rows of the staged files this driver found must be the rows Spark wrote: on a
        cluster whose ``staging_path`` is not shared, the executors' files are elsewhere,
        and the epoch is refused before it is persisted."""
        seen = sum(int(f["rows"]) for r in results for f in r["files"])
        if seen != rows:
            raise SinkError(
                f"kafka sink epoch {epoch}: Spark staged {rows} rows under {self.stage.url}, "
                f"but this driver finds {seen} there: staging_path is not shared by the "
                "executors and the driver. Nothing was published; set staging_path to a "
                "location every node reaches (a shared mount, or s3://bucket/prefix)"
            )

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

    # -- the protocol ----------------------------------------------------------------------
    def pre_commit(self, epoch: int, results: Sequence[dict[str, Any]]) -> Prepared[dict[str, Any]]:
        """The committable: the chunks of every slot, and the staging location they are in
        (a later run finds them there even if its own ``staging_path`` differs)."""
        files = sorted((f for r in results for f in r["files"]), key=lambda f: str(f["staged"]))
        # Before anything is persisted: the driver must see what the executors staged, and
        # the records' topics (and partitions) must exist.
        self.stage.check_visible(files)
        self._check_targets(epoch, files)
        slots: dict[str, list[list[Any]]] = {}
        rows = nbytes = 0
        for i, f in enumerate(files):
            raw = f.get("raw")
            if raw is None:
                _, raw = self.stage.file_info(f["staged"])
            chunks = chunks_of(f["staged"], int(f["rows"]), int(raw), self.opts.chunk_bytes)
            slots.setdefault(str(i % self.opts.transactions), []).extend(chunks)
            rows += int(f["rows"])
            nbytes += int(raw)
        n_chunks = sum(len(c) for c in slots.values())
        committable = {"slots": slots, "rows": rows, "root": self.stage.url}
        return Prepared(committable, files=n_chunks, bytes=nbytes)

    def _stage_of(self, committable: dict[str, Any] | None) -> Stage:
        """Where an epoch's files are: the committable's root (older committables have
        none: this run's ``staging_path``)."""
        root = (committable or {}).get("root")
        if root is None or root == self.stage.url:
            return self.stage
        return stage_of(self.opts, str(root))

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        """Publish every chunk its slot's marker does not cover; idempotent by the markers."""
        stage = self._stage_of(committable)
        slots = {int(n): chunks for n, chunks in committable["slots"].items() if chunks}
        if not slots:
            stage.delete_epoch(self.key, epoch, None)
            return
        from .transactions import covered

        self._ready(slots)

        def publish(n: int) -> None:
            slot = self._slot(n)
            chunks = slots[n]
            cache: dict[str, pa.Table] = {}
            for index, chunk in enumerate(chunks):
                if covered(slot.marker, epoch, index):
                    continue
                records = read_chunk(stage, chunk, self.opts.topic, cache)
                slot.publish(epoch, index, index == len(chunks) - 1, records)
                if index == 0:
                    fault_point("mid_commit")

        _per_slot(publish, sorted(slots), FencedError)
        stage.delete_epoch(self.key, epoch, None)

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        """Delete the epoch's staged files (nothing of it was ever produced): in this run's
        staging location and in the committable's, if that is another."""
        stages = [self.stage]
        try:
            other = self._stage_of(committable)
            if other is not self.stage:
                stages.append(other)
            for stage in stages:
                stage.delete_epoch(self.key, epoch, lambda: fault_point("mid_abort"))
        except Exception:
            log.exception("kafka sink: abort of epoch %d could not delete its staged data", epoch)

    def staged_epochs(self) -> Iterable[int]:
        return self.stage.epochs(self.key)

    def close(self) -> None:
        for slot in self.slots.values():
            slot.close()


def make_coordinator(opts: KafkaSinkOptions, sink_id: str) -> KafkaCoordinator:
    from .options import require_kafka

    require_kafka()
    if opts.staging_on_s3:
        try:
            import boto3  # noqa: F401
        except ImportError as exc:  # pragma: no cover - exercised without the extra
            from eosink import MissingExtraError

            raise MissingExtraError("boto3", "s3", "the kafka sink's staging on s3://") from exc
    return KafkaCoordinator(opts, sink_id)
