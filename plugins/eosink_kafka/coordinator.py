"""The kafka sink's coordinator: stage, then publish each chunk with its marker in one transaction.

``pre_commit`` cuts the epoch's staged files into chunks and assigns every file to a slot of
the fixed pool of transactional ids (file ``i`` to slot ``i % transactions``); the
committable lists, per slot, the chunks in order. ``commit`` publishes the slots in parallel
(one thread per slot on the driver): per chunk ``begin_transaction`` -> the records -> the
slot's new marker -> ``commit_transaction``, skipping what the marker already covers, so a
replayed commit publishes nothing twice. No transaction is open across a checkpoint: a new
driver never needs to finish a transaction a dead one opened (librdkafka cannot).

The coordinator is made of the sink's parts:

* ``checks.py``: ``validate_schema`` and the epoch's records checked before it is persisted;
* ``native.py``: Spark's writer staging an epoch (the native path);
* ``pool.py``: the pool of transactional ids;
* ``marker.py``: the markers in the control topic;
* ``status.py``: what a PENDING epoch leaves open, for ``eosink status``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from eosink import (
    FencedError,
    Prepared,
    Retirable,
    SinkCommitCoordinator,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)

from .marker import Markers
from .native import SparkStaging
from .options import KafkaSinkOptions, sink_key
from .pool import per_slot
from .records import chunks_of, read_chunk
from .stage import Stage, stage_of

__all__ = ["KafkaCoordinator", "make_coordinator"]

log = logging.getLogger("eosink.kafka")


class KafkaCoordinator(
    SparkStaging,
    Markers,
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    SparkWriter[dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    Retirable,
):
    """Publishes staged chunks through a fixed pool of transactional ids (see the module)."""

    def __init__(self, opts: KafkaSinkOptions, sink_id: str) -> None:
        from .admin import Admin, check_producer_config

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
        from .control import covered

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

        per_slot(publish, sorted(slots), FencedError)
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
