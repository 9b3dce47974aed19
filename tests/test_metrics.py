"""eosink's metrics as an operator reads them: scraped from a real Prometheus endpoint and
parsed by Prometheus' own text parser (prometheus_client's).

* In the driver (``eosink.metrics.serve_prometheus``): a real stream's committed epochs, their
  rows, commit durations and visibility lags.
* Outside it (``eosink metrics serve``, a process of its own): after a real SIGKILL of the
  driver with an epoch PENDING, the PENDING count is 1 and the oldest PENDING's age rises with
  the heartbeat's; after the recovery run it falls to 0 and the commits are counted.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harness import (
    Job,
    driver_killed_with_two_pending,
    make_input,
    micro_batches,
    read_ids,
    scrape,
    value,
)

import eosink

pytestmark = pytest.mark.crash


def test_a_streams_figures_on_the_drivers_endpoint(
    spark: Any, metrics_endpoint: int, tmp_path: Path
) -> None:
    inp, out, chk = tmp_path / "input", tmp_path / "out", tmp_path / "chk"
    expected = make_input(inp, files=3, rows=40)
    stream = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )
    h = eosink.run(
        stream,
        sink="file",
        path=str(out),
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    h.await_termination()
    assert read_ids(out) == expected
    # Spark's own progress of each micro-batch has its rows (observed metrics "eosink").
    progress = [observed for rows, observed in micro_batches(h.query) if rows]
    assert [int(p["eosink"]["rows"]) for p in progress] == [40, 40, 40], progress
    sid = f"file:{out.resolve()}"
    got = scrape(metrics_endpoint)
    me = {"sink_id": sid, "sink_kind": "file"}
    assert value(got, "eosink_epochs_total", epoch_outcome="committed", **me) == 3
    assert value(got, "eosink_epoch_rows_count", **me) == 3
    assert value(got, "eosink_epoch_rows_sum", **me) == 120
    assert value(got, "eosink_epoch_size_bytes_sum", **me) == sum(f.bytes for f in h.figures)
    assert value(got, "eosink_commit_duration_seconds_count", **me) == 3
    duration = value(got, "eosink_commit_duration_seconds_sum", **me)
    assert duration == pytest.approx(sum(f.commit_ms for f in h.figures) / 1000)
    lag = value(got, "eosink_visibility_lag_seconds_sum", **me)
    assert lag == pytest.approx(sum(f.visibility_lag_s for f in h.figures))
    assert value(got, "eosink_visibility_lag_seconds_bucket", le="+Inf", **me) == 3
    assert value(got, "eosink_commit_retries_total", **me) is None  # nothing retried
    # The stream ended: its state is no longer this driver's to report.
    assert value(got, "eosink_epochs_pending", **me) is None


def test_a_query_observing_its_own_eosink_metric_keeps_it(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark refuses two observations of one name: a query that observes ``eosink`` itself
    runs and keeps its own figure; eosink adds none and logs why."""
    from pyspark.sql import functions as F

    inp, out = tmp_path / "input", tmp_path / "out"
    expected = make_input(inp, files=1, rows=40)
    stream = (
        spark.readStream.schema("id long, grp string, payload string")
        .parquet(str(inp))
        .observe("eosink", F.max("id").alias("largest"))
    )
    with caplog.at_level("INFO", logger="eosink"):
        h = eosink.run(
            stream,
            sink="file",
            path=str(out),
            checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True},
            metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
        )
        h.await_termination()
    assert read_ids(out) == expected
    [p] = [observed for rows, observed in micro_batches(h.query) if rows]
    assert {k: int(v) for k, v in p["eosink"].items()} == {"largest": 39}
    assert "not added to Spark's progress" in caplog.text


