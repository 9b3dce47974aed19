"""Crash matrix of the file sink's rolling files (files that span epochs), local and on S3.

Each case runs tests/crashjob.py with rolling options (``max_row_count`` / ``max_file_bytes``)
so that slots collect the pieces of several epochs, kills the driver with SIGKILL at each
fault point of the chain in turn (each restart armed with the next point, after recovering
from the previous crash), then runs it until it exits 0. An independent reader (plain
filesystem calls or boto3, the format's own decoder) then checks what a user would:

* every input row exactly once, id by id, with its own payload and partition;
* every visible file a complete, valid file of the format, with the rolled files' names;
* at least one file holds the rows of several micro-batches (the files did roll across epochs);
* every visible file named by a committed epoch's manifest with its size, nothing else
  beside them but eosink's own ``_eosink/`` records: no staged piece left under
  ``_eosink_staging/``, no orphan object, and on S3 no multipart upload left open;
* every epoch COMMITTED in the meta store.

Where the points fire (plugins/eosink_file/_rolling.py): ``roll_after_part`` when a JSON
epoch is appended to a local in-progress file or uploaded as an S3 part (S3 parts are
>= 5 MiB: those cases write padded rows, about 5.5 MiB per micro-batch); ``roll_mid_merge``
while Parquet pieces are merged; the publish and drop points when an epoch's commit or the
final roll (end of the batch run, end of an availableNow stream) publishes rolled files.
Local streams of Parquet take the native path (Spark's writers stage the pieces); S3 and
JSON cases the Python writers.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from harness import (
    GROUPS,
    Job,
    Output,
    crash_chain,
    epoch_states,
    expected_epochs,
    make_input,
    payload,
    read_output_rows,
    run_with_random_kills,
)

pytestmark = pytest.mark.crash

MiB = 1024 * 1024
ROWS = 300  # rows per input file (one micro-batch each) of the small cases
# S3 JSON cases: rows of ~1 KiB, ~5.5 MiB per micro-batch: each epoch uploads one part.
BIG_ROWS, BIG_PAD = 5500, 1000
ROLLED_NAME = re.compile(r"^part-\d{10}-s[0-9a-f]{8}\.[a-z.]+$")


def _case(
    storage: str,
    mode: str,
    fmt: str,
    faults: list[str],
    partitioned: bool = False,
    big: bool = False,
    **rolling: Any,
) -> Any:
    return pytest.param(
        storage,
        mode,
        fmt,
        faults,
        partitioned,
        big,
        rolling,
        id=f"{storage}-{mode}-{fmt}-{'+'.join(faults)}",
    )


# Streams roll every second micro-batch of a slot (max_row_count: two input files' rows,
# per group when partitioned; max_file_bytes: two padded micro-batches); what a slot holds
# at the end of the run rolls when the availableNow stream ends. Batch jobs (one epoch, 5)
# roll at the batch run's end.
CASES = [
    # (Local JSON, the Python writers, each epoch appended to its slot's in-progress file,
    # killed at roll_after_part@2, after_persist@2, roll_before_publish, roll_after_publish:
    # tests/test_lifecycle_kills.py, the stream's lifecycle without Spark, with random kills;
    # it caught the broken variant this case caught, a publish that leaves its staged file.)
    # Local Parquet through Spark's writers: pieces merged when the slot rolls, killed
    # inside the merge and once the slot is published and stored, before its pieces are
    # dropped (the restart's sweep of the local staging deletes them). (Killed after the
    # drop: the format("eosink") batch case below, and tests/test_lifecycle_kills.py.)
    _case(
        "local",
        "stream",
        "parquet",
        ["roll_mid_merge", "roll_before_drop"],
        max_row_count=2 * ROWS,
    ),
    # eosink.run's batch (epoch 5): Spark's writers' Parquet pieces of 3 tasks merged into
    # one file per partition at the run's end, killed inside that merge; the re-run finds
    # the epoch committed and rolls its slots. (An ORC batch and a JSON batch killed in
    # its rolls: tests/test_lifecycle_kills.py, eosink._batch.run_batch without Spark.)
    _case("local", "batch", "parquet", ["roll_mid_merge"], partitioned=True, max_row_count=10**9),
    # (S3 streams, Python writers: a JSON chain, each epoch's ~5.5 MiB uploaded as a part of
    # its slot's multipart upload, and a Parquet chain, pieces merged and uploaded when the
    # slot rolls: tests/test_lifecycle_kills.py, which caught what the JSON case caught, a
    # publish that completes an upload with its first part only, and what neither case here
    # caught, a start that leaves uploads no state references open.)
    # format("eosink") (Python writers; the whole driver killed where the point fires, in
    # Spark's data source worker): a stream whose slot rolls in the commit of every second
    # micro-batch (this front end has no end-of-run roll: 4 micro-batches), and a batch
    # whose slots roll at its end (killed once they are published and their pieces dropped,
    # the slots' state not stored: the restart finds them published).
    _case("local", "ds-stream", "json", ["roll_before_publish"], max_row_count=2 * ROWS),
    _case("local", "ds-batch", "json", ["roll_after_drop"], partitioned=True, max_row_count=10**9),
]


def _job(
    tmp_path: Path,
    storage: str,
    mode: str,
    fmt: str,
    s3_location: Any,
    partitioned: bool,
    options: dict[str, Any],
    **extra: str,
) -> Job:
    sink_options = dict(options)
    if storage == "s3":
        sink_options.update(s3_location())
    if partitioned:
        extra["partition_by"] = "grp"
    return Job(
        tmp_path,
        mode,
        f"sqlite:///{tmp_path / 'metastore.db'}",
        sink_options=sink_options,
        format=fmt,
        **extra,
    )


def check_output(
    job: Job, expected: list[int], fmt: str, rows_per_input: int, pad: int = 0
) -> list[dict[str, Any]]:
    """What a user checks after the job exited 0 (see the module's docstring)."""
    out: Output = job.output()
    rows = read_output_rows(out, fmt)
    got = sorted(int(r["id"]) for r in rows)
    dups = sorted(i for i, n in Counter(got).items() if n > 1)
    assert got == expected, (
        f"{len(got)} rows read back, {len(expected)} written; "
        f"missing {sorted(set(expected) - set(got))[:10]}, duplicated {dups[:10]}"
    )
    for r in rows:
        assert r["payload"] == payload(r["id"], pad), (r["_file"], r["id"])
        assert (r["grp"] or "") == GROUPS[r["id"] % len(GROUPS)], (r["_file"], r["id"], r["grp"])
    visible = out.visible()
    assert visible, out
    for rel in visible:
        assert ROLLED_NAME.match(rel.rsplit("/", 1)[-1]), f"not a rolled file's name: {rel}"
    # The files rolled across epochs: some file holds rows of several micro-batches.
    spans: dict[str, set[int]] = {r["_file"]: set() for r in rows}
    for r in rows:
        spans[r["_file"]].add(r["id"] // rows_per_input)
    if job.mode in ("batch", "ds-batch"):
        # The one epoch's pieces (three tasks) became one file per partition directory.
        dirs = Counter(rel.rpartition("/")[0] for rel in visible)
        assert set(dirs.values()) == {1}, sorted(visible)
    else:
        assert max(len(s) for s in spans.values()) >= 2, spans
    # Every visible file is named by exactly one committed manifest, with its size; nothing
    # else lies around.
    named = out.manifest_files()
    mentions = Counter(path for path, _, _ in named)
    twice = [n for n in named if mentions[n[0]] > 1]
    assert twice == [], f"files named by several manifests: {twice[:6]}"
    assert {path: size for path, size, _ in named} == visible
    assert out.staged() == [], out.staged()[:10]
    assert out.open_uploads() == []
    others = sorted(
        rel for rel in out.objects() if rel not in visible and not rel.startswith("_eosink/")
    )
    assert others == [], f"orphans: {others[:10]}"
    if not out.is_s3:
        from eosink_file.plugin import committed_files

        root = Path(out.location)
        assert sorted(committed_files(root)) == sorted(str(root / rel) for rel in visible)
    states = epoch_states(job.metastore, job.sink_id)
    assert set(states) == {"COMMITTED"}, states
    assert sorted(states["COMMITTED"]) == expected_epochs(job), states
    return rows


@pytest.mark.parametrize(
    ("storage", "mode", "fmt", "faults", "partitioned", "big", "rolling"), CASES
)
def test_rolling_crash(
    tmp_path: Path,
    s3_location: Any,
    storage: str,
    mode: str,
    fmt: str,
    faults: list[str],
    partitioned: bool,
    big: bool,
    rolling: dict[str, Any],
) -> None:
    job = _job(tmp_path, storage, mode, fmt, s3_location, partitioned, rolling)
    rows, pad = (BIG_ROWS, BIG_PAD) if big else (ROWS, 0)
    # A chain needs about one micro-batch per run beyond the four a single point needs.
    expected = make_input(job.input, files=3 + len(faults), rows=rows, pad=pad)
    crash_chain(job, faults)
    check_output(job, expected, fmt, rows, pad)


def test_s3_per_epoch_files_crash(tmp_path: Path, s3_location: Any) -> None:
    """The file sink on S3 without rolling options (each epoch's files are multipart uploads
    completed by its commit): the driver dies inside the commit of epoch 1, one upload of
    three completed; the restart's recovery completes the others. Every row once, no upload
    left open, nothing staged, every epoch COMMITTED."""
    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'metastore.db'}",
        sink_options=s3_location(),
        partition_by="grp",
    )
    expected = make_input(job.input, files=3, rows=ROWS)
    crash_chain(job, ["mid_commit@2"])
    out: Output = job.output()
    assert sorted(int(r["id"]) for r in read_output_rows(out, "parquet")) == expected
    assert out.staged() == [] and out.open_uploads() == []
    states = epoch_states(job.metastore, job.sink_id)
    assert set(states) == {"COMMITTED"} and sorted(states["COMMITTED"]) == expected_epochs(job)


