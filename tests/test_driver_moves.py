"""A driver that restarts on another machine: only the checkpoint and the target survive.

On a cluster a driver is restarted elsewhere (a Kubernetes pod, a YARN attempt, a re-created
job cluster): its HOME, and so eosink's default meta store (``~/.eosink/metastore.db``), is
new. Each run here is such a driver: default settings (no ``metastore_url``), its own HOME,
TMPDIR and working directory (:meth:`harness.Job.on_machine`), killed with SIGKILL at a
fault point between ``after_persist`` and ``after_mark_committed`` (the epochs phase 2 owes)
or at random instants, and the next run starts on yet another machine. It must finish every
checkpointed epoch by itself, from eosink's journal in the checkpoint: exact (an independent
reader compares the output with the input row by row), never refused, nothing staged left.

Two drivers of one stream on two machines at once (a zombie pod and its replacement) fence
each other through the checkpoint's journal, whatever meta store each has.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from harness import (
    Job,
    check_commits_at_target,
    epoch_states,
    expected_epochs,
    make_input,
    read_ids,
    staged_files,
)

pytestmark = pytest.mark.crash

# Each run on a new machine, killed around Spark's checkpoint: an epoch PENDING that Spark
# did not checkpoint (the next machine re-runs it), then one it checkpointed (the next
# machine commits it from the journal). Every point between PENDING and COMMITTED, each in a
# run on a new machine, is killed in tests/test_lifecycle_kills.py (test_driver_moves_chain:
# this stream's lifecycle without Spark, and format("eosink")'s, with random kills too),
# which caught the broken variant this chain caught, a moved driver that takes nothing from
# the checkpoint's journal (docs/testing.md); and on pyspark 3.5 by
# tests/test_spark_lines.py.
CHAIN = ["after_persist@2", "before_commit@1"]
# The other sinks: the points where their own code runs.
SHORT_CHAIN = [
    "after_persist@2",
    "before_commit@1",
    "mid_commit@1",
    "after_commit@1",
    "after_mark_committed@1",
]
FILES = 8  # input files: one micro-batch each, enough for the whole chain


def moving_chain(job: Job, faults: list[str]) -> None:
    """Run ``job`` once per fault, each on a new machine, then to the end on another one."""
    for n, fault in enumerate(faults):
        job.on_machine(f"m{n}")
        job.assert_fired(fault, job.run(fault=fault))
    job.on_machine("last")
    assert job.run() == 0, job.last_log()
    logs = "\n".join(job.logs)
    assert "SinkIdentityError" not in logs and "NewCheckpointError" not in logs
    # Later drivers took epochs from the journal (their meta stores were new, empty).
    assert "PENDING in the checkpoint's journal" in logs


def check_files(job: Job, expected: list[int], partitioned: bool) -> None:
    got = read_ids(job.out, partitioned)
    assert got == expected, (
        f"{len(got)} rows read back, {len(expected)} written; "
        f"missing {sorted(set(expected) - set(got))[:10]}, "
        f"duplicated {sorted({i for i in got if got.count(i) > 1})[:10]}"
    )
    assert staged_files(job.out) == []
    check_states(job)


def check_states(job: Job) -> None:
    """Every epoch the job ran is COMMITTED in some machine's meta store (the epochs a
    killed driver left PENDING, in the store of the machine that recovered them), the last
    machine's store has none PENDING or ABORTED, and the journal holds no entry but the
    newest committed epoch's (of one generation: a driver that wrote an epoch again
    deleted the dead driver's entry of it)."""
    import sqlite3

    committed: set[int] = set()
    for db in sorted(job.tmp.glob("machines/*/home/.eosink/metastore.db")):
        with contextlib.closing(sqlite3.connect(db)) as c:
            tables = {r[0] for r in c.execute("select name from sqlite_master")}
        if "pending_sink_state" not in tables:
            continue  # a driver killed before its store had its tables
        committed.update(epoch_states(f"sqlite:///{db}", job.sink_id).get("COMMITTED", []))
    assert sorted(committed) == expected_epochs(job), committed
    states = epoch_states(job.metastore_url, job.sink_id)
    assert states.get("COMMITTED"), states
    assert "PENDING" not in states and "ABORTED" not in states, states
    if job.mode == "batch":  # the batch journal beside the files: epoch 5 recorded committed
        journal = job.out / "_eosink" / "journal"
        assert list(journal.glob("*/pending/*")) == []
        assert [p.name for p in journal.glob("*/committed/*")] == ["000000000005.batch"]
        return
    pending = sorted(job.checkpoint.glob("eosink/*/pending/*.json"))
    epochs = [int(p.name.split(".")[0]) for p in pending]
    assert epochs == [max(states["COMMITTED"])], pending
    # The newest generation names this sink and the checkpoint's lineage.
    newest = max(job.checkpoint.glob("eosink/*/generations/*.json"), key=lambda p: int(p.stem))
    state = json.loads(newest.read_text())
    lineage = json.loads((job.checkpoint / "eosink-lineage.json").read_text())["lineage"]
    assert state["sink_id"] == job.sink_id and state["lineage"] == lineage, state


