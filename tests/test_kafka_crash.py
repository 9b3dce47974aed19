"""The kafka sink's crash matrix: SIGKILL the driver, restart, read the topic independently.

Each case runs tests/crashjob.py with ``--sink kafka`` (key = ``grp``, value = the row as
JSON, one key's rows in one Spark partition) against the session's real broker, kills it at
fault points (``EOSINK_FAULT``), restarts it until it exits 0, then a plain confluent-kafka
consumer with ``read_committed`` reads the topic to the end of every partition and compares
it with the input row by row: every id exactly once with its key and payload, per key the
ids of an epoch in order, nothing left in the sink's staging directory, every epoch
COMMITTED. Where a crash left a transaction open (records produced, no commit), a
``read_uncommitted`` consumer sees those aborted records too, and still no committed record
twice.

Chains of points fire in successive runs (as in test_crash.py). Chunks are small
(``chunk_bytes=1024``: several transactions per slot and epoch) so that ``mid_commit`` and
``kafka_*`` points land between and inside the transactions of one slot.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness import (
    GROUPS,
    Job,
    crash_chain,
    epoch_states,
    expected_epochs,
    kafka_sink_options,
    make_input,
    read_topic,
)

pytestmark = pytest.mark.crash

ROWS = 60  # rows per input file: one file per micro-batch

# The eosink.run stream's chains (a chunk's transaction left open, kills between the chunks
# of a slot and after the commit; kills inside recovery's abort) and random kills of its
# stream run in tests/test_lifecycle_kills.py, whose driver runs the stream's real
# lifecycle without Spark, against this broker, checked by check_topic below. Here: what
# needs Spark (its tasks, format("eosink"), a batch job's executors and staging).
# A format("eosink") stream and batch (the commit runs in Spark's Python data source worker:
# the whole driver is killed there).
DS_FAULTS = [["mid_commit@2"]]
DS_BATCH_FAULTS = [["mid_commit"]]
# eosink.run's batch chains: tests/test_lifecycle_kills.py too.


def kafka_job(kafka: Any, tmp: Path, mode: str, metastore: str, **extra: Any) -> tuple[Job, str]:
    """A crash job of the kafka sink writing to a new 2-partition topic; returns it and the
    topic. ``extra``: more crashjob options; ``sink_options`` are merged over the job's."""
    opts = kafka_sink_options(
        kafka, tmp, "crash", **{"chunk_bytes": 1024, **extra.pop("sink_options", {})}
    )
    return Job(tmp, mode, metastore, sink_options=opts, sink="kafka", **extra), opts["topic"]


def check_topic(
    job: Job,
    expected: list[int],
    *,
    aborted: bool = False,
    per_epoch: int | None = None,
    unordered: frozenset[bytes] = frozenset(),
) -> list[int]:
    """The topic holds every id of ``expected`` exactly once (``read_committed``), each with
    its key and payload; per key, the ids of one epoch in ascending order (``per_epoch``: a
    stream's epoch is one input file of that many rows; without it, the whole topic is
    checked as one epoch); nothing staged; every epoch COMMITTED. ``aborted``:
    ``read_uncommitted`` sees records no committed transaction holds (a crash left a
    transaction open), every one a copy of a committed record. ``unordered``: keys whose
    order is not checked. Returns the ids of those aborted records."""
    bootstrap = str(job.sink_options["bootstrap_servers"])
    topic = str(job.sink_options["topic"])
    committed = read_topic(bootstrap, topic, "read_committed")
    ids: list[int] = []
    order: dict[tuple[int, bytes | None, int], list[int]] = {}
    for rec in committed:
        assert rec.value is not None
        row = json.loads(rec.value)
        i = int(row["id"])
        ids.append(i)
        assert row == {"id": i, "grp": GROUPS[i % len(GROUPS)], "payload": f"payload-{i}"}, row
        assert rec.key == row["grp"].encode(), (rec.key, row)
        epoch = i // per_epoch if per_epoch else 0
        order.setdefault((rec.partition, rec.key, epoch), []).append(i)
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert sorted(ids) == expected, (
        f"{len(ids)} records read back, {len(expected)} written; missing "
        f"{sorted(set(expected) - set(ids))[:10]}, duplicated {dup[:10]}"
    )
    for (part, key, epoch), seq in order.items():
        if key not in unordered:
            assert seq == sorted(seq), f"partition {part} key {key!r} epoch {epoch}: {seq}"

    everything = read_topic(bootstrap, topic, "read_uncommitted")
    seen = {(r.partition, r.offset) for r in committed}
    assert seen <= {(r.partition, r.offset) for r in everything}
    extra = [r for r in everything if (r.partition, r.offset) not in seen]
    for rec in extra:
        assert rec.value is not None and json.loads(rec.value)["id"] in set(expected)
    if aborted:
        assert extra, "no aborted record: the crash left no open transaction"

    assert job.kafka_staged() == []
    states = epoch_states(job.metastore_url, job.sink_id)
    assert sorted(states.get("COMMITTED", [])) == expected_epochs(job), states
    assert "PENDING" not in states and "ABORTED" not in states, states
    return [int(json.loads(r.value)["id"]) for r in extra if r.value is not None]


