"""The crash matrix: SIGKILL the driver at every fault point, restart, verify row by row.

Each case runs the driver program in a subprocess with ``EOSINK_FAULT`` armed; it must die
there (exit -9). The driver is restarted until it exits 0; then independent readers (pyarrow
here, Spark in test_crash_spark_reader) compare the output with the input: nothing lost,
nothing duplicated, no staged file left behind, no PENDING epoch left in the meta store.

Writer kinds: ``eosink.run`` flows take the file sink's native path by default (Spark's own
writers stage each epoch; fault point ``after_spark_write``); the Python writers (tasks,
fault points ``task_*``) run in the ``format("eosink")`` cases and in the executor-kill
cases (and in the kafka, sql and iceberg sinks' crash tests, whose flows write with them).

Every core point is killed here once per front end (the other sinks' crash files kill their
own points: the fault coverage table, tests/faultmatrix.py), on the SQLite meta store; on
PostgreSQL a crash while aborting and random-instant kills (and the sql and iceberg sinks'
cases). The meta store's own semantics are covered on both by test_metastore.py. For
``eosink.run`` streams, the points that need no Spark beside them are killed many more times
over, on both meta stores, by tests/test_lifecycle_kills.py (a Spark-less driver of the same
lifecycle); here the chains that involve Spark's writers, its checkpoint and its query start.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import metastore_for
from harness import (
    Job,
    crash_chain,
    epoch_states,
    expected_epochs,
    make_input,
    read_ids,
    run_with_random_kills,
    staged_files,
)

pytestmark = pytest.mark.crash

# Each list is one case: the driver is killed at each fault point in turn (each restart armed
# with the next point), then run to the end. Points of one chain fire in successive runs, each
# after the restart recovered from the previous crash, so a chain of single points covers what
# one case per point would, with fewer driver starts.
STREAM_FAULTS = [
    # The first run dies right after writing the checkpoint's lineage file, before the meta
    # store records it; the next ones around Spark's checkpoint of epoch 1: once Spark's own
    # writers staged it (after_spark_write), once it is PENDING before Spark checkpoints it,
    # and once Spark checkpointed it, before its commit.
    ["after_lineage_written", "after_spark_write@2", "after_persist@2", "before_commit@2"],
]
# The other core points of the stream (phase 1's after_write_results and after_pre_commit;
# the commit's mid_commit@2, after_commit@2, after_mark_committed@2; a restart with epoch 1
# checkpointed and not committed, killed before Spark's query starts (stream_before_start,
# recovery held for the first micro-batch), inside recovery's commit of epoch 1 and after
# it; recovery's abort of an epoch Spark did not checkpoint, on both meta stores) are killed,
# at several epochs and at random instants, in the Spark-less lifecycle driver
# (tests/test_lifecycle_kills.py: the same stream lifecycle, meta store and file sink), which
# caught the deliberately broken variants these chains caught (docs/testing.md).
# A batch job has one epoch (5): the first run dies once Spark's own writers staged it,
# before it is PENDING; the next one once it is PENDING, before its commit (the restart
# commits what Spark's writers staged). The batch run's other points, chains and random
# kills: tests/test_lifecycle_kills.py (eosink._batch.run_batch without Spark), which caught
# the deliberately broken variants the chains here caught (docs/testing.md).
BATCH_FAULTS = [["after_spark_write", "before_commit"]]
# format("eosink") streams and batches (its driver side runs in Spark's Python workers: the
# whole driver is killed when a point fires there): phase 2 inline, killed once the worker's
# commit made the micro-batch PENDING (the query's restart finishes it in its start-up
# worker) and inside the commit. A batch (one epoch, 5): killed inside its commit. The data
# source's other core points (the lineage file, phase 1, after the commit, after COMMITTED)
# are killed in tests/test_lifecycle_kills.py, which drives the same data source without
# Spark, as Spark drives it, and caught the broken variants these chains caught
# (docs/testing.md).
DS_FAULTS = [["after_persist@2", "mid_commit@2"]]
DS_BATCH_FAULTS = [["mid_commit"]]

# On PostgreSQL (the protocol's SQL differs per dialect; test_metastore.py covers the store's
# semantics on both) the Spark-less lifecycle driver kills every chain of the stream
# (tests/test_lifecycle_kills.py test_chain), and the iceberg and sql sinks' crash tests kill
# Spark drivers (tests/test_iceberg_crash.py: after PENDING and while aborting).
STREAM_ON_POSTGRES: list[list[str]] = []
# After these, the finished job is run once more: replays of committed epochs change nothing.
RERUN = [STREAM_FAULTS[0]]


def _cases(matrix: list[list[str]], on_postgres: list[list[str]]) -> list[object]:
    """Every chain of ``matrix`` on SQLite, and the chains of ``on_postgres`` on PostgreSQL."""
    return [
        pytest.param(store, faults, id=f"{store}-{'+'.join(faults)}")
        for store, chains in (("sqlite", matrix), ("postgres", on_postgres))
        for faults in chains
    ]


def _check(job: Job, expected: list[int], partitioned: bool = False) -> None:
    got = read_ids(job.out, partitioned)
    assert len(got) == len(expected), (
        f"{len(got)} rows read back, {len(expected)} written; "
        f"missing {sorted(set(expected) - set(got))[:10]}, "
        f"duplicated {sorted({i for i in got if got.count(i) > 1})[:10]}"
    )
    assert got == expected
    assert staged_files(job.out) == []
    states = epoch_states(job.metastore, job.sink_id)
    assert sorted(states.get("COMMITTED", [])) == expected_epochs(job), states
    assert "PENDING" not in states and "ABORTED" not in states, states


def _crash_and_recover(
    job: Job, faults: list[str], expected: list[int], partitioned: bool = False
) -> None:
    rerun = faults in RERUN and job.metastore.startswith("sqlite")
    crash_chain(job, faults)
    _check(job, expected, partitioned)
    if rerun:
        # Running the finished job again (replays of committed epochs) changes nothing.
        assert job.run() == 0, job.last_log()
        _check(job, expected, partitioned)


@pytest.mark.parametrize(("store", "faults"), _cases(STREAM_FAULTS, STREAM_ON_POSTGRES))
def test_stream_crash(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, faults: list[str]
) -> None:
    metastore_url = metastore_for(store, request, tmp_path)
    job = Job(tmp_path, "stream", metastore_url, partition_by="grp")
    # A chain needs about one micro-batch per run beyond the four a single point needs.
    expected = make_input(job.input, files=3 + len(faults))
    _crash_and_recover(job, faults, expected, partitioned=True)


@pytest.mark.parametrize(("store", "faults"), _cases(BATCH_FAULTS, []))
def test_batch_crash(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, faults: list[str]
) -> None:
    metastore_url = metastore_for(store, request, tmp_path)
    job = Job(tmp_path, "batch", metastore_url, partition_by="grp")
    expected = make_input(job.input)
    _crash_and_recover(job, faults, expected, partitioned=True)


@pytest.mark.parametrize(("store", "faults"), _cases(DS_FAULTS, []))
def test_datasource_stream_crash(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, faults: list[str]
) -> None:
    metastore_url = metastore_for(store, request, tmp_path)
    job = Job(tmp_path, "ds-stream", metastore_url)
    # One more micro-batch than test_stream_crash: the query's start finishes a crashed
    # epoch in the data source's start-up worker, whose fault counts are its own.
    expected = make_input(job.input, files=4 + len(faults))
    _crash_and_recover(job, faults, expected)


@pytest.mark.parametrize("faults", DS_BATCH_FAULTS, ids=lambda f: "+".join(f))
def test_datasource_batch_crash(tmp_path: Path, faults: list[str]) -> None:
    job = Job(tmp_path, "ds-batch", f"sqlite:///{tmp_path / 'm.db'}", partition_by="grp")
    expected = make_input(job.input)
    _crash_and_recover(job, faults, expected, partitioned=True)


@pytest.mark.parametrize("mode", ["ds-stream", "ds-batch"])
@pytest.mark.parametrize("point", ["task_before_finish", "task_after_finish"])
def test_datasource_task_killed_is_retried(tmp_path: Path, mode: str, point: str) -> None:
    """``format("eosink")``: a task's Python worker dies before its writer's finish_write,
    or right after it; Spark retries it; exactly once, nothing left staged."""
    job = Job(tmp_path, mode, f"sqlite:///{tmp_path / 'm.db'}", master="local[2,3]")
    expected = make_input(job.input, files=2)
    job.assert_fired(point, job.run(fault=point))
    _check(job, expected)


@pytest.mark.parametrize("point", ["task_before_finish", "task_after_finish"])
def test_executor_task_killed_is_retried(tmp_path: Path, point: str) -> None:
    """A batch run: a task's Python worker dies before finish_write, or after it (its files
    are durable, its result never reaches the driver); Spark retries it; exactly once, nothing
    left. (Streams: each sink's crash tests kill its tasks' workers.)"""
    job = Job(
        tmp_path, "batch", f"sqlite:///{tmp_path / 'm.db'}", master="local[2,3]", writer="python"
    )
    expected = make_input(job.input, files=3)
    job.assert_fired(point, job.run(fault=point))
    _check(job, expected)


def test_two_drivers_on_one_sink(tmp_path: Path) -> None:
    """A second real driver process starts the same stream (same sink, checkpoint and meta
    store) while the first is inside the protocol, as after a failover whose old driver is
    still alive: the second fences the first, which stops without changing any state; a
    final run completes; every row exactly once."""
    job = Job(tmp_path, "stream", f"sqlite:///{tmp_path / 'm.db'}")
    # Driver A's micro-batches after its first wait until B has fenced it (run_overlapping).
    expected = make_input(job.input, files=4, rows=25)
    code_a, _, log_a, log_b = job.run_overlapping()
    assert code_a != 0 and "fenced by a newer one" in log_a, (log_a[-3000:], log_b[-3000:])
    assert job.run() == 0, job.last_log()
    _check(job, expected)


# (A batch run's protocol lasts about a second of its run: random kills of batch runs land
# in Spark's start-up; its points are killed one by one in test_batch_crash.)
@pytest.mark.parametrize(
    ("store", "mode"),
    [("sqlite", "stream"), pytest.param("postgres", "stream", marks=pytest.mark.release)],
)
def test_random_kills(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, mode: str
) -> None:
    """Kill the whole driver (Python and JVM) at random instants, then let it finish.

    Kills alternate between an instant drawn from the first change of the sink's meta store
    rows in that run (so that kills provably land inside the protocol) and one drawn from
    the start of the driver (which may land in Spark's start-up). The release soak
    (``python -m tests.soak``, docs/testing.md) does this hundreds of times.
    """
    metastore_url = metastore_for(store, request, tmp_path)
    rng = random.Random(f"{mode}-{metastore_url[:6]}")
    job = Job(tmp_path, mode, metastore_url)
    expected = make_input(job.input, files=6)
    # A batch job has one epoch: its protocol lasts from PENDING to exit, about a second.
    run_with_random_kills(job, rng, window=0.5 if mode == "batch" else 2.5)
    _check(job, expected)


def test_crash_spark_reader(tmp_path: Path, spark, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    """After a crash and restart, Spark itself reads every row exactly once."""
    job = Job(tmp_path, "stream", pg_url, partition_by="grp")
    expected = make_input(job.input)
    job.assert_fired("after_commit@3", job.run(fault="after_commit@3"))
    assert job.run() == 0, job.last_log()
    rows = spark.read.parquet(str(job.out)).select("id", "grp", "payload").collect()
    assert sorted(r.id for r in rows) == expected
    from harness import GROUPS

    assert all(r.grp == (GROUPS[r.id % len(GROUPS)] or None) for r in rows)
    assert all(r.payload == f"payload-{r.id}" for r in rows)