@pytest.mark.parametrize(
    ("mode", "commit_mode", "faults"),
    [
        # The defaults, and format("eosink") (whose streams commit inline: an inline
        # eosink.run stream's recovery is the same; tests/test_crash.py kills it in place).
        pytest.param("stream", "after_checkpoint", CHAIN, id="stream"),
        pytest.param(
            "ds-stream",
            "",
            ["after_persist@2", "mid_commit@2"],
            id="format-eosink",
            marks=pytest.mark.release,
        ),
    ],
)
def test_file_sink_driver_moves(
    tmp_path: Path, mode: str, commit_mode: str, faults: list[str]
) -> None:
    extra = {"commit_mode": commit_mode} if commit_mode else {}
    job = Job(tmp_path, mode, "default", partition_by="grp", **extra)
    expected = make_input(job.input, files=len(faults) + 3, rows=50)  # a micro-batch a file
    moving_chain(job, faults)
    check_files(job, expected, partitioned=True)


@pytest.mark.release
def test_iceberg_driver_moves(tmp_path: Path) -> None:
    from test_iceberg import iceberg_rows, orphan_files

    job = Job(tmp_path, "stream", "default", sink="iceberg")
    expected = make_input(job.input, files=FILES, rows=50)
    moving_chain(job, SHORT_CHAIN)
    opts = job.iceberg_options()
    assert sorted(r["id"] for r in iceberg_rows(opts)) == expected
    assert orphan_files(opts) == []
    check_states(job)


@pytest.mark.release
def test_kafka_driver_moves(tmp_path: Path, kafka: Any) -> None:
    """Kafka with its staging left to the default (under the stream's checkpoint, shared):
    a driver on a new machine publishes the chunks the previous one staged. (Staging on S3
    is read back the same way: tests/test_kafka_staging.py.)"""
    from test_kafka_crash import check_topic, kafka_job

    job, _topic = kafka_job(kafka, tmp_path, "stream", "default")
    del job.sink_options["staging_path"]
    expected = make_input(job.input, files=FILES, rows=50)
    moving_chain(job, [*SHORT_CHAIN[:2], "kafka_before_commit@2", *SHORT_CHAIN[2:]])
    check_topic(job, expected, per_epoch=50, aborted=True)
    check_states(job)


def test_sql_driver_moves(tmp_path: Path) -> None:
    """The sql sink on PostgreSQL with the default meta store: a driver killed with the
    epoch PENDING, then inside the commit's transaction (its held transaction on the server
    ended by the next driver's commit), each restart on a new machine."""
    from conftest import create_pg_database, drop_pg_database
    from test_sql_crash import TABLE, _appended, _read, sql_job

    url = create_pg_database()
    try:
        job = sql_job(tmp_path, "stream", url)
        job.metastore = "default"
        make_input(job.input, files=4, rows=40)
        moving_chain(job, ["after_persist@2", "mid_commit@1"])
        rows, staged, at_target = _read(url)
        assert rows == _appended(job), f"{len(rows)} rows in {TABLE}"
        assert staged == [], staged
        check_commits_at_target(at_target, expected_epochs(job))
        check_states(job)
    finally:
        drop_pg_database(url)


def _journal_generation(checkpoint: Path) -> int:
    gens = [int(p.stem) for p in checkpoint.glob("eosink/*/generations/*.json")]
    return max(gens, default=0)


