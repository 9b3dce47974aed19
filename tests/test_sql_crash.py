"""The sql sink's crash matrix: SIGKILL the driver, restart, read the table with plain SQL.

Each case runs tests/crashjob.py with ``--sink sql`` against a fresh database of the real
PostgreSQL server, kills it at fault points (``EOSINK_FAULT``), restarts it until it exits 0,
then compares the table with what the input says it must hold: appends row by row (every id
once, with its group and payload); for the change stream (``mode="upsert"``, keys ``grp``,
``order_by`` ``id``, every 7th id a delete) the final state computed from the input files
in order (one file per micro-batch; ``harness.make_cdc_input``: keys changed in every epoch
and keys of their own, so that a lost, skipped or reordered epoch changes the table). The
target's own record (``sql_epochs``) must hold each epoch once, in order. Nothing may be left
in eosink's staging tables, and every epoch must be COMMITTED. Chains of points fire in
successive runs (as in test_crash.py).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import create_pg_database, drop_pg_database
from harness import (
    Job,
    cdc_state,
    check_commits_at_target,
    crash_chain,
    epoch_states,
    expected_epochs,
    kill_session,
    make_cdc_input,
    make_input,
    run_with_random_kills,
    runbook_blocks,
)

pytestmark = pytest.mark.crash

ROWS = 40  # rows per input file: one file per micro-batch
TABLE = "events"
SCHEMA = "eosink_crash"

# The eosink.run stream's chains (appends, the change stream, PostgreSQL and SQLite targets)
# and random kills of its change stream run in tests/test_lifecycle_kills.py, whose driver
# runs the stream's real lifecycle without Spark: since it writes each epoch with two tasks
# (two staging tables), it also caught a recovery commit applying one table only, which the
# Spark chain here (one task an epoch) let pass. Here: what needs Spark.
# eosink.run's batch chains (a PostgreSQL and a SQLite target) likewise run in
# tests/test_lifecycle_kills.py (eosink._batch.run_batch without Spark).


@pytest.fixture
def target_db() -> Any:
    url = create_pg_database()
    yield url
    drop_pg_database(url)


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        return sa.create_engine(url)
    return sa.create_engine(sa.engine.make_url(url).set(drivername="postgresql+psycopg"))


def sql_job(tmp: Path, mode: str, url: str, **more: Any) -> Job:
    """A crash job of the sql sink; ``more``: sink options (``sink_mode`` is ``mode``)."""
    if "sink_mode" in more:
        more["mode"] = more.pop("sink_mode")
    opts = {
        "url": url,
        "table": TABLE,
        "create_table": True,
        "staging_schema": SCHEMA,
        "sink_id": f"sql:crash-{mode}",
        **more,
    }
    return Job(tmp, mode, f"sqlite:///{tmp / 'meta.db'}", sink_options=opts, sink="sql")


def cdc_job(tmp: Path, url: str, files: int) -> Job:
    """A change stream job (upserts by ``grp``, the largest ``id`` of an epoch winning, every
    7th id a delete) over ``files`` change files (``harness.make_cdc_input``: hot keys
    changed in every epoch, and keys of their own) taken in name order."""
    job = sql_job(
        tmp, "stream", url, sink_mode="upsert", keys=["grp"], order_by="id", op_column="op"
    )
    make_cdc_input(job.input, files=files, rows=ROWS)
    return job


def _read(url: str) -> tuple[list[tuple[int, str, str]], list[str], list[int]]:
    """The table's rows (id, grp, payload), eosink's staging tables and the epochs of
    ``sql_epochs`` (the target's own record of its commits) in commit order, with plain SQL."""
    sqlite = url.startswith("sqlite")
    staging = (
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'eosink_stg%'"
        if sqlite
        else "SELECT table_name FROM information_schema.tables "
        f"WHERE table_schema = '{SCHEMA}' AND table_name LIKE 'stg%'"
    )
    epochs_table = "eosink_sql_epochs" if sqlite else f"{SCHEMA}.sql_epochs"
    eng = _engine(url)
    try:
        with eng.connect() as c:
            rows = [tuple(r) for r in c.execute(sa.text(f"SELECT id, grp, payload FROM {TABLE}"))]
            staged = list(c.execute(sa.text(staging)).scalars())
            epochs = list(
                c.execute(
                    sa.text(f"SELECT epoch FROM {epochs_table} ORDER BY committed_at, epoch")
                ).scalars()
            )
    finally:
        eng.dispose()
    return sorted(rows), staged, epochs  # type: ignore[arg-type]


def _check(job: Job, url: str, expected: list[tuple[int, str, str]]) -> None:
    rows, staged, at_target = _read(url)
    ids = [r[0] for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert rows == expected, (
        f"{len(rows)} rows, {len(expected)} expected; missing "
        f"{sorted(set(e[0] for e in expected) - set(ids))[:10]}, duplicated {dup[:10]}"
    )
    assert staged == [], staged
    states = epoch_states(job.metastore, job.sink_id)
    assert sorted(states.get("COMMITTED", [])) == expected_epochs(job), states
    assert "PENDING" not in states and "ABORTED" not in states, states
    check_commits_at_target(at_target, expected_epochs(job))


def _appended(job: Job) -> list[tuple[int, str, str]]:
    rows = []
    for f in sorted(job.input.glob("*.parquet")):
        rows += [(r["id"], r["grp"], r["payload"]) for r in pq.read_table(f).to_pylist()]
    return sorted(rows)


def _cdc_state(job: Job) -> list[tuple[int, str, str]]:
    """Upserts by grp, the largest id of an epoch (file) winning, every 7th id a delete."""
    return cdc_state(job.input)


# The sql sink through format("eosink") on a SQLite target (no transaction held from phase
# 1: its commit runs the statements anew) and on PostgreSQL (the commit runs in Spark's
# Python data source worker; the whole driver is killed there), and eosink.run's batch
# killed inside its commit on each (PostgreSQL: the transaction held since phase 1 dies
# with the driver; the re-run commits the PENDING epoch anew). (eosink.run's streams on a
# SQLite target: tests/test_lifecycle_kills.py; tests/test_spark_lines.py kills one on
# pyspark 3.5.)
SQLITE_TARGET = [
    ("ds-stream", ["mid_commit@2"]),
    ("ds-batch", ["mid_commit"]),
    ("batch", ["mid_commit"]),
]
PG_FORMAT = [
    ("ds-stream", ["mid_commit@2"]),
    ("ds-batch", ["mid_commit"]),
    ("batch", ["mid_commit"]),
]


@pytest.mark.parametrize(
    ("mode", "faults"), SQLITE_TARGET, ids=[f"{m}-{'+'.join(f)}" for m, f in SQLITE_TARGET]
)
def test_sql_sqlite_target_crash(tmp_path: Path, mode: str, faults: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'target.sqlite'}"
    job = sql_job(tmp_path, mode, url)
    make_input(job.input, files=3 + len(faults), rows=ROWS)
    crash_chain(job, faults)
    _check(job, url, _appended(job))


@pytest.mark.parametrize(
    ("mode", "faults"), PG_FORMAT, ids=[f"{m}-{'+'.join(f)}" for m, f in PG_FORMAT]
)
def test_sql_datasource_crash(tmp_path: Path, target_db: str, mode: str, faults: list[str]) -> None:
    job = sql_job(tmp_path, mode, target_db)
    make_input(job.input, files=3 + len(faults), rows=ROWS)
    crash_chain(job, faults)
    _check(job, target_db, _appended(job))


@pytest.mark.release
def test_sql_cdc_random_kills(tmp_path: Path, target_db: str) -> None:
    """A change stream whose driver is killed at random instants, then let finish."""
    job = cdc_job(tmp_path, target_db, files=8)
    run_with_random_kills(job, random.Random("sql-cdc"), window=2.5, attempts=3)
    _check(job, target_db, _cdc_state(job))


@pytest.mark.release
def test_sql_executor_killed_before_and_after_finish(tmp_path: Path, target_db: str) -> None:
    """A task's Python worker dies with its rows loaded into its staging table but not
    committed (``task_before_finish``: the server rolls its transaction back, the table with
    it), or right after ``finish_write`` (its staging table is committed, its result never
    reaches the driver: a table no committable names). Spark retries the tasks; every row
    lands once and no staging table is left."""
    opts = {
        "url": target_db,
        "table": TABLE,
        "create_table": True,
        "staging_schema": SCHEMA,
        "sink_id": "sql:crash-executor",
    }
    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'meta.db'}",
        sink_options=opts,
        sink="sql",
        master="local[2,3]",
    )
    make_input(job.input, files=2, rows=ROWS)
    job.assert_fired("task_before_finish", job.run(fault="task_before_finish"))
    make_input(job.input, files=4, rows=ROWS)  # the first two rewritten as they were
    job.assert_fired("task_after_finish", job.run(fault="task_after_finish"))
    _check(job, target_db, _appended(job))


