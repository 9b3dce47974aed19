"""Change-data-capture into Iceberg (``mode="upsert"``): upserts and deletes exactly once.

Every check reads the table back with an independent reader (a pyiceberg scan) and compares
it with the state computed from the input, row by row; the table location must hold no data
file that no snapshot references, and no staged change file once the epoch is committed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_iceberg import _opts, _table, orphan_files

import eosink

CDC = {"mode": "upsert", "keys": ["id"], "order_by": "seq", "op_column": "op"}
SCHEMA = "id long, payload string, op string, seq long"


def _changes(spark: Any, rows: list[tuple[Any, ...]], schema: str = SCHEMA) -> Any:
    return spark.createDataFrame(rows, schema).repartition(3)


def _apply(state: dict[int, dict[str, Any]], rows: list[tuple[Any, ...]], cols: list[str]) -> None:
    """The model: the last change of each key within the epoch (largest seq), applied."""
    last: dict[int, dict[str, Any]] = {}
    for r in rows:
        row = dict(zip(cols, r, strict=True))
        cur = last.get(row["id"])
        newer = row["seq"] is not None and (
            cur is None or cur["seq"] is None or row["seq"] > cur["seq"]
        )
        if cur is None or newer:
            last[row["id"]] = row
    for k, row in last.items():
        if row["op"] == "d":
            state.pop(k, None)
        else:
            state[k] = {c: v for c, v in row.items() if c != "op"}


def _rows(tmp_path: Path) -> list[dict[str, Any]]:
    return sorted(_table(tmp_path).scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def _leftovers(tmp_path: Path) -> list[str]:
    """Files under the data location that no snapshot references (orphans, staged changes)."""
    opts = eosink.get_sink("iceberg").parse_options(_opts(tmp_path, **CDC))
    files = [str(p) for p in (tmp_path / "wh").rglob("data/**/*") if p.is_file()]
    assert all(p.endswith(".parquet") for p in files), files
    return orphan_files(opts)


def _check(tmp_path: Path, state: dict[int, dict[str, Any]]) -> None:
    got = _rows(tmp_path)
    want = sorted(state.values(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == [r["id"] for r in want]
    assert got == want
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("writer", ["spark", "python"])
def test_upserts_and_deletes_exactly_once(spark, tmp_path: Path, writer: str) -> None:  # type: ignore[no-untyped-def]
    """Three epochs of changes (inserts, updates, deletes, several changes of one key in an
    epoch, a delete of a missing key), each committed as one snapshot; a re-run of an epoch
    changes nothing; the snapshot of a later epoch rewrites only the files holding its keys."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    cols = ["id", "payload", "op", "seq"]
    opts = {**_opts(tmp_path, **CDC), "writer": writer, "metastore_url": url}
    state: dict[int, dict[str, Any]] = {}
    e1 = [(i, f"v1-{i}", "c", 1) for i in range(100)]
    e2 = (
        [(i, f"v2-{i}", "u", 5) for i in range(50, 150)]
        + [(i, None, "d", 5) for i in range(10)]
        + [(60, "older", "u", 4), (60, "newest", "u", 9), (61, "null-seq", "u", None)]
        + [(1000, None, "d", 1)]  # a delete of a key that is not there: nothing
    )
    e3 = [(55, None, "d", 1), (5, "back", "u", 1), (200, "new", "c", 1)]
    for epoch, rows in ((1, e1), (2, e2), (3, e3)):
        r = eosink.run(_changes(spark, rows), sink="iceberg", epoch=epoch, **opts)
        assert isinstance(r, eosink.BatchResult) and r.committed, r
        _apply(state, rows, cols)
        _check(tmp_path, state)
    assert next(r for r in _rows(tmp_path) if r["id"] == 60)["payload"] == "newest"
    # Re-running a committed epoch writes nothing twice.
    r = eosink.run(_changes(spark, e2), sink="iceberg", epoch=2, **opts)
    _check(tmp_path, state)
    table = _table(tmp_path)
    snaps = [s for s in table.snapshots() if s.summary.additional_properties.get("eosink.epoch")]
    assert [s.summary.additional_properties["eosink.epoch"] for s in snaps] == ["1", "2", "3"]
    assert snaps[-1].summary.operation.value == "overwrite"
    # The op_column is not written; order_by is a column like any other.
    assert [f.name for f in table.schema().fields] == ["id", "payload", "seq"]


