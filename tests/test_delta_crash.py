"""The delta sink killed for real: the cheap lifecycle driver (tests/lifecycle_driver.py: the
real stream and batch lifecycle, meta store, journal and sink, Spark simulated) SIGKILLed at
the core's points that matter for a sink's commit and at the delta sink's own (``mid_commit``
after the Delta version is written, ``mid_abort`` between two directories of an abort),
through every front end (``eosink.run``'s stream and batch, ``format("eosink")``'s), at
random instants, on a local and an S3 table, and with a driver that moves to another machine.

After each scenario an independent reader checks the table: delta-rs' query engine reads it
through its log and must find every input row exactly once (appends) or the change stream's
final state (upserts: hot keys changed within and across epochs, and keys only one row
touches, so that a lost, repeated or reordered epoch changes it); the table's history must
hold each epoch in exactly one commit, in epoch order (an upsert epoch applied twice leaves
the rows alike but shows there); no file the table does not reference may be left; the meta
store must hold every epoch COMMITTED. Spark's own kills (its native writer, its checkpoint)
are in tests/test_delta_spark.py.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
from test_delta import delta_rows, leftover_files, s3_table
from test_lifecycle_kills import ROWS, Driver, Zygote, _random_kills, zygote

import eosink

__all__ = ["zygote"]

pytestmark = pytest.mark.crash

CDC = {"mode": "upsert", "keys": ["grp"], "order_by": "id", "op_column": "op"}


def delta(
    zygote: Zygote,
    tmp: Path,
    batches: int,
    *,
    cdc: bool = False,
    batch: bool = False,
    front: str = "run",
    s3: dict[str, Any] | None = None,
    moves: bool = False,
) -> Driver:
    """A lifecycle driver of the delta sink: a table partitioned by ``grp`` (appends) or the
    change stream of ``harness.make_cdc_input`` (upserts by ``grp``, the largest ``id`` wins,
    every 7th id deletes), each micro-batch written by two tasks."""
    from harness import make_cdc_input

    opts: dict[str, Any] = {"sink": "delta", "tasks": 2, "path": str(tmp / "table")}
    if s3 is not None:
        opts.update(s3)
    if cdc:
        make_cdc_input(tmp / "input", files=batches, rows=ROWS)
        opts |= {**CDC, "input": str(tmp / "input")}
    else:
        opts["partition_by"] = ["grp"]
    if batch:
        opts["batch"] = True
    if front == "format":
        opts["front"] = "format"
    return Driver(zygote, tmp, batches=batches, options=opts, moves=moves)


def table_options(d: Driver) -> Any:
    from lifecycle_driver import DRIVER_KEYS

    opts = {k: v for k, v in d.sink_options.items() if k not in DRIVER_KEYS}
    return eosink.get_sink("delta").parse_options(opts)


def epochs_in_history(opts: Any, sink_id: str) -> list[int]:
    """The epochs of the sink's commits in the table's history, in version order."""
    from test_delta import delta_table

    dt = delta_table(opts)
    history = sorted(dt.history(), key=lambda h: h["version"]) if dt is not None else []
    return [int(h["eosink.epoch"]) for h in history if h.get("eosink.sink_id") == sink_id]


def check_job(job: Any, expected: list[int]) -> None:
    """A crash job's (``harness.Job``) table of appends: every input id once as delta-rs reads
    it, each epoch in one commit of the table's history, in order, nothing staged left, every
    epoch COMMITTED."""
    from harness import check_commits_at_target, epoch_states, expected_epochs
    from test_delta import delta_options

    opts = delta_options(job.out)
    assert sorted(int(r["id"]) for r in delta_rows(opts)) == sorted(expected), job.last_log()
    check_commits_at_target(epochs_in_history(opts, job.sink_id), expected_epochs(job))
    assert leftover_files(opts) == []
    assert set(epoch_states(job.metastore_url, job.sink_id)) == {"COMMITTED"}


def check(d: Driver) -> None:
    """The module docstring's checks."""
    from harness import cdc_state, check_commits_at_target, epoch_states, expected_epochs

    opts = table_options(d)
    rows = delta_rows(opts)
    if opts.mode == "upsert":
        got = sorted((r["id"], r["grp"], r["payload"]) for r in rows)
        assert got == cdc_state(d.input), d.last_log()[-3000:]
    else:
        ids = sorted(int(r["id"]) for r in rows)
        assert ids == list(range(d.batches * ROWS)), (
            f"{len(ids)} rows, {len(set(ids))} distinct\n{d.last_log()[-3000:]}"
        )
    expected = expected_epochs(d)  # type: ignore[arg-type]
    check_commits_at_target(epochs_in_history(opts, d.sink_id), expected)
    assert leftover_files(opts) == []
    others = leftover_files(opts, eosink_only=False)
    # A MERGE killed before its commit leaves the files delta-rs wrote (named by delta-rs:
    # the sink cannot tell them from a concurrent writer's in-flight files; VACUUM's job).
    assert opts.mode == "upsert" or others == [], others
    assert all(re.fullmatch(r"part-\d+-[0-9a-f-]{36}-c000\.\w+\.parquet", p) for p in others), (
        others
    )
    states = epoch_states(d.metastore, d.sink_id)
    assert sorted(states.get("COMMITTED", [])) == expected, states
    assert set(states) == {"COMMITTED"}, states