def _serve(url: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``eosink metrics serve`` on a free port, reading the store every 0.2 s."""
    argv = ["metrics", "serve", "--metastore-url", url, "--port", "0", "--addr", "127.0.0.1"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eosink._cli", *argv, "--every", "0.2"],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", log.read_text())
        if m:
            return proc, int(m.group(1))
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"eosink metrics serve did not start: {log.read_text()}")


def test_metrics_serve_sees_a_dead_drivers_pending_epoch_and_its_recovery(tmp_path: Path) -> None:
    job = Job(tmp_path, "stream", f"sqlite:///{tmp_path / 'm.db'}")
    expected = make_input(job.input, files=3)
    code = job.run(fault="after_persist@2")  # epoch 1 PENDING, the driver killed
    job.assert_fired("after_persist@2", code)
    proc, port = _serve(job.metastore, tmp_path / "serve.log")
    try:
        me = {"sink_id": job.sink_id, "sink_kind": "file"}
        first = scrape(port)
        assert value(first, "eosink_epochs_pending", **me) == 1
        age0 = value(first, "eosink_epochs_pending_oldest_age_seconds", **me)
        beat0 = value(first, "eosink_heartbeat_age_seconds", **me)
        assert age0 is not None and age0 > 0 and beat0 is not None
        time.sleep(1.0)
        later = scrape(port)
        age1 = value(later, "eosink_epochs_pending_oldest_age_seconds", **me)
        assert age1 is not None and age1 >= age0 + 0.8, (age0, age1)
        beat1 = value(later, "eosink_heartbeat_age_seconds", **me)
        assert beat1 is not None and beat1 >= beat0 + 0.8, (beat0, beat1)  # nobody beats
        assert value(later, "eosink_epochs_total", epoch_outcome="committed", **me) is None

        assert job.run() == 0, job.last_log()  # recovery commits epoch 1, then the rest
        assert read_ids(job.out) == expected
        time.sleep(0.6)  # the next reads of the store
        after = scrape(port)
        assert value(after, "eosink_epochs_pending", **me) == 0
        assert value(after, "eosink_epochs_pending_oldest_age_seconds", **me) == 0
        committed = value(after, "eosink_epochs_total", epoch_outcome="committed", **me)
        assert committed is not None and committed >= 2, committed  # epoch 1 and the rest
        last = value(after, "eosink_last_commit_age_seconds", **me)
        assert last is not None and last < 30, last
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()


def test_an_epoch_aborted_by_recovery_is_counted(tmp_path: Path, metrics_endpoint: int) -> None:
    """A coordinator persists epoch 1 and crashes before Spark's checkpoint (in-process:
    ``simulate``); the next one's recovery aborts it (rule 2): the driver's endpoint counts
    one ``aborted`` epoch beside the committed one, and no PENDING epoch is left."""
    import pyarrow as pa

    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime
    from eosink.faults import SimulatedCrash, simulate
    from eosink.registry import get_sink
    from eosink.testing import drive_writers

    plugin = get_sink("file")
    options = plugin.parse_options({"path": str(tmp_path / "out"), "format": "parquet"})
    sid, url = "file:aborted-metrics", f"sqlite:///{tmp_path / 'm.db'}"
    schema = pa.schema([("id", pa.int64())])

    def runtime() -> SinkRuntime:
        rt = SinkRuntime(plugin, options, sid, MetaStore(url))
        rt.start()
        rt.lineage = "0123456789abcdef"
        return rt

    def write(rt: SinkRuntime, epoch: int) -> None:
        batch = pa.record_batch([pa.array(range(epoch * 10, epoch * 10 + 10))], schema)
        setup = rt.coordinator.writer_setup(schema)
        results = drive_writers(plugin, options, sid, epoch, [[batch]], setup)
        c, fig = rt.pre_commit(epoch, results, rows=10, write_s=0.0)
        rt.commit_epoch(epoch, c, fig)

    rt = runtime()
    write(rt, 0)
    with simulate("before_commit", 1), pytest.raises(SimulatedCrash):
        write(rt, 1)  # epoch 1 PENDING; Spark never checkpointed it
    rt.close()
    rt.store.close()
    rt = runtime()
    rt.recover(first_epoch=1)  # epoch 1 is replayed: its PENDING row is aborted
    rt.close()
    rt.store.close()
    got = scrape(metrics_endpoint)
    me = {"sink_id": sid, "sink_kind": "file"}
    assert value(got, "eosink_epochs_total", epoch_outcome="aborted", **me) == 1
    assert value(got, "eosink_epochs_total", epoch_outcome="committed", **me) == 1


def test_metrics_serve_counts_an_abandoned_epoch(tmp_path: Path) -> None:
    """A driver killed with epochs 8 and 9 PENDING; ``eosink abandon`` gives up epoch 8:
    ``eosink metrics serve`` counts it as ``abandoned``, and epoch 9 as the one PENDING."""
    url, sid = f"sqlite:///{tmp_path / 'm.db'}", "file:abandoned-metrics"
    driver_killed_with_two_pending(url, tmp_path / "out", sid)
    proc, port = _serve(url, tmp_path / "serve.log")
    try:
        me = {"sink_id": sid, "sink_kind": "file"}
        assert value(scrape(port), "eosink_epochs_pending", **me) == 2
        subprocess.run(
            [sys.executable, "-m", "eosink._cli", "abandon", "--metastore-url", url,
             "--sink-id", sid, "--epoch", "8", "--reason", "test", "--accept-data-loss"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        time.sleep(0.6)  # the next reads of the store
        got = scrape(port)
        assert value(got, "eosink_epochs_total", epoch_outcome="abandoned", **me) == 1
        assert value(got, "eosink_epochs_pending", **me) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