def test_stream_with_a_column_added_mid_stream(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A change stream, stopped and restarted from its checkpoint with a new column in its
    input (how a stream's schema changes): the table evolves in the next epoch's commit;
    rows rewritten from files that predate the column get a null there."""
    import os
    import time

    import pyarrow.parquet as pq

    inp = tmp_path / "in"
    inp.mkdir()
    url = f"sqlite:///{tmp_path / 'm.db'}"
    batches = [
        [{"id": i, "payload": f"a{i}", "op": "c", "seq": 1} for i in range(20)],
        [{"id": i, "payload": f"b{i}", "op": "u", "seq": 2} for i in range(10, 30)],
        [{"id": i, "payload": f"c{i}", "op": "u", "seq": 3, "extra": i * 10} for i in range(25, 35)]
        + [{"id": 0, "payload": None, "op": "d", "seq": 3, "extra": None}],
    ]
    state: dict[int, dict[str, Any]] = {}
    for r in [r for rows in batches for r in rows]:
        if r["op"] == "d":
            state.pop(r["id"], None)
        else:
            state[r["id"]] = {k: r.get(k) for k in ("id", "payload", "seq", "extra")}

    def stream(n: int, schema: str) -> None:
        for i in range(n):
            f = inp / f"in-{i}.parquet"
            if not f.exists():
                pq.write_table(pa.Table.from_pylist(batches[i]), f)
                os.utime(f, (time.time() - 100 + i, time.time() - 100 + i))
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(inp))
        h = eosink.run(
            sdf,
            sink="iceberg",
            checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True},
            metastore_url=url,
            **_opts(tmp_path, **CDC),
        )
        h.await_termination()  # type: ignore[union-attr]

    stream(2, SCHEMA)
    assert [f.name for f in _table(tmp_path).schema().fields] == ["id", "payload", "seq"]
    stream(3, SCHEMA + ", extra long")
    assert [f.name for f in _table(tmp_path).schema().fields] == ["id", "payload", "seq", "extra"]
    _check(tmp_path, state)


def test_column_added_between_batch_epochs(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Epoch 2 brings a new column: files written before it are rewritten with a null in it."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {**_opts(tmp_path, **CDC), "metastore_url": url}
    e1 = [(i, f"a{i}", "c", 1) for i in range(10)]
    eosink.run(_changes(spark, e1), sink="iceberg", epoch=1, **opts)
    e2 = [(i, f"b{i}", "u", 2, i * 10) for i in range(5, 15)]
    eosink.run(_changes(spark, e2, SCHEMA + ", extra long"), sink="iceberg", epoch=2, **opts)
    state = {i: {"id": i, "payload": f"a{i}", "seq": 1, "extra": None} for i in range(5)}
    state |= {i: {"id": i, "payload": f"b{i}", "seq": 2, "extra": i * 10} for i in range(5, 15)}
    _check(tmp_path, state)


@pytest.mark.parametrize(
    ("rows", "options", "error", "says"),
    [
        (
            [(1, "a", "u", 1), (1, "b", "u", 2)],
            {"order_by": None},
            eosink.SinkError,
            "more than one row",
        ),
        ([(1, "a", "u", 3), (1, "b", "u", 3)], {}, eosink.SinkError, "tie on order_by"),
        ([(None, "a", "u", 1)], {}, eosink.SchemaMismatchError, "key column 'id' is null"),
    ],
    ids=["repeated-key", "tie", "null-key"],
)
def test_bad_changes_refused_before_phase_1(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path, rows: list[Any], options: dict[str, Any], error: type, says: str
) -> None:
    """What no commit could publish is refused before the epoch is PENDING: nothing is
    committed, nothing staged is left, the table is unchanged."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {**_opts(tmp_path, **{**CDC, **options}), "metastore_url": url}
    eosink.run(_changes(spark, [(7, "x", "c", 1)]), sink="iceberg", epoch=1, **opts)
    with pytest.raises(error, match=says):
        eosink.run(_changes(spark, rows), sink="iceberg", epoch=2, **opts)
    _check(tmp_path, {7: {"id": 7, "payload": "x", "seq": 1}})
    # The sink is not stuck: the next run with good changes commits.
    eosink.run(_changes(spark, [(7, "y", "u", 2)]), sink="iceberg", epoch=2, **opts)
    _check(tmp_path, {7: {"id": 7, "payload": "y", "seq": 2}})


def test_order_by_a_key_column(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``order_by`` may name a key column (changes keyed and ordered by their id): the epochs
    commit (phase 1 failed with pyarrow's "Multiple matches for FieldRef" before), and two
    rows of one key then tie on ``order_by``: refused, nothing committed."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    cdc = {**CDC, "order_by": "id"}
    opts = {**_opts(tmp_path, **cdc), "metastore_url": url}
    e1 = [(1, "a", "c", 1), (2, "b", "c", 1), (3, "x", "c", 1)]
    eosink.run(_changes(spark, e1), sink="iceberg", epoch=1, **opts)
    eosink.run(
        _changes(spark, [(2, "b2", "u", 2), (3, None, "d", 2)]), sink="iceberg", epoch=2, **opts
    )
    state = {1: {"id": 1, "payload": "a", "seq": 1}, 2: {"id": 2, "payload": "b2", "seq": 2}}
    _check(tmp_path, state)
    tie = [(1, "p", "u", 3), (1, "q", "u", 4)]
    with pytest.raises(eosink.SinkError, match=r"rows of key \{'id': 1\} tie on order_by 'id'"):
        eosink.run(_changes(spark, tie), sink="iceberg", epoch=3, **opts)
    _check(tmp_path, state)


def test_upsert_backfill_and_bad_options_refused(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {**_opts(tmp_path, **CDC), "metastore_url": url}
    eosink.run(_changes(spark, [(1, "a", "c", 1)]), sink="iceberg", epoch=5, **opts)
    with pytest.raises(eosink.ConfigError, match="commit in order"):
        eosink.run(_changes(spark, [(1, "old", "u", 1)]), sink="iceberg", epoch=3, **opts)
    _check(tmp_path, {1: {"id": 1, "payload": "a", "seq": 1}})
    with pytest.raises(eosink.ConfigError, match="needs keys"):
        eosink.run(_changes(spark, []), sink="iceberg", epoch=6, **{**opts, "keys": []})
    with pytest.raises(eosink.SchemaMismatchError, match="'nope' is not in the DataFrame"):
        eosink.run(_changes(spark, []), sink="iceberg", epoch=6, **{**opts, "keys": ["nope"]})
    with pytest.raises(eosink.ConfigError, match="options of mode='upsert'"):
        eosink.run(_changes(spark, []), sink="iceberg", epoch=6, **{**opts, "mode": "append"})


@pytest.mark.parametrize("other", ["append", "delete"])
def test_concurrent_writer_conflict_is_redone(  # type: ignore[no-untyped-def]
    spark,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    other: str,
) -> None:
    """Another application commits to the table while an upsert epoch is being committed
    (between eosink's read of the files it rewrites and its table commit). ``append``: a new
    file: the commit is retried on the new snapshot. ``delete``: the other application
    rewrites a file eosink rewrites: the commit cannot stand and is redone from the new
    snapshot. Either way the result is exact: both applications' changes, once."""
    from eosink_iceberg import rewrite

    url = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {**_opts(tmp_path, **CDC), "metastore_url": url}
    e1 = [(i, f"a{i}", "c", 1) for i in range(20)]
    eosink.run(_changes(spark, e1).coalesce(1), sink="iceberg", epoch=1, **opts)
    state = {i: {"id": i, "payload": f"a{i}", "seq": 1} for i in range(20)}
    original = rewrite.write_data
    calls: list[int] = []

    def write_data(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the first commit attempt, after its read of the table
            t = _table(tmp_path)
            if other == "append":
                t.append(
                    pa.table(
                        {
                            "id": pa.array([500], pa.int64()),
                            "payload": ["other"],
                            "seq": pa.array([0], pa.int64()),
                        },
                        schema=t.schema().as_arrow(),
                    )
                )
            else:
                from pyiceberg.expressions import EqualTo

                t.delete(EqualTo("id", 19))
        return original(*a, **kw)

    monkeypatch.setattr(rewrite, "write_data", write_data)
    e2 = [(i, f"b{i}", "u", 2) for i in range(10)]
    with caplog.at_level(logging.INFO):
        r = eosink.run(_changes(spark, e2), sink="iceberg", epoch=2, **opts)
    assert isinstance(r, eosink.BatchResult) and r.committed
    assert "concurrent update" in caplog.text, caplog.text  # pyiceberg saw the conflict
    assert "redone on the new snapshot" in caplog.text, caplog.text  # and eosink redid it
    assert caplog.text.count("redone on the new snapshot") == 1, caplog.text
    if other == "append":
        state[500] = {"id": 500, "payload": "other", "seq": 0}
    else:
        state.pop(19)
    for i in range(10):
        state[i] = {"id": i, "payload": f"b{i}", "seq": 2}
    _check(tmp_path, state)


# --- crashes: SIGKILL of the driver, restart, the table read back --------------------------
CRASH_CDC = {"mode": "upsert", "keys": ["grp"], "order_by": "id", "op_column": "op"}


def _cdc_job(tmp_path: Path, mode: str, files: int, **extra: str) -> Any:
    """A crash job of a change stream into Iceberg: upserts by ``grp`` (the largest ``id`` of
    an epoch wins), every 7th id a delete; change files (``harness.make_cdc_input``: hot
    keys changed in every epoch and keys of their own) taken in name order."""
    from harness import Job, make_cdc_input
    from test_sql_crash import ROWS

    job = Job(
        tmp_path,
        mode,
        f"sqlite:///{tmp_path / 'metastore.db'}",
        sink_options=CRASH_CDC,
        sink="iceberg",
        **extra,
    )
    make_cdc_input(job.input, files=files, rows=ROWS)
    return job


def snapshot_epochs(opts: Any, sink_id: str) -> list[int]:
    """The epochs of the sink's snapshots (their summaries' ``eosink.epoch``), in the table's
    snapshot order: the target's own record of what was committed."""
    from pyiceberg.catalog import load_catalog

    table = load_catalog(opts.catalog_name, **opts.catalog_properties()).load_table(opts.table)
    snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
    return [
        int(s.summary["eosink.epoch"])
        for s in snapshots
        if s.summary is not None and s.summary.get("eosink.sink-id") == sink_id
    ]


def _check_cdc(job: Any) -> None:
    """The table equals the change stream's final state, row by row (pyiceberg); the table's
    snapshots hold each epoch once, in order; no file of the data location is left that no
    snapshot references (staged changes, a dead commit attempt's files); every epoch Spark
    ran is COMMITTED."""
    from harness import cdc_state, check_commits_at_target, epoch_states, expected_epochs
    from test_iceberg import iceberg_rows

    opts = job.iceberg_options()
    rows = sorted((r["id"], r["grp"], r["payload"]) for r in iceberg_rows(opts))
    assert rows == cdc_state(job.input), job.last_log()[-3000:]
    epochs = expected_epochs(job)
    check_commits_at_target(snapshot_epochs(opts, job.sink_id), epochs)
    assert orphan_files(opts) == []
    files = [p for p in job.out.rglob("data/**/*") if p.is_file()]
    assert all(p.suffix == ".parquet" for p in files), files
    states = epoch_states(job.metastore, job.sink_id)
    assert sorted(states.get("COMMITTED", [])) == epochs, states
    assert set(states) == {"COMMITTED"}, states


# The points where an upsert epoch's recovery differs from an append's, chained as
# tests/test_crash.py chains them (each restart is armed with the next point after recovering
# from the previous crash): inside and after the copy-on-write commit, in a live run and in
# recovery's commit of a checkpointed epoch, and the abort of a persisted one. The core's
# other points are proven once per front end (tests/test_crash.py).
# The stream's commit chains (in a live run: mid_commit@2, after_commit@2,
# after_mark_committed@2; in recovery's commit of a checkpointed epoch: before_commit@2,
# mid_commit, after_commit) and random kills run in tests/test_lifecycle_kills.py (the
# stream's lifecycle without Spark, Python writers), which caught what they caught here, an
# epoch's commit taken for not done when it is the table's newest. Recovery's own points
# around an abort (recovery_before_abort, recovery_before_finish_abort) and a batch's other
# points (after_write_results, after_commit, after_mark_committed) are the core's code, the
# same for appends and upserts, killed through each front end with other sinks (the fault
# coverage table, tests/faultmatrix.py). Here: Spark's writers staging the changes, the
# commit of what they staged, and recovery's abort of it.
CDC_CHAINS = [
    # The abort of epoch 2 (persisted, not checkpointed) in the restart's recovery.
    ("stream", ["after_persist@3", "mid_abort"]),
    # Killed once Spark's writers staged the batch, then inside its copy-on-write commit.
    ("batch", ["after_spark_write", "mid_commit"]),
]


@pytest.mark.crash
@pytest.mark.parametrize(
    ("mode", "faults"), CDC_CHAINS, ids=[f"{m}-{'+'.join(f)}" for m, f in CDC_CHAINS]
)
def test_iceberg_cdc_crash(tmp_path: Path, mode: str, faults: list[str]) -> None:
    job = _cdc_job(tmp_path, mode, files=3 + len(faults))  # a run dies at its 2nd epoch
    from harness import crash_chain

    crash_chain(job, faults)
    _check_cdc(job)


@pytest.mark.release
@pytest.mark.crash
def test_iceberg_cdc_random_kills(tmp_path: Path) -> None:
    """A change stream whose driver is killed at random instants, then let finish."""
    import random

    from harness import run_with_random_kills

    job = _cdc_job(tmp_path, "stream", files=8)
    run_with_random_kills(job, random.Random("iceberg-cdc"), window=2.5, attempts=3)
    _check_cdc(job)


@pytest.mark.release
@pytest.mark.crash
def test_iceberg_cdc_executor_lost(tmp_path: Path) -> None:
    """Python writers: a task's worker dies before its change file is reported, then, in a
    later run, right after it; Spark retries the tasks; no change is applied twice and no
    staged change file of a dead attempt is left."""
    from harness import make_cdc_input
    from test_sql_crash import ROWS

    job = _cdc_job(tmp_path, "stream", files=2, master="local[2,3]", writer="python")
    job.assert_fired("task_before_finish", job.run(fault="task_before_finish"))
    make_cdc_input(job.input, files=4, rows=ROWS)  # the first two rewritten as they were
    job.assert_fired("task_after_finish", job.run(fault="task_after_finish"))
    _check_cdc(job)


def test_docs_recipe_runs_as_written(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/iceberg.md's change stream recipe, its code block as written (only the paths
    replaced; the embedded catalog and meta store under a fresh EOSINK_HOME), over change
    events with inserts, updates, several changes of one id and deletes. The table read back
    equals the source table those changes leave."""
    import json
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "iceberg.md").read_text()
    section = text[text.index("### A change stream into an Iceberg table") :]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "docs/iceberg.md: the recipe's code block is gone"
    cdc_dir, chk = tmp_path / "cdc", tmp_path / "chk"
    code = m.group(1)
    assert "/data/cdc/customers" in code and "/chk/crm.customers" in code
    code = code.replace("/data/cdc/customers", str(cdc_dir)).replace("/chk/crm.customers", str(chk))
    monkeypatch.setenv("EOSINK_HOME", str(tmp_path / "home"))
    events = [
        {"id": i, "name": f"n{i}", "email": f"{i}@a", "op": "r", "lsn": i} for i in range(10)
    ] + [
        {"id": 3, "name": "n3", "email": "3@b", "op": "u", "lsn": 20},
        {"id": 3, "name": "n3", "email": "3@c", "op": "u", "lsn": 21},
        {"id": 4, "name": None, "email": None, "op": "d", "lsn": 22},
        {"id": 11, "name": "n11", "email": "11@a", "op": "c", "lsn": 23},
    ]
    cdc_dir.mkdir()
    (cdc_dir / "part-0.json").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    ns: dict[str, Any] = {"spark": spark, "eosink": eosink}
    exec(compile(code, "docs/iceberg.md", "exec"), ns)
    handle = ns["handle"]
    handle.process_all_available()
    handle.stop()
    state: dict[int, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e["lsn"]):
        if e["op"] == "d":
            state.pop(e["id"], None)
        else:
            state[e["id"]] = {k: v for k, v in e.items() if k != "op"}
    from pyiceberg.catalog import load_catalog

    opts = eosink.get_sink("iceberg").parse_options({"table": "crm.customers"})
    table = load_catalog(opts.catalog_name, **opts.catalog_properties()).load_table("crm.customers")
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows == sorted(state.values(), key=lambda r: r["id"])


@pytest.mark.release
def test_format_eosink_and_expired_snapshots(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``df.write.format("eosink")`` (Python writers) upserts too; with
    ``expire_snapshots_keep=1`` the files that only expired snapshots referenced (replaced by
    an upsert) are deleted: every file left is one the table reads."""
    import json

    url = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {**_opts(tmp_path, **CDC), "metastore_url": url, "expire_snapshots_keep": 1}
    state: dict[int, dict[str, Any]] = {}
    cols = ["id", "payload", "op", "seq"]
    for epoch in range(1, 3):
        rows = [(i, f"e{epoch}-{i}", "u", epoch) for i in range(epoch * 5, epoch * 5 + 20)]
        rows += [(epoch, None, "d", epoch)]
        w = _changes(spark, rows).write.format("eosink").option("sink", "iceberg")
        for k, v in opts.items():
            w = w.option(k, json.dumps(v) if isinstance(v, list) else str(v))
        w.option("epoch", str(epoch)).mode("append").save()
        _apply(state, rows, cols)
        _check(tmp_path, state)
    table = _table(tmp_path)
    assert len(table.snapshots()) == 1
    live = {t.file.file_path.split("://", 1)[-1] for t in table.scan().plan_files()}
    on_disk = {str(p) for p in (tmp_path / "wh").rglob("data/**/*.parquet")}
    assert on_disk == live
    # The directory of epoch 1's commit went with its files (no empty directories pile up).
    dirs = [p for p in (tmp_path / "wh").rglob("data/eosink-*") if p.is_dir()]
    assert dirs and all(any(q.is_file() for q in d.rglob("*")) for d in dirs), dirs
    assert not any("-e1-" in d.name for d in dirs), dirs


@pytest.mark.release
@pytest.mark.crash
def test_iceberg_cdc_driver_moves(tmp_path: Path) -> None:
    """A change stream whose driver dies at each point from PENDING to COMMITTED (between
    Spark's checkpoint and the commit among them) and restarts each time on a new machine:
    its own HOME, so the default meta store is new; only the checkpoint and the table
    survive. The table equals the changes' final state; nothing staged is left."""
    from harness import (
        Job,
        cdc_state,
        check_commits_at_target,
        expected_epochs,
        make_cdc_input,
    )
    from test_driver_moves import FILES, SHORT_CHAIN, check_states, moving_chain
    from test_iceberg import iceberg_rows
    from test_sql_crash import ROWS

    job = Job(tmp_path, "stream", "default", sink_options=CRASH_CDC, sink="iceberg")
    make_cdc_input(job.input, files=FILES, rows=ROWS)
    moving_chain(job, SHORT_CHAIN)
    opts = job.iceberg_options()
    rows = sorted((r["id"], r["grp"], r["payload"]) for r in iceberg_rows(opts))
    assert rows == cdc_state(job.input)
    check_commits_at_target(snapshot_epochs(opts, job.sink_id), expected_epochs(job))
    assert orphan_files(opts) == []
    assert all(p.suffix == ".parquet" for p in job.out.rglob("data/**/*") if p.is_file())
    check_states(job)
