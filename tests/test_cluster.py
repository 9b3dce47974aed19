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


@pytest.mark.parametrize("mode", ["stream"])  # batch runs: tests/test_crash.py
def test_cluster_exactly_once_after_driver_crash(tmp_path: Path, pg_url: str, mode: str) -> None:
    writer = "python" if mode == "batch" else "spark"
    job = Job(tmp_path, mode, pg_url, master=MASTER, partition_by="grp", writer=writer)
    expected = make_input(job.input)
    fault = "after_persist@2" if mode == "stream" else "mid_commit"
    job.assert_fired(fault, job.run(fault=fault))
    assert job.run() == 0, job.last_log()
    assert _executors(job.logs[-1]) == 2
    assert read_ids(job.out, partitioned=True) == expected
    assert staged_files(job.out) == []
    assert job.fired() == []
    assert set(epoch_states(pg_url, job.sink_id)) == {"COMMITTED"}


@pytest.mark.release
def test_cluster_iceberg_after_driver_crash(tmp_path: Path, pg_url: str) -> None:
    from test_iceberg import iceberg_rows, orphan_files

    job = Job(tmp_path, "stream", pg_url, master=MASTER, sink="iceberg")
    expected = make_input(job.input)
    job.assert_fired("mid_commit@2", job.run(fault="mid_commit@2"))
    assert job.run() == 0, job.last_log()
    assert _executors(job.logs[-1]) == 2
    opts = job.iceberg_options()
    assert sorted(r["id"] for r in iceberg_rows(opts)) == expected
    assert orphan_files(opts) == []
    assert set(epoch_states(pg_url, job.sink_id)) == {"COMMITTED"}


@pytest.mark.release
def test_cluster_s3_rolling_after_driver_crash(
    tmp_path: Path, pg_url: str, s3_endpoint: str
) -> None:
    """Executors upload the staged pieces to S3 through boto3; the driver rolls JSON lines
    into multipart uploads that span epochs; a crash mid-roll is repaired at the restart."""
    from harness import read_output_rows, s3_client

    bucket = f"cl-{tmp_path.name[-20:].lower().replace('_', '-')}".strip("-")
    s3_client(s3_endpoint).create_bucket(Bucket=bucket)
    opts = {
        "path": f"s3://{bucket}/out",
        "format": "json",
        "max_row_count": 600,
        "s3_endpoint_url": s3_endpoint,
        "s3_region": "us-east-1",
        "s3_access_key_id": "testing",
        "s3_secret_access_key": "testing",
    }
    job = Job(tmp_path, "stream", pg_url, sink_options=opts, master=MASTER, writer="python")
    expected = make_input(job.input)
    job.assert_fired("roll_before_publish", job.run(fault="roll_before_publish"))
    assert job.run() == 0, job.last_log()
    assert _executors(job.logs[-1]) == 2
    out = job.output()
    assert sorted(int(r["id"]) for r in read_output_rows(out, "json")) == expected
    assert len(out.visible()) == 2  # 4 epochs of 300 rows, rolled at 600 rows
    assert out.staged() == []
    assert out.open_uploads() == []
    assert set(epoch_states(pg_url, job.sink_id)) == {"COMMITTED"}
