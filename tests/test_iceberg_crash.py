"""Crash matrix of the iceberg sink: SIGKILL the driver, restart, scan the table with pyiceberg.

Besides row-by-row equality, the table location must hold no data file that no snapshot
references (orphans). Every case runs on a SQLite catalog with a local warehouse; a crash
while aborting runs on a PostgreSQL catalog and meta store, and the crashes around writing
and committing data files on a warehouse on the S3 server.

Both writer kinds: on a local warehouse the crash job's ``eosink.run`` epochs take the native
path (Spark's Parquet writer, with a crash right after it, ``after_spark_write``); on the S3
warehouse (Spark has no filesystem for ``s3://`` here), through ``format("eosink")`` and with
``writer="python"`` (executor faults, which fire inside Python writer tasks) the Python
writers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import Job, crash_chain, epoch_states, make_input
from test_iceberg import iceberg_rows, orphan_files

pytestmark = pytest.mark.crash

# Each case kills the driver at each point in turn (each restart armed with the next point,
# after recovering from the previous crash), then runs it to the end.
STREAM_CHAIN = ["after_persist@2", "mid_commit@2", "after_commit@2"]  # (see CASES)
# The batch epoch dies before it is PENDING, then inside its commit, then while the restart
# finishes it (after the commit, before COMMITTED).
BATCH_CHAIN = ["after_write_results", "mid_commit", "after_commit"]
# On the native path the batch epoch first dies right after Spark wrote its files.
NATIVE_BATCH_CHAIN = ["after_spark_write", *BATCH_CHAIN]
# The core's points are proven once per front end (tests/test_crash.py, the fault coverage
# table): these chains kill the sink's own points (mid_commit, mid_abort) on each catalog and
# warehouse kind, with the core points around them that change what its recovery finds.
CASES = [
    ("sqlite", "batch", NATIVE_BATCH_CHAIN),
    ("postgres", "stream", ["after_persist@3", "mid_abort"]),
    # (The S3 warehouse's stream, Python writers: STREAM_CHAIN in tests/test_lifecycle_kills.py,
    # the stream's lifecycle without Spark, which caught what this case caught, an epoch's
    # commit taken for not done when it is the table's newest.)
    # format("eosink") (Python writers; the whole driver killed where the point fires, in
    # Spark's data source worker): the commit's own point, then its recovery.
    ("sqlite", "ds-stream", ["mid_commit@2"]),
    ("sqlite", "ds-batch", ["mid_commit"]),
]


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


def _check_table(job: Job, expected: list[int], native: bool) -> None:
    """Every row once, no orphan, every epoch COMMITTED; the data files are the writer
    kind's (native ones live in ``eosink-<sink>-e<epoch>-<attempt>/`` directories), and on a
    local warehouse nothing else is left under the data location (no ``.crc``, no
    ``_temporary``, no empty directory of a dead attempt)."""
    from pyiceberg.catalog import load_catalog

    opts = job.iceberg_options()
    rows = iceberg_rows(opts)
    ids = sorted(r["id"] for r in rows)
    assert len(ids) == len(expected) and ids == expected
    assert all(r["payload"] == f"payload-{r['id']}" for r in rows)
    assert orphan_files(opts) == []
    assert set(epoch_states(job.metastore, job.sink_id)) == {"COMMITTED"}
    table = load_catalog(opts.catalog_name, **opts.catalog_properties()).load_table(opts.table)
    paths = [t.file.file_path.split("://", 1)[-1] for t in table.scan().plan_files()]
    assert paths and all(("/eosink-" in p) == native for p in paths), paths
    location = table.location()
    if location.startswith("file:"):
        data = Path(location.split("://", 1)[-1]) / "data"
        assert {str(p) for p in data.rglob("*") if p.is_file()} == set(paths)
        for d in data.rglob("*"):
            if d.is_dir():
                assert any(p.startswith(f"{d}/") for p in paths), f"left behind: {d}"


@pytest.mark.parametrize(
    ("kind", "mode", "faults"),
    [
        pytest.param(kind, mode, faults, id=f"{kind}-{mode}-{'+'.join(faults)}")
        for kind, mode, faults in CASES
    ],
)
def test_iceberg_crash(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, mode: str, faults: list[str]
) -> None:
    metastore, extra = catalog(kind, request, tmp_path)
    job = Job(tmp_path, mode, metastore, sink="iceberg", **extra)
    expected = make_input(job.input, files=3 + len(faults))
    crash_chain(job, faults)
    _check_table(job, expected, native=kind != "s3" and not mode.startswith("ds-"))


@pytest.mark.release
def test_iceberg_executor_lost_python_writers(tmp_path: Path) -> None:
    """Python writers (writer="python"): a task's Python worker dies before its writer's
    finish_write, then, in a later run of the stream, right after it (its data files are
    written, its result never reaches the driver); Spark retries the tasks. The table holds
    every row once and no data file of a dead attempt is left."""
    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'metastore.db'}",
        sink="iceberg",
        master="local[2,3]",
        writer="python",
    )
    make_input(job.input, files=2)
    job.assert_fired("task_before_finish", job.run(fault="task_before_finish"))
    # Two more input files (the first two are rewritten as they were: already read).
    expected = make_input(job.input, files=4)
    job.assert_fired("task_after_finish", job.run(fault="task_after_finish"))
    _check_table(job, expected, native=False)


@pytest.mark.release  # 4-5 min: Spark's Iceberg runtime; CI: test_iceberg.py's in-process twin
def test_orphan_cleanup_while_pending_is_refused_not_committed(tmp_path: Path, capsys: Any) -> None:
    """An orphan-file cleanup runs while an epoch is PENDING (checkpointed, its commit not
    done): Iceberg's own ``DeleteOrphanFiles`` (``remove_orphan_files``) through Spark's
    runtime, with an ``older_than`` of now, deletes the epoch's data files (no snapshot
    references them yet). The restart must not commit dangling references: it refuses the
    epoch naming the missing files and ``eosink abandon``; the runbook's command records the
    loss, and the stream then finishes every other epoch exactly once, with a table whose
    every referenced file exists (apache/storm#8950's lesson)."""
    import time

    from harness import status_json
    from test_iceberg_spark_reader import iceberg_runtime

    from eosink._cli import main as cli

    metastore = f"sqlite:///{tmp_path / 'metastore.db'}"
    job = Job(tmp_path, "stream", metastore, sink="iceberg", writer="python")
    expected = make_input(job.input, files=4, rows=40)
    job.assert_fired("before_commit@2", job.run(fault="before_commit@2"))
    assert epoch_states(metastore, job.sink_id) == {"COMMITTED": [0], "PENDING": [1]}
    from pyiceberg.catalog import load_catalog

    opts = job.iceberg_options()
    table = load_catalog(opts.catalog_name, **opts.catalog_properties()).load_table(opts.table)
    older_than = int((time.time() + 1) * 1000)
    time.sleep(1.5)
    deleted = iceberg_runtime(
        "iceberg_remove_orphans.py",
        table.metadata_location,
        str(older_than),
        tag="EOSINK-ORPHANS",
    )
    assert deleted, "the cleanup found no orphan: epoch 1's files should be"

    assert job.run() != 0
    log = job.last_log()
    assert "epoch 1 cannot be committed" in log and "are gone" in log, log[-3000:]
    assert "eosink abandon" in log
    assert epoch_states(metastore, job.sink_id)["PENDING"] == [1]
    # The runbook: record the loss, run again.
    argv = ["abandon", "--sink-id", job.sink_id, "--epoch", "1", "--metastore-url", metastore]
    assert cli([*argv, "--reason", "files deleted by an orphan cleanup", "--accept-data-loss"]) == 0
    assert job.run() == 0, job.last_log()
    rows = iceberg_rows(opts)
    lost = set(range(40, 80))  # epoch 1 read input file 1
    assert sorted(int(r["id"]) for r in rows) == [i for i in expected if i not in lost]
    assert orphan_files(opts) == []
    losses = status_json(metastore, capsys)["losses"]
    assert [x["epoch"] for x in losses] == [1], losses
