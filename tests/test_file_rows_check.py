"""An epoch whose staged files do not hold the rows Spark wrote is refused before phase 1.

Spark's job commit runs on the driver and finds the task outputs where the *driver* sees the
staging directory. When that directory is not the same on every node (a local path, or a
``file://`` URI, that is not a mount every node shares), the files of the tasks that ran
on other machines stay on those machines' disks, the write "succeeds", and an epoch would
commit without them, silently. The file sink counts the rows of the files the driver finds
(Parquet/ORC footers, JSON/CSV/text records) against the rows the write itself counted, and
fails the epoch before its committable is persisted; the Python writers' files are checked
for presence and size in ``pre_commit``.

Two real ways to lose files between the tasks and the driver's listing:

* ``local-cluster[2,1,1024]`` (a master and two executor JVMs, separate processes) writing
  to ``file:///proc/self/cwd/<dir>``: ``/proc/self`` is each process's own, so every
  executor writes under its own working directory while the driver commits and lists under
  its own: exactly a path that is a different directory on each node. The test also finds
  the staged files in the executors' directories, where a cluster would leave them.
* in one ``local[2]`` process, a task of the same write deletes the committed output of
  another task before Spark's job commit moves it into the staging directory: what the job
  commit does not see never reaches the driver's listing, as with a remote task's output.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import Job, epoch_states, make_input, staged_files

import eosink
from eosink import BatchResult, SinkError

FORMATS = ["parquet", "orc", "json", "csv", "text"]


def _losing_task0_output(out: str) -> Any:
    """A mapInArrow pass-through whose task of partition 2 waits until the task of
    partition 0 has committed its output (``_temporary/0/task_..._m_000000``, Hadoop's v1
    committer) and deletes it, before Spark's job commit can move it to the staging
    directory."""

    def run(batches: Any) -> Any:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None and tc.partitionId() == 2:
            pattern = os.path.join(out, "_eosink_staging", "**", "task_*_m_000000")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                found = [d for d in glob.glob(pattern, recursive=True) if os.path.isdir(d)]
                if found:
                    shutil.rmtree(found[0])
                    break
                time.sleep(0.05)
        yield from batches

    return run


def _rows(spark: Any, fmt: str) -> Any:
    df = spark.range(0, 900, numPartitions=3).selectExpr(
        "id", "concat('row ', id, ',\"x\"') AS name"
    )
    return df.selectExpr("concat(id, '|', name) AS value") if fmt == "text" else df


@pytest.mark.parametrize("fmt", FORMATS)
def test_files_lost_before_the_driver_lists_them_fail_the_epoch(
    spark: Any, tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / "out"
    df = _rows(spark, fmt)
    df = df.mapInArrow(_losing_task0_output(str(out)), df.schema)
    store = f"sqlite:///{tmp_path / 'm.db'}"
    with pytest.raises(SinkError) as exc:
        eosink.run(df, sink="file", path=str(out), format=fmt, epoch=1, metastore_url=store)
    msg = str(exc.value)
    assert "Spark's write counted 900 rows" in msg, msg
    assert "hold 600" in msg and "300 rows were written where the driver does not see" in msg
    assert f"{out}/_eosink_staging/" in msg  # the epoch's staging directory
    assert "not the same directory on every node" in msg
    # Nothing persisted, nothing published, nothing left staged.
    assert epoch_states(store, f"file:{out}") == {}
    assert [p for p in out.rglob("*") if p.is_file() and "_eosink" not in str(p)] == []
    assert staged_files(out) == []
    # The same rows without the loss are written: the sink is not stuck.
    r = eosink.run(
        _rows(spark, fmt), sink="file", path=str(out), format=fmt, epoch=1, metastore_url=store
    )
    assert isinstance(r, BatchResult) and r.rows == 900 and r.committed and r.files == 3


def _cluster_job(tmp_path: Path, writer: str) -> tuple[Job, str, Path]:
    name = f"eosink-rows-{uuid.uuid4().hex[:10]}"
    job = Job(
        tmp_path,
        "batch",
        f"sqlite:///{tmp_path / 'm.db'}",
        sink_options={"path": f"file:///proc/self/cwd/{name}/out"},
        master="local-cluster[2,1,1024]",
        writer=writer,
    )
    driver_dir = job.on_machine("driver").parent / "work" / name / "out"
    return job, name, driver_dir


def _executor_dirs(name: str) -> list[Path]:
    """Where the local-cluster executors' /proc/self/cwd/<name> is: their working
    directories under pyspark's work/ (the Worker's default work directory)."""
    import pyspark

    work = Path(pyspark.__file__).parent / "work"
    return sorted(Path(p) for p in glob.glob(str(work / "app-*" / "*" / name)))


@pytest.mark.cluster
@pytest.mark.parametrize("writer", ["spark", "python"])
def test_cluster_path_not_shared_by_every_node_fails_before_phase_1(
    tmp_path: Path, writer: str
) -> None:
    """Spark's writers (rows check) and the Python writers (presence check in pre_commit)
    on a path that each process of a real multi-process cluster resolves to its own
    directory: the run fails with the sink's error; no epoch row, nothing published."""
    job, name, driver_dir = _cluster_job(tmp_path, writer)
    expected = make_input(job.input)
    try:
        code = job.run()
        log = job.last_log()
        assert code != 0, log
        assert "EXECUTORS 2" in job.logs[-1], log
        assert "not the same directory on every node" in job.logs[-1], log
        if writer == "spark":
            assert f"Spark's write counted {len(expected)} rows" in job.logs[-1], log
        else:
            assert "on the driver it is not there" in job.logs[-1], log
        sink_id = f"file:{driver_dir.resolve()}"
        assert epoch_states(job.metastore, sink_id) == {}
        assert [p for p in driver_dir.rglob("*") if p.is_file() and "_eosink" not in str(p)] == []
        assert staged_files(driver_dir) == []
        # The rows went to the executors' own directories (another node's disk).
        on_executors = [p for d in _executor_dirs(name) for p in d.rglob("*.parquet")]
        assert on_executors, _executor_dirs(name)
    finally:
        for d in _executor_dirs(name):
            shutil.rmtree(d, ignore_errors=True)


