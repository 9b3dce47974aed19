"""Empty micro-batches, killed around: the file sink, and the sql sink in the release tier.

A stream whose middle micro-batches have no row (a trigger that fires with no new data, a
filter that drops every row) is killed while such an epoch is PENDING and not checkpointed,
then after its commit, before COMMITTED; each restart recovers and the stream finishes.
RisingWave lost a sink this way (risingwavelabs/risingwave#26492: an empty epoch
acknowledged but never persisted deadlocked recovery, silently). Here every epoch Spark ran,
the empty ones included, must end COMMITTED, and the target must hold every row of the
non-empty ones exactly once, read back by the independent readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import (
    Job,
    check_commits_at_target,
    crash_chain,
    epoch_states,
    expected_epochs,
    make_input,
    read_ids,
    staged_files,
)

pytestmark = pytest.mark.crash

ROWS = 40
EMPTY = frozenset({1, 2})  # micro-batches 1 and 2 read files without rows
# Epoch 1 (empty) PENDING, not checkpointed: the driver dies; the restart writes it again
# and dies after committing epoch 2 (empty), before it is COMMITTED.
FAULTS = ["after_persist@2", "after_commit@2"]
# The default sink, and one that records each epoch at the target (the sql sink's epoch
# rows; iceberg's snapshot markers and kafka's control records are recorded the same way,
# by the core's commit of the epoch).
SINKS = ["file", pytest.param("sql", marks=pytest.mark.release)]


def _job(request: pytest.FixtureRequest, tmp_path: Path, sink: str) -> Job:
    metastore = f"sqlite:///{tmp_path / 'metastore.db'}"
    if sink == "kafka":
        from test_kafka_crash import kafka_job

        job, _ = kafka_job(request.getfixturevalue("kafka"), tmp_path, "stream", metastore)
        return job
    if sink == "sql":
        from test_sql_crash import sql_job

        return sql_job(tmp_path, "stream", f"sqlite:///{tmp_path / 'target.sqlite'}")
    return Job(tmp_path, "stream", metastore, sink=sink)


def _check_target(job: Job, sink: str, expected: list[int]) -> None:
    """The target holds ``expected`` exactly once (independent readers), nothing staged."""
    if sink == "file":
        assert read_ids(job.out) == expected
        assert staged_files(job.out) == []
    elif sink == "iceberg":
        from test_iceberg import iceberg_rows, orphan_files

        opts = job.iceberg_options()
        assert sorted(int(r["id"]) for r in iceberg_rows(opts)) == expected
        assert orphan_files(opts) == []
    elif sink == "kafka":
        from test_kafka_crash import check_topic

        check_topic(job, expected)
    else:
        from test_sql_crash import _read

        rows, staged, at_target = _read(str(job.sink_options["url"]))
        assert sorted(r[0] for r in rows) == expected
        assert staged == [], staged
        check_commits_at_target(at_target, expected_epochs(job))


@pytest.mark.parametrize("sink", SINKS)
def test_empty_epochs_killed_around(
    request: pytest.FixtureRequest, tmp_path: Path, sink: str
) -> None:
    job = _job(request, tmp_path, sink)
    expected = make_input(job.input, files=5, rows=ROWS, empty=EMPTY)
    crash_chain(job, FAULTS)
    _check_target(job, sink, expected)
    states: dict[str, Any] = epoch_states(job.metastore_url, job.sink_id)
    epochs = expected_epochs(job)
    assert sorted(states.get("COMMITTED", [])) == epochs, states
    assert set(states) == {"COMMITTED"}, states
    assert {1, 2} <= set(epochs), epochs  # the empty micro-batches ran and were committed