@pytest.mark.release
def test_two_drivers_on_two_machines(tmp_path: Path) -> None:
    """Driver A (machine a) is inside the protocol when driver B of the same stream starts on
    machine b, each with its own default meta store: B fences A through the checkpoint's
    journal; A stops without changing anything; a final run completes; every row once."""
    job = Job(tmp_path, "stream", "default")
    expected = make_input(job.input, files=4, rows=25)
    code_a, _, log_a, log_b = job.run_overlapping(
        machines=("a", "b"), generation=lambda: _journal_generation(job.checkpoint)
    )
    assert code_a != 0, (log_a[-3000:], log_b[-3000:])
    assert re.search(r"FencedError.*checkpoint generation", log_a), (log_a[-3000:], log_b[-3000:])
    job.on_machine("c")
    assert job.run() == 0, job.last_log()
    check_files(job, expected, partitioned=False)


def _wait_stopped(proc: subprocess.Popen[bytes], marks: Path, point: str) -> None:
    """Wait until the driver stopped itself (SIGSTOP) at fault point ``point``."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the driver ended before {point}"
        if list(marks.glob(f"{point}.*")):
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.05)
    raise AssertionError(f"the driver did not reach {point}")


@pytest.mark.release
def test_zombie_checkpoints_its_epoch_after_the_new_driver_started(tmp_path: Path) -> None:
    """Driver A (machine a) stalls inside the protocol: its epoch 0 is staged and PENDING,
    Spark has not checkpointed it. Driver B (machine b) starts and sets the stream up
    (checkpoint read: no batch done); before B's query starts, A wakes up and its Spark
    checkpoints batch 0 (A is fenced and fails at its commit). B's query then starts at batch
    1: B must take epoch 0 from the journal and commit it, its data intact (B's start must not
    have deleted it as "staged without a committable"); every row once."""
    job = Job(tmp_path, "stream", "default")
    expected = make_input(job.input, files=3, rows=25)
    job.on_machine("a")
    a = job.spawn("a", fault="after_persist", stop=True)
    b = a
    try:
        _wait_stopped(a, job.marks, "after_persist")
        job.on_machine("b")
        b = job.spawn("b", fault="stream_before_start", stop=True)
        _wait_stopped(b, job.marks, "stream_before_start")
        assert not (job.checkpoint / "commits" / "0").exists()
        os.killpg(a.pid, signal.SIGCONT)
        code_a = a.wait(timeout=300)
        log_a = (tmp_path / "run-a.log").read_text()
        assert code_a != 0, log_a[-3000:]
        assert re.search(r"FencedError.*checkpoint generation", log_a), log_a[-3000:]
        assert (job.checkpoint / "commits" / "0").exists(), log_a[-3000:]
        os.killpg(b.pid, signal.SIGCONT)
        code_b = b.wait(timeout=300)
        log_b = (tmp_path / "run-b.log").read_text()
        assert code_b == 0, log_b[-3000:]
    finally:
        for p in (a, b):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
    # B took epoch 0 from a journal: the checkpoint's, or the target's (which every
    # recovery reads first, and which holds every run's PENDING epochs).
    assert re.search(
        r"epoch 0: (PENDING in the checkpoint's journal|a crashed run's PENDING epoch "
        r"\(stream [0-9a-f]{8}\), in the target's journal)",
        log_b,
    ), log_b[-3000:]
    job.logs += [log_a, log_b]
    check_files(job, expected, partitioned=False)


def test_batch_rerun_on_another_machine(tmp_path: Path) -> None:
    """A batch job (``epoch=5``, Spark's own writers) crashed inside its commit is re-run on
    a new machine: the target's batch journal finishes the crashed run's epoch (never
    written twice, never refused); a re-run after success, on yet another machine, is a
    no-op. (Crashed at each point between PENDING and COMMITTED, each re-run on a new
    machine: tests/test_lifecycle_kills.py test_batch_run_moves, which caught the broken
    variant this test caught when it ran that chain, a moved driver that ignores the
    target's batch journal.)"""
    job = Job(tmp_path, "batch", "default")
    expected = make_input(job.input, files=3, rows=40)
    job.on_machine("m0")
    job.assert_fired("mid_commit", job.run(fault="mid_commit"))
    job.on_machine("last")
    assert job.run() == 0, job.last_log()
    assert "taking it from the journal" in "\n".join(job.logs)
    assert "recovered=True" in job.last_log()
    check_files(job, expected, partitioned=False)
    job.on_machine("again")
    assert job.run() == 0, job.last_log()
    assert "skipped=True" in job.last_log()
    assert read_ids(job.out) == expected
    assert "SinkIdentityError" not in "\n".join(job.logs)