@pytest.mark.release
@pytest.mark.parametrize(
    ("storage", "point"), [("local", "task_before_finish"), ("s3", "task_after_finish")]
)
def test_rolling_executor_lost(tmp_path: Path, s3_location: Any, storage: str, point: str) -> None:
    """Python writers (writer="python"): a task's Python worker dies before its writer's
    finish_write (its piece half written), or right after it (the piece is complete, on S3
    uploaded to the staging prefix, and its result never reaches the driver); Spark retries
    the task. Every row once in the rolled files; no piece of a dead attempt is left staged
    or published."""
    job = _job(
        tmp_path,
        storage,
        "stream",
        "json",
        s3_location,
        False,
        {"max_row_count": 2 * ROWS},
        master="local[2,3]",
        writer="python",
    )
    expected = make_input(job.input, files=3)
    job.assert_fired(point, job.run(fault=point))
    check_output(job, expected, "json", ROWS)


def _sink_errors(log: str) -> list[str]:
    """The messages of eosink's SinkErrors (and subclasses) in a driver's log."""
    import eosink.errors

    found = []
    for m in re.finditer(r"\b([A-Z]\w*Error): (.+)", log):
        cls = getattr(eosink.errors, m.group(1), None)
        if isinstance(cls, type) and issubclass(cls, eosink.errors.SinkError):
            found.append(m.group(2))
    return found