@pytest.mark.parametrize("faults", DS_FAULTS, ids=lambda f: "+".join(f))
def test_kafka_datasource_stream_crash(kafka: Any, tmp_path: Path, faults: list[str]) -> None:
    """The same protocol through ``writeStream.format("eosink")``: the driver (or Spark's
    data source worker, for the commit points) dies; every record once, in order per key."""
    job, _ = kafka_job(kafka, tmp_path, "ds-stream", f"sqlite:///{tmp_path / 'm.db'}")
    expected = make_input(job.input, files=3 + len(faults), rows=ROWS)
    crash_chain(job, faults)
    check_topic(job, expected, per_epoch=ROWS)


@pytest.mark.parametrize("faults", DS_BATCH_FAULTS, ids=lambda f: "+".join(f))
def test_kafka_datasource_batch_crash(kafka: Any, tmp_path: Path, faults: list[str]) -> None:
    """``write.format("eosink")``: the commit killed between two chunks' transactions; the
    restart commits the rest; every record once."""
    job, _ = kafka_job(kafka, tmp_path, "ds-batch", f"sqlite:///{tmp_path / 'm.db'}")
    expected = make_input(job.input, files=4, rows=ROWS)
    crash_chain(job, faults)
    check_topic(job, expected)


@pytest.mark.parametrize("point", ["task_before_finish", "task_after_finish"])
def test_kafka_executor_lost_mid_stage(kafka: Any, tmp_path: Path, point: str) -> None:
    """A task's Python worker dies before its writer's finish_write (the staged Parquet file
    of that attempt is left half-written) or right after it (the file is complete, its
    result never reaches the driver); Spark retries the task; the commit publishes the
    retry's records once and the epoch's staging directory, the dead attempt's file with it,
    is gone."""
    job, _ = kafka_job(
        kafka,
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'm.db'}",
        master="local[2,3]",
        sink_options={"writer": "python"},
    )
    expected = make_input(job.input, files=3, rows=ROWS)
    job.assert_fired(point, job.run(fault=f"{point}@2"))
    check_topic(job, expected, per_epoch=ROWS)