# eosink.run's stream: inside and after the Delta commit of a live run; recovery's abort of
# a persisted epoch Spark never checkpointed (killed between two task attempts' directories);
# recovery's commit of a checkpointed one.
STREAM_CHAINS = [
    ["after_persist@2", "mid_commit@2", "after_commit@2"],
    ["after_persist@3", "recovery_before_abort", "mid_abort", "recovery_before_finish_abort"],
    ["before_commit@2", "mid_commit", "after_commit"],
]


@pytest.mark.parametrize("chain", STREAM_CHAINS, ids=lambda c: "+".join(c))
@pytest.mark.parametrize("cdc", [False, True], ids=["append", "upsert"])
def test_stream_chain(zygote: Zygote, tmp_path: Path, chain: list[str], cdc: bool) -> None:
    d = delta(zygote, tmp_path, batches=3 + len(chain), cdc=cdc)
    for fault in chain:
        d.kill_at(fault, sink="delta")
    d.finish()
    check(d)


@pytest.mark.parametrize("cdc", [False, True], ids=["append", "upsert"])
def test_batch_chain(zygote: Zygote, tmp_path: Path, cdc: bool) -> None:
    """A batch run killed before its epoch is PENDING, then while finishing it."""
    d = delta(zygote, tmp_path, batches=4, cdc=cdc, batch=True)
    for fault in ["after_pre_commit", "mid_abort", "after_persist", "mid_commit", "after_commit"]:
        d.kill_at(fault, sink="delta", front="run-batch")
    d.finish()
    check(d)
    d.finish()  # the finished batch again: skipped, nothing twice
    check(d)


@pytest.mark.parametrize(
    ("kind", "chain"),
    [
        ("stream", ["after_persist@2", "mid_commit@2", "after_commit@3"]),
        ("batch", ["after_persist", "mid_commit", "after_mark_committed"]),
    ],
    ids=["stream", "batch"],
)
def test_format_chain(zygote: Zygote, tmp_path: Path, kind: str, chain: list[str]) -> None:
    """``format("eosink")``'s data source (its commit inline, in a fresh copy per batch)."""
    batch = kind == "batch"
    d = delta(zygote, tmp_path, batches=4 if batch else 3 + len(chain), batch=batch, front="format")
    for fault in chain:
        d.kill_at(fault, sink="delta", front=f"format-{kind}")
    d.finish()
    check(d)


def test_s3_chain(zygote: Zygote, s3_endpoint: str, tmp_path: Path) -> None:
    """A table on the S3 server: the Python writers stage there, delta-rs commits there."""
    d = delta(zygote, tmp_path, batches=6, s3=s3_table(s3_endpoint))
    for fault in ["after_persist@2", "mid_commit@2", "after_persist@3", "mid_abort"]:
        d.kill_at(fault, sink="delta")
    d.finish()
    check(d)


