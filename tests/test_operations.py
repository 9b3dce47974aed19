"""The operator's way out of a stuck sink: ``eosink status`` shows it, ``eosink recover``
finishes a stopped sink without running its job, ``eosink abandon`` gives up the epoch that
can never be published, recorded as a known loss.

The states are real: a batch job's epoch is PENDING (the driver was SIGKILLed after phase 1)
and its staged files are deleted behind eosink's back, so its commit fails for good at every
restart; a Kafka job killed inside a transaction leaves it open, holding back every
``read_committed`` consumer until the job runs again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import Job, epoch_states, make_input, read_ids, read_topic, staged_files
from test_kafka_crash import ROWS, check_topic, kafka_job

from eosink._cli import main as cli

pytestmark = pytest.mark.crash


def _status(capsys: pytest.CaptureFixture[str], url: str, sink_id: str) -> dict:
    capsys.readouterr()
    assert cli(["status", "--metastore-url", url, "--sink-id", sink_id, "--json"]) == 0
    [s] = json.loads(capsys.readouterr().out)
    return s


def test_abandon_a_pending_epoch_whose_staged_data_was_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    job = Job(tmp_path, "batch", url)
    expected = make_input(job.input, files=2, rows=30)
    assert job.run(fault="after_persist") == -9, job.last_log()
    lost = staged_files(job.out)
    assert lost
    for f in lost:
        Path(f).unlink()

    # Every restart fails the same way, and says why.
    assert job.run() != 0
    assert "is missing and" in job.last_log()
    assert f"eosink abandon --sink-id '{job.sink_id}' --epoch 5" in job.last_log()
    s = _status(capsys, url, job.sink_id)
    assert s["pending_epochs"] == [5]
    assert s["pending"][0]["pending_since"] and s["pending"][0]["rows"] == 60
    assert "epoch 5: commit failed for good: SinkError" in s["last_error"]
    assert "is missing" in s["last_error"] and s["last_error_at"]
    assert s["owner_alive"] is False  # the failed run's driver has exited
    capsys.readouterr()
    assert cli(["status", "--metastore-url", url, "--sink-id", job.sink_id]) == 0
    text = capsys.readouterr().out
    assert "epoch 5 PENDING since" in text and "last error (" in text and "not running" in text

    # Without --accept-data-loss nothing changes; an unknown or committed epoch is refused.
    args = ["abandon", "--metastore-url", url, "--sink-id", job.sink_id, "--reason", "staging lost"]
    assert cli([*args, "--epoch", "5"]) == 2
    assert "--accept-data-loss" in capsys.readouterr().err
    assert epoch_states(url, job.sink_id) == {"PENDING": [5]}
    assert cli([*args, "--epoch", "4", "--accept-data-loss"]) == 1
    assert "unknown to this meta store" in capsys.readouterr().err

    assert cli([*args, "--epoch", "5", "--accept-data-loss"]) == 0
    assert "recorded as a known loss" in capsys.readouterr().out
    s = _status(capsys, url, job.sink_id)
    assert s["pending_epochs"] == [] and s["aborted_epochs"] == [5]
    [loss] = s["losses"]
    assert loss["epoch"] == 5 and loss["rows"] == 60 and loss["reason"] == "staging lost"
    assert "(eosink abandon)" in loss["recorded_by"] and not loss["written_again"]

    # The sink runs again: the re-run of the batch job (epoch=5) writes the epoch anew.
    assert job.run() == 0, job.last_log()
    assert read_ids(job.out) == expected
    assert staged_files(job.out) == []
    assert epoch_states(url, job.sink_id) == {"COMMITTED": [5]}
    s = _status(capsys, url, job.sink_id)
    assert s["losses"][0]["written_again"] is True
    capsys.readouterr()
    assert cli(["status", "--metastore-url", url, "--sink-id", job.sink_id]) == 0
    assert "KNOWN LOSS: epoch 5" in capsys.readouterr().out


def test_recover_finishes_a_kafka_sink_whose_job_stays_stopped(
    kafka: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kafka-sink batch job killed with its transaction open (records produced and flushed,
    not committed): nothing is readable with read_committed. ``eosink recover`` with the
    job's options, without Spark, ends the lingering transaction (fencing the transactional
    ids) and commits the PENDING epoch: every record exactly once."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    # One transactional id: with several, another id's thread may commit its first chunk
    # before the SIGKILL at this one's kafka_before_commit lands (CI saw 10 records).
    job, topic = kafka_job(kafka, tmp_path, "batch", url, sink_options={"transactions": 1})
    expected = make_input(job.input, files=2, rows=ROWS)
    job.assert_fired("kafka_before_commit", job.run(fault="kafka_before_commit"))
    assert epoch_states(url, job.sink_id) == {"PENDING": [5]}
    assert read_topic(kafka.bootstrap, topic, "read_committed") == []

    args = ["recover", "--sink", "kafka", "--sink-id", job.sink_id, "--metastore-url", url]
    opts = json.dumps(job.sink_options)
    assert cli([*args, "--sink-id", "kafka:nosuch", "--options-json", opts]) == 1
    assert "has no sink 'kafka:nosuch'" in capsys.readouterr().err
    assert cli([*args, "--options-json", opts]) == 0
    out = capsys.readouterr().out
    assert "committed the PENDING epoch(s) [5]" in out, out
    assert epoch_states(url, job.sink_id) == {"COMMITTED": [5]}
    check_topic(job, expected, aborted=True)
    # Nothing left: a second recover changes nothing; the job's re-run is a no-op.
    assert cli([*args, "--options-json", opts]) == 0
    assert "committed the PENDING epoch(s) none" in capsys.readouterr().out
    assert job.run() == 0, job.last_log()
    assert "skipped=True" in job.last_log()
    check_topic(job, expected, aborted=True)


def test_recover_drops_an_open_file_lost_behind_eosinks_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rolling file sink (local JSON) whose committed epoch's rows wait in an open file
    (a batch job killed after its commit, before its end published the file), and the
    file's in-progress file deleted behind eosink's back: ``eosink recover`` fails naming
    the file and the way out; with ``--drop-lost-open-files``, a reason and consent, it
    drops the file and records its rows as a known loss; the sink then goes on, and nothing
    is left to drop. (No Spark: eosink's own task code writes the epoch.)"""
    import pyarrow as pa

    from eosink._metastore import MetaStore
    from eosink._setup import open_runtime, prepare_sink
    from eosink.testing import drive_writers

    out, url = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    opts = {"path": str(out), "writer": "python", "format": "json", "max_row_count": 1000}
    setup = prepare_sink("file", opts, streaming=False, metastore_url=url)
    rt = open_runtime(setup)
    try:
        ep = rt.batch_epoch(1)
        schema = pa.schema([("id", pa.int64())])
        batch = pa.record_batch([pa.array([1, 2, 3])], schema=schema)
        results = drive_writers(rt.plugin, rt.options, rt.sink_id, 1, [[batch]], ep.setup(schema))
        ep.prepare(results, 3, 0.0)
        ep.commit()  # COMMITTED, its rows in an open file: the run dies before its end
    finally:
        rt.close()
        rt.store.close()
    [inprogress] = (out / "_eosink_staging").rglob("slots/*.jsonl")
    inprogress.unlink()
    args = ["recover", "--sink", "file", "--metastore-url", url, "--options-json", json.dumps(opts)]
    capsys.readouterr()
    assert cli(args) == 1  # named, with the way out (it was a bare FileNotFoundError)
    err = capsys.readouterr().err
    assert "the open file part-" in err and "cannot be published" in err, err
    assert "eosink recover --drop-lost-open-files" in err, err
    drop = [*args, "--drop-lost-open-files", "--reason", "cleanup job", "--accept-data-loss"]
    assert cli(drop) == 0
    text = capsys.readouterr().out
    assert "dropped the open file" in text and "recorded as a known loss" in text, text
    store = MetaStore(url)
    try:
        [loss] = store.losses(setup.sink_id)
    finally:
        store.close()
    assert loss.origin == "dropped-open-file" and loss.rows == 3 and "cleanup job" in loss.reason
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) == []
    assert cli(drop) == 0
    assert "no open file has lost data: nothing dropped" in capsys.readouterr().out
    assert cli(args) == 0
