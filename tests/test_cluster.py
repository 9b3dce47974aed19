"""The same machinery, unchanged, on a multi-process Spark cluster on 127.0.0.1.

``local-cluster[2,1,1024]`` starts a master and two executor JVMs as separate processes:
writers run in the executors (Spark's own writers for the stream, Python writers in the
executors' Python workers for the batch job), the coordinator in the driver.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import Job, epoch_states, make_input, read_ids, staged_files

pytestmark = pytest.mark.cluster

MASTER = "local-cluster[2,1,1024]"


def _executors(log: str) -> int:
    m = re.search(r"EXECUTORS (\d+)", log)
    assert m, log[-3000:]
    return int(m.group(1))


@pytest.mark.parametrize("mode", ["stream", "batch"])
def test_cluster_exactly_once_after_driver_crash(tmp_path: Path, pg_url: str, mode: str) -> None:
    writer = "python" if mode == "batch" else "spark"
    job = Job(tmp_path, mode, pg_url, master=MASTER, partition_by="grp", writer=writer)
    expected = make_input(job.input)
    fault = "after_persist@2" if mode == "stream" else "mid_commit"
    assert job.run(fault=fault) == -9, job.last_log()
    assert job.fired() == [fault.split("@")[0]]
    assert job.run() == 0, job.last_log()
    assert _executors(job.logs[-1]) == 2
    assert read_ids(job.out, partitioned=True) == expected
    assert staged_files(job.out) == []
    assert job.fired() == []
    assert set(epoch_states(pg_url, job.sink_id)) == {"COMMITTED"}


def test_cluster_iceberg_after_driver_crash(tmp_path: Path, pg_url: str) -> None:
    from test_iceberg import iceberg_rows, orphan_files

    job = Job(tmp_path, "stream", pg_url, master=MASTER, sink="iceberg")
    expected = make_input(job.input)
    assert job.run(fault="mid_commit@2") == -9, job.last_log()
    assert job.fired() == ["mid_commit"]
    assert job.run() == 0, job.last_log()
    assert _executors(job.logs[-1]) == 2
    opts = job.iceberg_options()
    assert sorted(r["id"] for r in iceberg_rows(opts)) == expected
    assert orphan_files(opts) == []
    assert set(epoch_states(pg_url, job.sink_id)) == {"COMMITTED"}
