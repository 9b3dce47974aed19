"""Crash matrix of the iceberg sink: SIGKILL the driver, restart, scan the table with pyiceberg.

Besides row-by-row equality, the table location must hold no data file that no snapshot
references (orphans). Every case runs on a SQLite catalog with a local warehouse; a crash
while aborting runs on a PostgreSQL catalog and meta store, and the crashes around writing
and committing data files on a warehouse on the S3 server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import Job, epoch_states, make_input
from test_iceberg import iceberg_rows, orphan_files

pytestmark = pytest.mark.crash

# Each case kills the driver at each point in turn (each restart armed with the next point,
# after recovering from the previous crash), then runs it to the end.
STREAM_CHAIN = ["after_persist@2", "mid_commit@2", "after_commit@2"]
# The batch epoch dies before it is PENDING, then inside its commit, then while the restart
# finishes it (after the commit, before COMMITTED).
BATCH_CHAIN = ["after_write_results", "mid_commit", "after_commit"]
CASES = [
    ("stream", STREAM_CHAIN),
    ("stream", ["after_persist@3", "mid_abort"]),
    ("batch", BATCH_CHAIN),
]
ON = {
    "postgres": [("stream", ["after_persist@3", "mid_abort"])],
    "s3": [("stream", STREAM_CHAIN), ("batch", BATCH_CHAIN)],
}


def catalog(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, dict[str, str]]:
    """(meta store URL, crash job options): SQLite catalog and warehouse on local disk,
    PostgreSQL catalog and meta store, or a warehouse on the S3 server."""
    sqlite = f"sqlite:///{tmp_path / 'metastore.db'}"
    if kind == "sqlite":
        return sqlite, {}
    if kind == "s3":
        from conftest import s3_catalog

        endpoint = str(request.getfixturevalue("s3_endpoint"))
        cat = s3_catalog(endpoint, f"sqlite:///{tmp_path / 'catalog.db'}")
        return sqlite, {"catalog_json": json.dumps(cat)}
    url = str(request.getfixturevalue("fresh_pg_url"))
    return url, {"catalog_uri": url}


@pytest.mark.parametrize(
    ("kind", "mode", "faults"),
    [
        pytest.param(kind, mode, faults, id=f"{kind}-{mode}-{'+'.join(faults)}")
        for mode, faults in CASES
        for kind in ("sqlite", "postgres", "s3")
        if kind == "sqlite" or (mode, faults) in ON[kind]
    ],
)
def test_iceberg_crash(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, mode: str, faults: list[str]
) -> None:
    metastore, extra = catalog(kind, request, tmp_path)
    job = Job(tmp_path, mode, metastore, sink="iceberg", **extra)
    expected = make_input(job.input, files=3 + len(faults))
    for fault in faults:
        assert job.run(fault=fault) == -9, job.last_log()
        assert job.fired() == [fault.split("@")[0]]
    assert job.run() == 0, job.last_log()
    opts = job.iceberg_options()
    rows = iceberg_rows(opts)
    ids = sorted(r["id"] for r in rows)
    assert len(ids) == len(expected) and ids == expected
    assert all(r["payload"] == f"payload-{r['id']}" for r in rows)
    assert orphan_files(opts) == []
    assert set(epoch_states(metastore, job.sink_id)) == {"COMMITTED"}


def test_iceberg_executor_lost_after_finish_write(tmp_path: Path) -> None:
    """A task's Python worker dies right after its writer's finish_write (its data files are
    written, its result never reaches the driver); Spark retries the task. The table holds
    every row once and no data file of the dead attempt is left."""
    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'metastore.db'}",
        sink="iceberg",
        master="local[2,3]",
    )
    expected = make_input(job.input, files=3)
    assert job.run(fault="task_after_finish") == 0, job.last_log()
    assert "task_after_finish" in job.fired()
    opts = job.iceberg_options()
    assert sorted(r["id"] for r in iceberg_rows(opts)) == expected
    assert orphan_files(opts) == []
    assert set(epoch_states(job.metastore, job.sink_id)) == {"COMMITTED"}