@pytest.mark.release
def test_sql_two_drivers_zombie_fenced(tmp_path: Path, target_db: str) -> None:
    """A second real driver takes the sink over while the first is inside the protocol (a
    failover whose old driver is still alive). The first is fenced and stops; the
    transactions it held open for its commits are ended by the second (their locks would
    block it) or die with it; a final run completes; every row exactly once."""
    job = sql_job(tmp_path, "stream", target_db)
    make_input(job.input, files=4, rows=ROWS)
    code_a, _, log_a, log_b = job.run_overlapping()
    assert code_a != 0 and "fenced by a newer one" in log_a, (log_a[-3000:], log_b[-3000:])
    assert job.run() == 0, job.last_log()
    _check(job, target_db, _appended(job))


def test_runbook_held_transaction(tmp_path: Path, target_db: str) -> None:
    """docs/cli.md's runbook "a SQL sink's held transaction blocks another writer", as
    written: a driver stalls (SIGSTOP) right before the commit of epoch 1, its phase-1
    transaction held open on PostgreSQL; another writer's ``LOCK TABLE`` waits for it. The
    runbook's ``eosink status`` names the held session, its SQL ends it, the other writer
    goes on; the stalled job is stopped and run again: every row exactly once."""
    import shlex
    import subprocess
    import sys
    import time

    [(_, status_cmd), _, (_, end_sql)] = runbook_blocks(
        "cli.md", "Runbook: a SQL sink's held transaction blocks another writer"
    )
    job = sql_job(tmp_path, "stream", target_db)
    make_input(job.input, files=3, rows=ROWS)
    stalled = job.spawn("stalled", fault="before_commit@2", stop=True)
    try:
        deadline = time.monotonic() + 180
        while job.fired() != ["before_commit"]:
            assert stalled.poll() is None and time.monotonic() < deadline, job.last_log()
            time.sleep(0.1)
        eng = _engine(target_db)

        def other_writer() -> str:
            """``LOCK TABLE`` (as ``ALTER TABLE`` or ``TRUNCATE`` would take it), 2 s at most."""
            try:
                with eng.begin() as c:
                    c.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
                    c.execute(sa.text(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE"))
                return "locked"
            except sa.exc.OperationalError as exc:
                return f"waited: {type(exc.orig).__name__}"

        try:
            assert other_writer() == "waited: LockNotAvailable"
            argv = shlex.split(status_cmd.replace("URL", job.metastore).replace("ID", job.sink_id))
            assert argv[0] == "eosink"
            out = subprocess.run(
                [sys.executable, "-m", "eosink._cli", *argv[1:]],
                capture_output=True, text=True, check=True, timeout=120,
            ).stdout  # fmt: skip
            held = re.findall(r"application_name '(eosink-hold ([0-9a-f]{16}) (\d+))'", out)
            assert "1" in [epoch for _, _, epoch in held], out  # epoch 1's, at least
            [key] = {key for _, key, _ in held}
            sql = re.sub(r"'eosink-hold [0-9a-f]{16} %'", f"'eosink-hold {key} %'", end_sql)
            assert sql != end_sql and sql.count(key) == 1
            with eng.begin() as c:
                ended = c.execute(sa.text(sql)).scalars().all()
            assert ended and all(ended), ended  # one session per held epoch, each ended
            assert other_writer() == "locked"  # the table is free at once
        finally:
            eng.dispose()
    finally:
        kill_session(stalled.pid, stalled)  # stop the stalled job
    assert job.run() == 0, job.last_log()  # and run it again
    _check(job, target_db, _appended(job))
