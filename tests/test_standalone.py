"""eosink on a real Spark standalone cluster, driver restarted on another machine.

A master and two workers run as separate JVMs from the pyspark package on 127.0.0.1
(tests/standalone.py). The streaming job (tests/standalone_job.py) is submitted with
``spark-submit --deploy-mode client``; its executors run a packed environment shipped with
``--archives env.tar.gz#env`` (``./env/bin/python``, never the tests' virtualenv). The
driver is killed with SIGKILL in the middle of the stream, then restarted on "another
machine": a new ``HOME``, ``TMPDIR`` and working directory, eosink's default settings (no
meta store URL); only the checkpoint location and the target are shared. Independent
readers then find every input row exactly once and nothing staged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import make_input, read_ids, staged_files
from standalone import (
    TEST_VENV,
    ClusterError,
    StandaloneCluster,
    SubmittedJob,
    cluster_app,
    env_archive,
    shared_cluster,
    spark_home,
)

pytestmark = pytest.mark.cluster


def _shared_dir(factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A directory every xdist worker of this run sees (the base temp dir's parent)."""
    base = factory.getbasetemp()
    return base.parent if worker_id != "master" else base


@pytest.fixture(scope="session")
def packed_env() -> Path:
    """The executors' environment as ``env.tar.gz`` (built once, cached)."""
    try:
        return env_archive()
    except ClusterError as exc:
        pytest.fail(f"cannot build the executors' packed environment: {exc}")


@pytest.fixture(scope="session")
def standalone_cluster(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> Iterator[StandaloneCluster]:
    """One master and two workers (1 core, 1 GiB each) for every xdist worker of the run."""
    shared = _shared_dir(tmp_path_factory, worker_id)
    try:
        with shared_cluster(shared) as cluster:
            yield cluster
    except ClusterError as exc:
        pytest.fail(f"the Spark standalone cluster did not start: {exc}")


@pytest.fixture
def cluster_job(
    standalone_cluster: StandaloneCluster,
    tmp_path_factory: pytest.TempPathFactory,
    worker_id: str,
) -> Iterator[StandaloneCluster]:
    """The cluster, for this test's applications alone (one application at a time)."""
    with cluster_app(_shared_dir(tmp_path_factory, worker_id)):
        assert standalone_cluster.alive(), "the standalone cluster died"
        try:
            yield standalone_cluster
        finally:
            standalone_cluster.drop_unpacked()


def _check_executor_python(job: SubmittedJob, cluster: StandaloneCluster) -> None:
    """Both executors ran ``./env/bin/python`` of the archive they unpacked, with eosink,
    pyarrow and pandas from it, pyspark from the workers' Spark, nothing of the tests'
    virtualenv but that Spark distribution."""
    reports = job.executor_python()
    assert reports, f"no EXECUTOR_PYTHON line in the driver's log:\n{job.last_log()}"
    cwds = {r["cwd"] for r in reports}
    assert len(cwds) == 2, f"tasks ran in {len(cwds)} executors, want 2: {sorted(cwds)}"
    spark = spark_home()  # the workers' Spark: the pyspark package of the tests' venv
    for r in reports:
        env = Path(r["cwd"]) / "env"
        assert Path(r["cwd"]).is_relative_to(cluster.work), r["cwd"]
        assert r["executable"] == str(env / "bin" / "python"), r
        assert r["prefix"] == str(env), r
        assert r["pyspark_python"] == "./env/bin/python", r
        assert r["virtual_env"] is None, r
        for module in ("eosink", "pyarrow", "pandas"):
            assert Path(r[module]).is_relative_to(env / "lib"), (module, r[module])
        assert Path(r["pyspark"]).is_relative_to(spark / "python" / "lib"), r["pyspark"]
        for entry in r["path"]:
            p = Path(entry).resolve()
            assert not p.is_relative_to(TEST_VENV) or p.is_relative_to(spark), (
                f"the executor's sys.path holds the tests' virtualenv: {entry}"
            )


def _sink_rows(job: SubmittedJob, sink: str) -> list[int]:
    if sink == "file":
        return read_ids(job.out)
    from test_iceberg import iceberg_rows

    return sorted(int(r["id"]) for r in iceberg_rows(job.iceberg_options()))


def _leftovers(job: SubmittedJob, sink: str) -> list[str]:
    if sink == "file":
        return staged_files(job.out)
    from test_iceberg import orphan_files

    return orphan_files(job.iceberg_options())


# The iceberg sink runs the same restart on one machine in tests/test_driver_moves.py; on the
# cluster one sink proves the deployment (CI time: one application at a time, ~2 min each).
@pytest.mark.parametrize("sink", ["file"])
def test_standalone_driver_killed_and_restarted_on_another_machine(
    tmp_path: Path, packed_env: Path, cluster_job: StandaloneCluster, sink: str
) -> None:
    job = SubmittedJob(tmp_path, cluster_job, packed_env, sink)
    expected = make_input(job.input)

    code = job.run("machine-a", fault="before_commit@2", probe=True)
    assert job.fired() == ["before_commit"], (code, job.last_log())
    assert code != 0
    # eosink.spark_session() in a submitted job keeps spark-submit's --master.
    assert f"MASTER {cluster_job.master_url}" in job.last_log(), job.last_log()
    _check_executor_python(job, cluster_job)
    # Killed mid-stream: epoch 0 (one input file) committed, epoch 1 checkpointed only.
    visible = _sink_rows(job, sink)
    files = [expected[i : i + 300] for i in range(0, len(expected), 300)]
    assert visible in files, f"{len(visible)} rows visible after the kill:\n{job.last_log()}"

    code = job.run("machine-b")
    assert code == 0, f"{job.last_log()}\n{cluster_job.executor_logs()}"
    assert job.fired() == []
    got = _sink_rows(job, sink)
    assert len(got) == len(expected), f"{len(got)} rows, want {len(expected)}"
    assert got == expected, "every input row exactly once"
    assert _leftovers(job, sink) == []


def test_speculative_attempts_leave_nothing(
    tmp_path: Path, packed_env: Path, cluster_job: StandaloneCluster
) -> None:
    """``spark.speculation=true`` and a task whose first attempt stalls after handing its
    first rows to the writer (tests/standalone_job.py ``slow_first_attempt``): Spark runs a
    speculative attempt on the other worker's host, which wins, and kills the stalled one.
    Only the winner's output is in the epoch's committable; what the loser staged is
    deleted. On both writer paths (two batches of one application, each to its own
    directory): exactly the input is read back, nothing is left staged."""
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    writers = ["spark", "python"]
    job = SubmittedJob(
        tmp_path, cluster_job, packed_env, "file", writer=",".join(writers), speculate=str(attempts)
    )
    expected = make_input(job.input)
    code = job.run("machine-a")
    assert code == 0, f"{job.last_log()}\n{cluster_job.executor_logs()}"
    for writer in writers:
        assert sorted(p.name for p in (attempts / writer).iterdir()) == [
            "attempt-0",
            "attempt-1",
        ], f"no speculative attempt ran with the {writer} writers:\n{job.last_log()}"
        assert read_ids(job.out / writer, partitioned=True) == expected, writer
        assert staged_files(job.out / writer) == [], writer