def test_rows_check_counts_records_exactly(tmp_path: Path) -> None:
    """The record counts the check relies on, on files with the hard cases: CSV values
    with quotes and line breaks across read chunks, gzip and bzip2 members, custom line
    separators; text values with line breaks give an upper bound, never an exact count."""
    import bz2
    import gzip

    from eosink_file import committed

    def csv_field(v: str) -> str:
        return '"' + v.replace('"', '""') + '"' if any(c in v for c in ',"\n') else v

    values = [f'a,"{i}\nb' if i % 3 else f"plain {i}" for i in range(2000)]
    text = "id,name\n" + "".join(f"{i},{csv_field(v)}\n" for i, v in enumerate(values))
    p = tmp_path / "a.csv"
    p.write_text(text)
    assert committed._records(p, "csv", {}) == (2000, True)
    old = committed._CHUNK
    try:
        committed._CHUNK = 7  # quoted values and doubled quotes cut by chunk ends
        assert committed._records(p, "csv", {}) == (2000, True)
    finally:
        committed._CHUNK = old
    body = text.split("\n", 1)[1]
    two = gzip.compress(text.encode()) + gzip.compress(body.encode())  # two gzip members
    (tmp_path / "b.csv.gz").write_bytes(two)
    assert committed._records(tmp_path / "b.csv.gz", "csv", {}) == (4000, True)
    (tmp_path / "c.csv.bz2").write_bytes(bz2.compress(text.encode()))
    assert committed._records(tmp_path / "c.csv.bz2", "csv", {"HEADER": "false"}) == (2001, True)
    assert committed._records(p, "csv", {"escape": "\\"}) == (text.count("\n") - 1, False)
    rows = [json.dumps({"id": i, "v": values[i]}) for i in range(2000)]
    (tmp_path / "d.json").write_text("\x1e".join(rows) + "\x1e")
    assert committed._records(tmp_path / "d.json", "json", {"lineSep": "\x1e"}) == (2000, True)
    (tmp_path / "e.txt").write_text("".join(v + "\n" for v in values))
    n, exact = committed._records(tmp_path / "e.txt", "text", {})
    assert n is not None and n > 2000 and not exact
    (tmp_path / "f.json.zst").write_bytes(b"x")
    assert committed._records(tmp_path / "f.json.zst", "json", {}) == (None, False)
