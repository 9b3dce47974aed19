"""The crash matrix: SIGKILL the driver at every fault point, restart, verify row by row.

Each case runs the driver program in a subprocess with ``EOSINK_FAULT`` armed; it must die
there (exit -9). The driver is restarted until it exits 0; then independent readers (pyarrow
here, Spark in test_crash_spark_reader) compare the output with the input: nothing lost,
nothing duplicated, no staged file left behind, no PENDING epoch left in the meta store.

Writer kinds: ``eosink.run`` flows take the file sink's native path by default (Spark's own
writers stage each epoch; fault point ``after_spark_write``); the Python writers (tasks,
fault points ``task_*``) run in the ``format("eosink")`` cases, in the ``PYTHON_WRITER``
chains and in the executor-kill cases.

The whole matrix runs on the SQLite meta store; a representative subset (a crash while
aborting in the batch and stream flows, one format("eosink") case, random-instant kills and
the Iceberg cases of test_iceberg_crash.py) runs on PostgreSQL. The meta store's own
semantics are covered on both by test_metastore.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import metastore_for
from harness import (
    Job,
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
    [
        "after_spark_write@2",
        "after_write_results@2",
        "after_pre_commit@2",
        "after_persist@2",
        "before_commit@2",
    ],
    ["mid_commit@2", "after_commit@2", "after_mark_committed@2"],
    # Two crashes in a row at different points.
    ["after_commit@1", "after_persist@2"],
    # Crashes inside recovery itself. Epoch 2 persisted, not checkpointed: each restart finds
    # it still to abort and dies at the next point of that abort (before the plugin's abort,
    # inside it, between it and deleting the row).
    ["after_persist@3", "recovery_before_abort", "mid_abort", "recovery_before_finish_abort"],
    # Epoch 1 checkpointed, not committed: the restart dies inside recovery's own commit of
    # it, the next one right after it.
    ["before_commit@2", "mid_commit", "after_commit"],
    # The first run dies right after writing the checkpoint's lineage file, before the meta
    # store records it.
    ["after_lineage_written"],
]
# A batch job has one epoch (5): the first three runs die before it is PENDING, the next ones
# die while finishing the PENDING epoch the third left (before, inside, after its commit,
# after COMMITTED).
BATCH_FAULTS = [
    [
        "after_spark_write",
        "after_write_results",
        "after_pre_commit",
        "after_persist",
        "before_commit",
    ],
    ["after_persist", "mid_commit", "after_commit", "after_mark_committed"],
    ["after_pre_commit", "mid_abort"],
]
INLINE_FAULTS = [["after_persist@2", "mid_commit@2", "after_commit@2"]]
DS_FAULTS = [["after_persist@2", "mid_commit@2", "after_commit@3"]]

# Also on PostgreSQL (the protocol's SQL differs per dialect; test_metastore.py covers the
# store's semantics on both): a crash while aborting for each of the batch and stream flows,
# and a crash inside phase 2 of a format("eosink") stream.
STREAM_ON_POSTGRES = [["after_persist@3", "mid_abort"]]
BATCH_ON_POSTGRES = [["after_pre_commit", "mid_abort"]]
DS_ON_POSTGRES = [["mid_commit@2"]]
# After these, the finished job is run once more: replays of committed epochs change nothing.
RERUN = [STREAM_FAULTS[1], BATCH_FAULTS[1]]
# The same protocol with the Python writers (writer="python") in the run() flows.
PYTHON_WRITER = [
    pytest.param(
        "stream", ["after_write_results@2", "after_persist@2", "mid_commit@3"], id="stream"
    ),
    pytest.param("batch", ["after_write_results", "after_persist", "mid_commit"], id="batch"),
]


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
    for fault in faults:
        code = job.run(fault=fault)
        assert job.fired() == [fault.split("@")[0]], f"fault {fault} not reached:\n{job.last_log()}"
        if job.mode == "ds-stream":
            # Spark runs a Python data source's commit in a worker process: that process
            # dies at the fault point and the query fails with it.
            assert code != 0, job.last_log()
        else:
            assert code == -9, f"the driver survived {fault} (exit {code}):\n{job.last_log()}"
    code = job.run()
    assert code == 0, job.last_log()
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


@pytest.mark.parametrize(("store", "faults"), _cases(BATCH_FAULTS, BATCH_ON_POSTGRES))
def test_batch_crash(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, faults: list[str]
) -> None:
    metastore_url = metastore_for(store, request, tmp_path)
    job = Job(tmp_path, "batch", metastore_url, partition_by="grp")
    expected = make_input(job.input)
    _crash_and_recover(job, faults, expected, partitioned=True)


@pytest.mark.parametrize(("mode", "faults"), PYTHON_WRITER)
def test_python_writer_crash(tmp_path: Path, mode: str, faults: list[str]) -> None:
    job = Job(tmp_path, mode, f"sqlite:///{tmp_path / 'm.db'}", partition_by="grp", writer="python")
    expected = make_input(job.input, files=3 + len(faults))
    _crash_and_recover(job, faults, expected, partitioned=True)


@pytest.mark.parametrize(("store", "faults"), _cases(INLINE_FAULTS, []))
def test_stream_inline_crash(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, faults: list[str]
) -> None:
    metastore_url = metastore_for(store, request, tmp_path)
    job = Job(tmp_path, "stream", metastore_url, commit_mode="inline")
    expected = make_input(job.input, files=3 + len(faults))
    _crash_and_recover(job, faults, expected)


@pytest.mark.parametrize(("store", "faults"), _cases(DS_FAULTS, DS_ON_POSTGRES))
def test_datasource_stream_crash(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, faults: list[str]
) -> None:
    metastore_url = metastore_for(store, request, tmp_path)
    job = Job(tmp_path, "ds-stream", metastore_url)
    expected = make_input(job.input, files=3 + len(faults))
    _crash_and_recover(job, faults, expected)


@pytest.mark.parametrize("point", ["task_before_finish", "task_after_finish"])
def test_executor_task_killed_is_retried(tmp_path: Path, point: str) -> None:
    """A task's Python worker dies before finish_write, or after it (its files are durable,
    its result never reaches the driver); Spark retries it; exactly once, nothing left."""
    job = Job(
        tmp_path, "stream", f"sqlite:///{tmp_path / 'm.db'}", master="local[2,3]", writer="python"
    )
    expected = make_input(job.input, files=3)
    assert job.run(fault=point) == 0, job.last_log()
    assert point in job.fired()
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


@pytest.mark.parametrize(
    ("store", "mode"), [("sqlite", "stream"), ("sqlite", "batch"), ("postgres", "stream")]
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
    assert job.run(fault="after_commit@3") == -9, job.last_log()
    assert job.fired() == ["after_commit"]
    assert job.run() == 0, job.last_log()
    rows = spark.read.parquet(str(job.out)).select("id", "grp", "payload").collect()
    assert sorted(r.id for r in rows) == expected
    from harness import GROUPS

    assert all(r.grp == (GROUPS[r.id % len(GROUPS)] or None) for r in rows)
    assert all(r.payload == f"payload-{r.id}" for r in rows)