@pytest.mark.release
def test_upload_aborted_behind_eosinks_back(tmp_path: Path, s3_location: Any) -> None:
    """The multipart upload of an open slot (committed epochs' parts, not rolled yet) is
    aborted by someone else between two runs (a bucket lifecycle rule for incomplete
    uploads, an operator's cleanup). Its rows are gone from S3: the next run must say so
    with a SinkError naming the file, publish nothing twice, and never finish as if
    nothing happened with rows missing."""
    job = _job(
        tmp_path,
        "s3",
        "stream",
        "json",
        s3_location,
        False,
        # Each ~5.5 MiB micro-batch becomes a part; the slot rolls only at the end.
        {"s3_part_bytes": 5 * MiB, "max_file_bytes": 1024 * MiB},
    )
    expected = make_input(job.input, files=3, rows=BIG_ROWS, pad=BIG_PAD)
    # Epoch 0 is checkpointed with its part uploaded; epoch 1 persisted, the driver dies.
    job.assert_fired("after_persist@2", job.run(fault="after_persist@2"))
    out = job.output()
    aborted = out.abort_uploads()
    assert len(aborted) == 1, aborted
    name = aborted[0]["key"].rsplit("/", 1)[-1]
    assert ROLLED_NAME.match(name), aborted
    code = job.run()
    rows = read_output_rows(out, "json")
    ids = [int(r["id"]) for r in rows]
    assert len(ids) == len(set(ids)), "a row was published twice"
    assert set(ids) <= set(expected)
    assert all(r["payload"] == payload(r["id"], BIG_PAD) for r in rows)
    assert code != 0, "the run ended normally after its open upload was aborted"
    errors = _sink_errors(job.last_log())
    assert errors, f"no SinkError:\n{job.last_log()}"
    assert any(name in e for e in errors), (name, errors)
    # The sink is stuck until an operator drops the lost file (a known loss).
    from eosink._cli import main as cli

    args = ["recover", "--sink", "file", "--sink-id", job.sink_id, "--metastore-url", job.metastore]
    args += ["--options-json", json.dumps({**job.sink_options, "format": "json"})]
    assert cli([*args, "--drop-lost-open-files"]) == 2  # --reason and --accept-data-loss
    assert (
        cli([*args, "--drop-lost-open-files", "--reason", "lifecycle rule", "--accept-data-loss"])
        == 0
    )
    from eosink._metastore import MetaStore

    store = MetaStore(job.metastore)
    try:
        [loss] = store.losses(job.sink_id)
    finally:
        store.close()
    assert loss.origin == "dropped-open-file" and name in loss.reason, loss
    assert "lifecycle rule" in loss.reason and loss.rows > 0
    # The sink goes on: the stream's next run writes what was not checkpointed yet.
    assert job.run() == 0, job.last_log()
    rows = read_output_rows(out, "json")
    ids = [int(r["id"]) for r in rows]
    assert len(ids) == len(set(ids)), "a row was published twice"
    assert set(ids) <= set(expected)
    # What is missing is exactly what the dropped file held, as recorded.
    assert len(ids) + loss.rows == len(expected), (len(ids), loss.rows, len(expected))
    assert out.staged() == [] and out.open_uploads() == []
    assert epoch_states(job.metastore, job.sink_id).keys() == {"COMMITTED"}


@pytest.mark.release
def test_rolling_random_kills(tmp_path: Path) -> None:
    """A rolling JSON stream, partitioned, with the driver killed at random instants
    (inside the protocol and from the driver's start), then let finish: every row once."""
    import random

    rng = random.Random("rolling-random-kills")
    job = _job(tmp_path, "local", "stream", "json", None, True, {"max_row_count": 500})
    expected = make_input(job.input, files=6, rows=ROWS)
    run_with_random_kills(job, rng, window=2.5)
    check_output(job, expected, "json", ROWS)