def test_driver_moves(zygote: Zygote, tmp_path: Path) -> None:
    """Every run on a new machine (a new, empty default meta store): the checkpoint's journal
    and the table carry the sink; killed between PENDING and COMMITTED, inside the commit and
    after it."""
    d = delta(zygote, tmp_path, batches=8, cdc=True, moves=True)
    for fault in ["after_persist@2", "before_commit@1", "mid_commit@1", "after_commit@1"]:
        d.kill_at(fault, sink="delta")
    d.finish()
    from harness import cdc_state

    opts = table_options(d)
    got = sorted((r["id"], r["grp"], r["payload"]) for r in delta_rows(opts))
    assert got == cdc_state(d.input)
    from harness import check_commits_at_target, expected_epochs

    check_commits_at_target(epochs_in_history(opts, d.sink_id), expected_epochs(d))  # type: ignore[arg-type]
    assert leftover_files(opts) == []


def test_batch_run_moves(zygote: Zygote, tmp_path: Path) -> None:
    """A batch run (``epoch=5``) killed once PENDING, inside its commit and after it, each
    re-run on a new machine (a new, empty default meta store): the batch journal beside the
    table (``_eosink/journal/``) finishes the crashed run's epoch; run again once finished,
    on yet another machine, it is skipped. (The release soak found the re-run after a commit
    refused, ``SinkIdentityError``, before the sink kept that journal.)"""
    from harness import check_commits_at_target, expected_epochs

    d = delta(zygote, tmp_path, batches=4, batch=True, moves=True)
    for fault in ["after_persist", "mid_commit", "after_commit"]:
        d.kill_at(fault, sink="delta", front="run-batch")
    d.finish()
    assert "taking it from the journal" in "\n".join(d.logs)
    d.finish()  # yet another machine: the journal says epoch 5 is in (nothing twice)
    opts = table_options(d)
    ids = sorted(int(r["id"]) for r in delta_rows(opts))
    assert ids == list(range(d.batches * ROWS))
    check_commits_at_target(epochs_in_history(opts, d.sink_id), expected_epochs(d))  # type: ignore[arg-type]
    assert leftover_files(opts) == []
    assert "SinkIdentityError" not in "\n".join(d.logs)


def test_random_kills(zygote: Zygote, tmp_path: Path) -> None:
    """The change stream killed at random instants, again and again, then let finish."""
    _random_kills(
        lambda name: delta(zygote, tmp_path / name, batches=10, cdc=True),
        random.Random("20261201-delta-cdc"),
        check,
    )


def test_a_vacuumed_pending_epoch_is_abandoned_as_the_runbook_says(
    zygote: Zygote, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/delta.md's "When a PENDING epoch cannot be committed", run as written: a stream
    killed with epoch 2 PENDING (checkpointed, not committed), then a full ``VACUUM RETAIN 0
    HOURS`` deletes its staged files. The next run stops, naming the missing files and
    ``eosink abandon``, and commits nothing that points at them; ``eosink status`` shows the
    epoch PENDING with that error; ``eosink abandon --accept-data-loss`` records the loss;
    the run after it goes on. Every other epoch's rows are there once, epoch 2's are not,
    and status shows the known loss."""
    from deltalake import DeltaTable
    from harness import epoch_states
    from test_docs import _exit_status

    d = delta(zygote, tmp_path, batches=5)
    d.kill_at("before_commit@3", sink="delta")  # the third commit: epoch 2
    opts = table_options(d)
    assert 2 in epoch_states(d.metastore, d.sink_id).get("PENDING", [])
    DeltaTable(opts.path).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    assert d.run() not in (0, -9), d.last_log()
    assert re.search(r"epoch 2 cannot be committed: \d+ of its \d+ data files are gone", d.log)
    assert "eosink abandon" in d.log
    assert 2 not in epochs_in_history(opts, d.sink_id)
    base = ["--metastore-url", d.metastore, "--sink-id", d.sink_id]
    capsys.readouterr()
    assert _exit_status(["status", *base]) == 0
    shown = capsys.readouterr().out
    assert "PENDING" in shown and "cannot be committed" in shown, shown
    abandon = ["abandon", *base, "--epoch", "2", "--reason", "vacuumed", "--accept-data-loss"]
    assert _exit_status(abandon) == 0, capsys.readouterr()
    d.finish()
    ids = sorted(int(r["id"]) for r in delta_rows(opts))
    assert ids == [i for i in range(d.batches * ROWS) if i // ROWS != 2]
    assert epochs_in_history(opts, d.sink_id) == [0, 1, 3, 4]
    assert leftover_files(opts) == []
    capsys.readouterr()
    assert _exit_status(["status", *base]) == 0
    assert "KNOWN LOSS" in capsys.readouterr().out
