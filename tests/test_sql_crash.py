"""The sql sink's crash matrix: SIGKILL the driver, restart, read the table with plain SQL.

Each case runs tests/crashjob.py with ``--sink sql`` against a fresh database of the real
PostgreSQL server, kills it at fault points (``EOSINK_FAULT``), restarts it until it exits 0,
then compares the table with what the input says it must hold: appends row by row (every id
once, with its group and payload); for the change stream (``mode="upsert"``, keys ``grp``,
``order_by`` ``id``, every 7th id a delete) the final state computed from the input files
in order (one file per micro-batch). Nothing may be left in eosink's staging tables, and
every epoch must be COMMITTED. Chains of points fire in successive runs (as in
test_crash.py).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import create_pg_database, drop_pg_database
from harness import Job, epoch_states, expected_epochs, make_input, run_with_random_kills

pytestmark = pytest.mark.crash

ROWS = 40  # rows per input file: one file per micro-batch
TABLE = "events"
SCHEMA = "eosink_crash"

STREAM_FAULTS = [
    # Before the epoch is durable, PENDING and not checkpointed (aborted, written again),
    # checkpointed and not committed, inside the commit's transaction, after it.
    ["after_write_results@2", "after_persist@2", "before_commit@2", "mid_commit"],
    ["after_commit@1", "after_mark_committed@2"],
]
# One epoch (5): the first run dies before it is PENDING, the next ones while finishing it.
BATCH_FAULTS = [["after_pre_commit", "after_persist", "mid_commit", "after_commit"]]
CDC_FAULTS = [["after_persist@2", "mid_commit@3", "after_commit@1"]]


@pytest.fixture
def target_db() -> Any:
    url = create_pg_database()
    yield url
    drop_pg_database(url)


def _engine(url: str) -> sa.Engine:
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
    7th id a delete) over ``files`` input files taken in name order."""
    job = sql_job(
        tmp, "stream", url, sink_mode="upsert", keys=["grp"], order_by="id", op_column="op"
    )
    make_input(job.input, files=files, rows=ROWS)
    _in_name_order(job)
    return job


def _read(url: str) -> tuple[list[tuple[int, str, str]], list[str]]:
    """The table's rows (id, grp, payload) and eosink's staging tables, with plain SQL."""
    eng = _engine(url)
    try:
        with eng.connect() as c:
            rows = [tuple(r) for r in c.execute(sa.text(f"SELECT id, grp, payload FROM {TABLE}"))]
            staged = list(
                c.execute(
                    sa.text(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = :s AND table_name LIKE 'stg%'"
                    ),
                    {"s": SCHEMA},
                ).scalars()
            )
    finally:
        eng.dispose()
    return sorted(rows), staged  # type: ignore[arg-type]


def _check(job: Job, url: str, expected: list[tuple[int, str, str]]) -> None:
    rows, staged = _read(url)
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


def _appended(job: Job) -> list[tuple[int, str, str]]:
    rows = []
    for f in sorted(job.input.glob("*.parquet")):
        rows += [(r["id"], r["grp"], r["payload"]) for r in pq.read_table(f).to_pylist()]
    return sorted(rows)


def _in_name_order(job: Job) -> None:
    """Give the input files increasing modification times: Spark's file source takes them
    by modification time, and files written within one clock tick come in any order (the
    change stream's final state depends on the order of its epochs)."""
    import os
    import time

    now = time.time()
    for i, f in enumerate(sorted(job.input.glob("*.parquet"))):
        os.utime(f, (now - 100 + i, now - 100 + i))


def _cdc_state(job: Job) -> list[tuple[int, str, str]]:
    """Upserts by grp, the largest id of an epoch (file) winning, every 7th id a delete."""
    state: dict[str, tuple[int, str, str]] = {}
    for f in sorted(job.input.glob("*.parquet")):
        last: dict[str, dict[str, Any]] = {}
        for r in pq.read_table(f).to_pylist():
            if r["grp"] not in last or r["id"] > last[r["grp"]]["id"]:
                last[r["grp"]] = r
        for grp, r in last.items():
            if r["id"] % 7 == 0:
                state.pop(grp, None)
            else:
                state[grp] = (r["id"], r["grp"], r["payload"])
    return sorted(state.values())


def _crash_and_recover(job: Job, faults: list[str]) -> None:
    for fault in faults:
        code = job.run(fault=fault)
        assert job.fired() == [fault.split("@")[0]], f"fault {fault} not reached:\n{job.last_log()}"
        assert code == -9, f"the driver survived {fault} (exit {code}):\n{job.last_log()}"
    assert job.run() == 0, job.last_log()


@pytest.mark.parametrize("faults", STREAM_FAULTS, ids=lambda f: "+".join(f))
def test_sql_stream_crash(tmp_path: Path, target_db: str, faults: list[str]) -> None:
    job = sql_job(tmp_path, "stream", target_db)
    make_input(job.input, files=4, rows=ROWS)
    _crash_and_recover(job, faults)
    _check(job, target_db, _appended(job))


@pytest.mark.parametrize("faults", BATCH_FAULTS, ids=lambda f: "+".join(f))
def test_sql_batch_crash(tmp_path: Path, target_db: str, faults: list[str]) -> None:
    job = sql_job(tmp_path, "batch", target_db)
    make_input(job.input, files=4, rows=ROWS)
    _crash_and_recover(job, faults)
    _check(job, target_db, _appended(job))
    assert job.run() == 0, job.last_log()  # the finished batch again: nothing twice
    _check(job, target_db, _appended(job))


@pytest.mark.parametrize("faults", CDC_FAULTS, ids=lambda f: "+".join(f))
def test_sql_cdc_stream_crash(tmp_path: Path, target_db: str, faults: list[str]) -> None:
    job = cdc_job(tmp_path, target_db, files=5)
    _crash_and_recover(job, faults)
    _check(job, target_db, _cdc_state(job))


def test_sql_cdc_random_kills(tmp_path: Path, target_db: str) -> None:
    """A change stream whose driver is killed at random instants, then let finish."""
    job = cdc_job(tmp_path, target_db, files=8)
    run_with_random_kills(job, random.Random("sql-cdc"), window=2.5, attempts=3)
    _check(job, target_db, _cdc_state(job))


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
    assert job.run(fault="task_before_finish") == 0, job.last_log()
    assert "task_before_finish" in job.fired()
    make_input(job.input, files=4, rows=ROWS)  # the first two rewritten as they were
    assert job.run(fault="task_after_finish") == 0, job.last_log()
    assert "task_after_finish" in job.fired()
    _check(job, target_db, _appended(job))


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