def _proc_state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped by a signal)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("pause", ["short"])
def test_kafka_zombie_driver_is_fenced(kafka: Any, tmp_path: Path, pause: str) -> None:
    """Driver A freezes (SIGSTOP) with a chunk's transaction open: records and marker
    produced and flushed, commit_transaction not called. Driver B starts on the same sink,
    fences A's transactional ids (aborting A's transaction) and finishes the job. A, woken
    up, must fail without publishing anything.

    A's last error must be eosink's ``FencedError``, by one of two fences, whichever A meets
    first (CI has seen each in each case; it depends on timing): Kafka's (its commit, or
    the partitions of its next chunk, refused: "Kafka fenced this producer"), or the meta
    store's (librdkafka timed the commit out locally on waking, a transient error; the
    core's retry checks the meta store before it could initialise the transactional ids
    again, which would fence a live B: "was fenced by a newer one"). ``short``: A's pause
    (B's whole run) is shorter than its producers' request timeout (``timeout_seconds=300``).
    ``long``: A stays frozen 50 s, far past the request timeout (``timeout_seconds=5``), as
    a long GC pause or a suspended VM would."""
    # librdkafka's request timeout is timeout_seconds, capped at transaction.timeout.ms.
    timeout, txn_ms = (300, "300000") if pause == "short" else (5, "60000")
    job, _ = kafka_job(
        kafka,
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'm.db'}",
        sink_options={"timeout_seconds": timeout, "kafka.transaction.timeout.ms": txn_ms},
    )
    expected = make_input(job.input, files=3, rows=ROWS)
    env = job._env("kafka_before_commit@3")
    env["EOSINK_FAULT_SIGNAL"] = "STOP"
    marks = job.marks
    log_a = tmp_path / "run-a.log"
    with open(log_a, "w") as fh:
        a = subprocess.Popen(
            job.argv(), env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    job.logs.append("")  # A's run: B's gets the next log and fault-mark directory
    try:
        deadline = time.monotonic() + 120
        while not any(marks.iterdir()):
            assert a.poll() is None, log_a.read_text()[-4000:]
            assert time.monotonic() < deadline, "driver A never reached kafka_before_commit"
            time.sleep(0.1)
        # The mark is written right before the SIGSTOP: wait until A is stopped (state T).
        while _proc_state(a.pid) != "T":
            assert a.poll() is None, log_a.read_text()[-4000:]
            assert time.monotonic() < deadline, f"driver A not stopped: {_proc_state(a.pid)}"
            time.sleep(0.02)
        stopped = time.monotonic()
        assert job.run() == 0, job.last_log()  # driver B
        if pause == "long":
            time.sleep(max(0.0, 50 - (time.monotonic() - stopped)))
        os.kill(a.pid, signal.SIGCONT)
        code_a = a.wait(timeout=120)
    finally:
        try:
            os.killpg(a.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = log_a.read_text()
    assert code_a not in (0, -9), text[-4000:]
    # A's last error (the last exception line of its log): eosink's fence, either one.
    finals = re.findall(r"^([\w.]+(?:Error|Exception)): (.*)$", text, re.MULTILINE)
    assert finals, text[-4000:]
    kind, message = finals[-1]
    assert kind == "eosink.errors.FencedError", text[-4000:]
    by_kafka = "Kafka fenced this producer" in message
    assert by_kafka or "was fenced by a newer one" in message, text[-4000:]
    if not by_kafka:  # the meta store's fence stopped a retry of a transient failure
        assert "retrying in" in text and "commit failed for good" in text, text[-4000:]
    extra = check_topic(job, expected, aborted=True, per_epoch=ROWS)
    # The aborted records are A's flushed chunk: one transaction of the epoch A was
    # committing, never more than that epoch's rows.
    assert len({i // ROWS for i in extra}) == 1 and len(extra) <= ROWS, sorted(extra)


@pytest.mark.release
def test_kafka_broker_restart_during_stream(kafka: Any, tmp_path: Path) -> None:
    """The broker is killed (SIGKILL) and restarted while a stream commits its epochs. With
    ``timeout_seconds=5`` a commit that meets the outage fails (``CommitStateUnknownError``,
    transient) and the core retries it (the slots are initialised again and their markers
    re-read) until the broker is back; exactly once."""
    job, _ = kafka_job(
        kafka,
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'm.db'}",
        sink_options={"timeout_seconds": 5},
    )
    expected = make_input(job.input, files=5, rows=ROWS)
    outage: list[float] = []

    def restart_after_first_commit() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if epoch_states(job.metastore, job.sink_id).get("COMMITTED"):
                    break
            except Exception:  # no schema yet
                pass
            time.sleep(0.05)
        outage.append(time.time())
        kafka.kill()
        # Down until a commit has met the outage and failed (timeout_seconds=5), however long
        # the stream takes to reach its next commit on a loaded machine; then back.
        live_log = job.tmp / f"run-{len(job.logs)}.log"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if "commit failed" in live_log.read_text(errors="replace"):
                break
            time.sleep(0.2)
        kafka.start()
        outage.append(time.time())

    restarter = threading.Thread(target=restart_after_first_commit)
    restarter.start()
    try:
        code = job.run()
    finally:
        restarter.join()
    log = job.logs[-1]
    assert code == 0, job.last_log()
    assert len(outage) == 2, "the broker was not restarted"
    # Some epoch's commit ran across the outage, and failed at least once.
    figures = ast.literal_eval(log[log.index("RESULT ") + 7 :].splitlines()[0])
    spans = [(f["committed_at"] - f["commit_ms"] / 1000, f["committed_at"]) for f in figures]
    assert any(start < outage[1] and end > outage[0] for start, end in spans), (outage, spans)
    assert "commit failed" in log, job.last_log()
    check_topic(job, expected, per_epoch=ROWS)
