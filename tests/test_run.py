"""eosink.run and format("eosink") on a real local Spark session."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import make_input, read_ids, scrape, sinks_registered, staged_files, value

import eosink
from eosink import (
    BatchResult,
    ConfigError,
    FencedError,
    MetaStoreUnavailableError,
    NewCheckpointError,
    SchemaMismatchError,
    SinkError,
    SinkIdentityError,
    StreamingHandle,
    UnknownSinkError,
)


def _ids(spark: Any, path: Path, fmt: str = "parquet") -> list[int]:
    reader = spark.read.format(fmt)
    if fmt != "parquet":
        reader = (
            reader.schema("id long, name string")
            if fmt == "json"
            else reader.option("header", "true")
            .option("escape", '"')
            .schema("id long, name string")
        )
    return sorted(r.id for r in reader.load(str(path)).select("id").collect())


def test_batch_run_is_idempotent_with_explicit_epoch(
    spark, tmp_path: Path, metastore_url: str
) -> None:
    df = spark.range(0, 500).selectExpr("id", "cast(id % 7 as string) as k")
    out = tmp_path / "out"
    r = eosink.run(
        df, sink="file", path=str(out), partition_by=["k"], epoch=3, metastore_url=metastore_url
    )
    assert isinstance(r, BatchResult)
    assert (r.epoch, r.rows, r.committed, r.skipped) == (3, 500, True, False)
    assert r.files >= 7
    again = eosink.run(
        df, sink="file", path=str(out), partition_by=["k"], epoch=3, metastore_url=metastore_url
    )
    assert isinstance(again, BatchResult) and again.skipped and again.rows == 0
    assert read_ids(out, partitioned=True) == list(range(500))
    assert _ids(spark, out) == list(range(500))
    assert staged_files(out) == []


def test_batch_default_epoch_is_next_free(spark, tmp_path: Path, metastore_url: str) -> None:
    out = tmp_path / "out"
    epochs = []
    for i in range(3):
        df = spark.range(i * 10, i * 10 + 10)
        r = eosink.run(df, sink="file", path=str(out), metastore_url=metastore_url)
        assert isinstance(r, BatchResult)
        epochs.append(r.epoch)
    assert epochs == [0, 1, 2]
    assert read_ids(out) == list(range(30))


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_text_formats_read_back_by_spark(spark, tmp_path: Path, fmt: str) -> None:
    df = spark.range(0, 300).selectExpr("id", "concat('n,\"', id) as name")
    out = tmp_path / "out"
    eosink.run(
        df,
        sink="file",
        path=str(out),
        format=fmt,
        epoch=0,
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    assert _ids(spark, out, fmt) == list(range(300))
    names = {
        r.name
        for r in spark.read.format(fmt)
        .option("header", "true")
        .option("escape", '"')
        .schema("id long, name string")
        .load(str(out))
        .collect()
    }
    assert 'n,"7' in names


def _stream_input(tmp_path: Path, files: int = 4) -> tuple[Path, list[int]]:
    inp = tmp_path / "input"
    return inp, make_input(inp, files=files, rows=50)


def _stream(spark, inp: Path) -> Any:  # type: ignore[no-untyped-def]
    return (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )


def test_stream_available_now(spark, tmp_path: Path, metastore_url: str) -> None:
    inp, expected = _stream_input(tmp_path)
    out, chk = tmp_path / "out", tmp_path / "chk"
    h = eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(out),
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        metastore_url=metastore_url,
    )
    assert isinstance(h, StreamingHandle)
    h.await_termination()
    assert read_ids(out) == expected
    assert h.committed_epochs() == [0, 1, 2, 3]
    for f in h.figures:
        assert f.rows == 50 and f.files == 1
        assert 0 < f.visibility_lag_s < 5
        assert f.commit_ms > 0 and f.pre_commit_ms > 0
    from eosink._metastore import MetaStore

    store = MetaStore(metastore_url)
    states = {r.epoch: r.status for r in store.epochs(f"file:{out.resolve()}")}
    store.close()
    assert states == {0: "COMMITTED", 1: "COMMITTED", 2: "COMMITTED", 3: "COMMITTED"}
    # Restarting on the finished checkpoint writes nothing new.
    h2 = eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(out),
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        metastore_url=metastore_url,
    )
    h2.await_termination()
    assert read_ids(out) == expected


def test_stream_keeps_the_newest_figures_only(
    spark, tmp_path: Path, metastore_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's driver keeps the figures of its newest FIGURES_KEPT micro-batches only (a
    stream that runs for months must not grow its memory per epoch); every epoch is still
    committed and in the meta store."""
    import eosink._protocol.phases
    import eosink._stream

    monkeypatch.setattr(eosink._protocol.phases, "FIGURES_KEPT", 2)
    monkeypatch.setattr(eosink._stream, "FIGURES_KEPT", 2)
    inp, expected = _stream_input(tmp_path, files=5)
    out = tmp_path / "out"
    h = eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(out),
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"availableNow": True},
        metastore_url=metastore_url,
    )
    h.await_termination()
    assert read_ids(out) == expected
    assert [f.epoch for f in h.figures] == [3, 4]
    assert h.committed_epochs() == [3, 4]
    live = h._batches.live
    assert live is not None and sorted(live.runtime.figures) == [3, 4]
    from eosink._metastore import MetaStore

    store = MetaStore(metastore_url)
    states = {r.epoch: r.status for r in store.epochs(f"file:{out.resolve()}")}
    store.close()
    assert states == dict.fromkeys(range(5), "COMMITTED")


def test_stream_stop_drains_commits(spark, tmp_path: Path) -> None:
    """A processing-time stream stopped mid-way: every checkpointed epoch is visible."""
    inp, expected = _stream_input(tmp_path, files=3)
    out, chk = tmp_path / "out", tmp_path / "chk"
    h = eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(out),
        checkpoint_location=str(chk),
        trigger={"processingTime": "200 milliseconds"},
    )
    assert isinstance(h, StreamingHandle)
    h.process_all_available()
    h.stop()
    assert not h.is_active
    assert read_ids(out) == expected
    last = max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
    assert h.committed_epochs()[-1] == last


def test_running_stream_records_its_heartbeat(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a stream runs, its coordinator records a heartbeat in the sink's row (every
    30 s; 0.2 s here), which ``eosink status`` shows; stopping the stream clears it."""
    import eosink._protocol.threads as threads
    from eosink._metastore import MetaStore

    monkeypatch.setattr(threads, "HEARTBEAT_SECONDS", 0.2)
    inp, expected = _stream_input(tmp_path, files=2)
    url = f"sqlite:///{tmp_path / 'm.db'}"
    h = eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(tmp_path / "out"),
        checkpoint_location=str(tmp_path / "chk"),
        metastore_url=url,
        trigger={"processingTime": "200 milliseconds"},
    )
    store = MetaStore(url)
    try:
        h.process_all_available()
        [sink] = store.sinks()
        beats = set()
        deadline = time.monotonic() + 30
        while len(beats) < 3 and time.monotonic() < deadline:
            rec = store.sink(sink.sink_id)
            assert rec is not None and rec.heartbeat_at is not None
            beats.add(rec.heartbeat_at)
            time.sleep(0.1)
        assert len(beats) >= 3, beats  # it keeps beating while the query runs
        h.stop()
        rec = store.sink(sink.sink_id)
        assert rec is not None and rec.heartbeat_at is None
    finally:
        store.close()
    assert read_ids(tmp_path / "out") == expected


def test_stream_inline_commit_mode(spark, tmp_path: Path) -> None:
    inp, expected = _stream_input(tmp_path, files=2)
    out = tmp_path / "out"
    h = eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(out),
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"availableNow": True},
        commit_mode="inline",
    )
    h.await_termination()
    assert read_ids(out) == expected


def test_fresh_checkpoint_is_refused_or_continues(
    spark, tmp_path: Path, metastore_url: str
) -> None:
    inp, expected = _stream_input(tmp_path, files=2)
    out = tmp_path / "out"
    common = dict(
        sink="file", path=str(out), trigger={"availableNow": True}, metastore_url=metastore_url
    )
    eosink.run(
        _stream(spark, inp), checkpoint_location=str(tmp_path / "chk1"), **common
    ).await_termination()
    with pytest.raises(NewCheckpointError, match="new_checkpoint='continue'"):
        eosink.run(_stream(spark, inp), checkpoint_location=str(tmp_path / "chk2"), **common)
    assert read_ids(out) == expected  # nothing written by the refused run
    # New input for the new query, on a new epoch range: nothing skipped.
    inp2 = tmp_path / "input2"
    pq.write_table(
        pa.table(
            {
                "id": pa.array(range(1000, 1010), pa.int64()),
                "grp": ["a"] * 10,
                "payload": ["p"] * 10,
            }
        ),
        inp2 / "x.parquet" if inp2.mkdir() is None else None,
    )
    h = eosink.run(
        _stream(spark, inp2),
        checkpoint_location=str(tmp_path / "chk2"),
        new_checkpoint="continue",
        **common,
    )
    h.await_termination()
    assert isinstance(h, StreamingHandle) and h.epoch_base == 2
    assert h.committed_epochs() == [2]
    assert read_ids(out) == expected + list(range(1000, 1010))


def test_bad_input_fails_before_any_job(spark, tmp_path: Path) -> None:
    df = spark.range(5).selectExpr("id", "named_struct('a', id) as s")
    out = tmp_path / "out"
    url = f"sqlite:///{tmp_path / 'm.db'}"
    with pytest.raises(SchemaMismatchError, match="'s'"):
        eosink.run(df, sink="file", path=str(out), format="csv", metastore_url=url)
    with pytest.raises(SchemaMismatchError, match="'nope'"):
        eosink.run(df, sink="file", path=str(out), partition_by=["nope"], metastore_url=url)
    with pytest.raises(ConfigError, match="format"):
        eosink.run(df, sink="file", path=str(out), format="avro", metastore_url=url)
    with pytest.raises(UnknownSinkError, match="installed sinks: delta, file, iceberg, jsonl_dir"):
        eosink.run(df, sink="nope", path=str(out))
    with pytest.raises(ConfigError, match="checkpoint_location is required"):
        eosink.run(
            spark.readStream.format("rate").load(), sink="file", path=str(out), metastore_url=url
        )
    assert not out.exists()
    assert not (tmp_path / "m.db").exists()


def test_metastore_unreachable_publishes_nothing(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(MetaStoreUnavailableError, match="unreachable"):
        eosink.run(
            spark.range(10),
            sink="file",
            path=str(out),
            epoch=0,
            metastore_url="postgresql://postgres@127.0.0.1:1/none",
        )
    assert read_ids(out) == []


@pytest.mark.parametrize("writer", ["spark", "python"])
def test_partition_values_escaped_end_to_end(spark, tmp_path: Path, writer: str) -> None:
    # A NUL, which Spark's writer cannot write, is refused on both paths (test_bad_inputs.py).
    rows = [(1, "a/b"), (2, ".."), (3, "../../x"), (5, None), (6, "ok")]
    df = spark.createDataFrame(rows, "id long, k string")
    out = tmp_path / "out"
    eosink.run(
        df,
        sink="file",
        path=str(out),
        partition_by=["k"],
        epoch=0,
        writer=writer,
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    root = out.resolve()
    assert all(p.resolve().is_relative_to(root) for p in root.rglob("*"))
    # Where unescaped values would land: out/k=../../x is out/x, out/k=a/b is out/k=a/b.
    for landing in (root / "x", root / "k=a", tmp_path / "x", root.parent / "x"):
        assert not landing.exists(), landing
    back = {r.id: r.k for r in spark.read.parquet(str(out)).collect()}
    assert back == dict(rows)


def test_epoch_refused_in_phase_1_leaves_nothing_staged(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink's pre_commit refuses the epoch (as the kafka sink refuses a missing topic; here
    the file sink's, made to raise): the run raises that error, nothing is PENDING, and the
    core deletes what the writers staged at once (not only at the next start); the next run
    writes the epoch."""
    from eosink_file.plugin import FileCoordinator

    df = spark.createDataFrame([(i, "g") for i in range(6)], "id long, grp string")
    out = tmp_path / "out"
    url = f"sqlite:///{tmp_path / 'm.db'}"

    def refuse(self: Any, epoch: int, results: Any) -> Any:
        raise SinkError(f"epoch {epoch}: refused by a check of the sink")

    with monkeypatch.context() as m:
        m.setattr(FileCoordinator, "pre_commit", refuse)
        with pytest.raises(SinkError, match="refused by a check of the sink"):
            eosink.run(df, sink="file", path=str(out), epoch=3, metastore_url=url)
    assert list((out / "_eosink_staging").rglob("*.parquet")) == []
    assert [p for p in out.rglob("*.parquet") if "_eosink_staging" not in p.parts] == []
    r = eosink.run(df, sink="file", path=str(out), epoch=3, metastore_url=url)
    assert r.committed and r.rows == 6 and not r.recovered
    assert read_ids(out) == list(range(6))


def test_failed_write_aborts_after_its_other_tasks_stopped(spark, tmp_path: Path) -> None:
    """One task of an epoch fails while another has not started writing yet (a slow
    partition, a loaded executor): Spark fails the job at once, but the run aborts the epoch
    only when the other task stopped, so what it staged is deleted too, not left under
    _eosink_staging/ (CI saw it with a partition value refused in one task)."""
    import dataclasses

    from eosink.registry import get_sink

    base = get_sink("file")
    make = base.writer_factory

    def writer_factory(options: Any, ctx: Any) -> Any:
        w = make(options, ctx)
        if ctx.partition_id == 0:

            def refuse(batch: Any) -> None:
                raise ValueError("partition 0 refuses its rows")

            w.write_batch = refuse
        else:
            time.sleep(1.0)  # starts writing after partition 0 failed the job
        return w

    slow = dataclasses.replace(base, name="file_late_task", writer_factory=writer_factory)
    out = tmp_path / "out"
    df = spark.range(0, 8, 1, 2)
    with sinks_registered("late-task-provider", slow):
        with pytest.raises(SinkError, match="partition 0 refuses its rows"):
            eosink.run(
                df,
                sink="file_late_task",
                path=str(out),
                writer="python",
                epoch=0,
                metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
            )
        assert staged_files(out) == []
        time.sleep(1.5)  # a task still running would have staged by now
        assert staged_files(out) == []


def test_zombie_coordinator_cannot_commit(spark, tmp_path: Path, metastore_url: str) -> None:
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime
    from eosink._write import write_epoch

    plugin = eosink.get_sink("file")
    out = tmp_path / "out"
    opts = plugin.parse_options({"path": str(out)})
    zombie = SinkRuntime(plugin, opts, "zombie-test", MetaStore(metastore_url))
    zombie.start()
    w = write_epoch(spark.range(20), zombie, 0, None)
    committable, _ = zombie.pre_commit(0, w.results, rows=w.rows, write_s=w.seconds)
    live = SinkRuntime(plugin, opts, "zombie-test", MetaStore(metastore_url))
    live.start()
    with pytest.raises(FencedError):
        zombie.commit_epoch(0, committable)
    assert read_ids(out) == []  # the zombie published nothing
    live.recover(first_epoch=1)  # the new coordinator finishes the checkpointed epoch
    assert read_ids(out) == list(range(20))


def test_datasource_batch_and_stream(spark, tmp_path: Path, metastore_url: str) -> None:
    out = tmp_path / "batch"
    df = spark.range(0, 100).selectExpr("id", "cast(id % 2 as string) as k")
    for _ in range(2):  # the second save of epoch 4 is a no-op
        (
            df.write.format("eosink")
            .option("sink", "file")
            .option("path", str(out))
            .option("partition_by", "k")
            .option("epoch", "4")
            .option("metastore_url", metastore_url)
            .mode("append")
            .save()
        )
    assert read_ids(out, partitioned=True) == list(range(100))
    assert staged_files(out) == []

    inp, expected = _stream_input(tmp_path, files=3)
    sout = tmp_path / "stream"
    q = (
        _stream(spark, inp)
        .writeStream.format("eosink")
        .option("sink", "file")
        .option("path", str(sout))
        .option("metastore_url", metastore_url)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert read_ids(sout) == expected
    assert staged_files(sout) == []


def test_format_stream_counts_as_running_between_micro_batches(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``format("eosink")`` stream's coordinator lives for one micro-batch's commit, in
    Spark's data-source worker; the query runs on. ``eosink status`` says it runs and
    ``abandon`` refuses (exit 2, saying it is a format stream) between its micro-batches and
    for 90 s after its last one, as the heartbeat tells on any host; then it is stopped."""
    import json

    from sqlalchemy import update

    from eosink._cli import main as cli
    from eosink._metastore import HEARTBEAT_STALE_SECONDS, MetaStore
    from eosink._metastore.models import SinkRow

    inp, _ = _stream_input(tmp_path, files=1)
    out, url = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    q = (
        _stream(spark, inp)
        .writeStream.format("eosink")
        .option("sink", "file")
        .option("path", str(out))
        .option("metastore_url", url)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        deadline = time.monotonic() + 300
        while not read_ids(out) and time.monotonic() < deadline:
            assert q.isActive, q.exception()
            time.sleep(0.5)
        time.sleep(2)  # idle micro-batches come and go; the query runs
        assert q.isActive, q.exception()
        capsys.readouterr()
        assert cli(["status", "--metastore-url", url, "--json"]) == 0
        [s] = json.loads(capsys.readouterr().out)
        assert s["owner"].endswith(" (format stream)") and s["owner_alive"] is True, s
        abandon = ["abandon", "--metastore-url", url, "--sink-id", s["sink_id"], "--epoch", "0"]
        abandon += ["--reason", "test", "--accept-data-loss"]
        assert cli(abandon) == 2
        assert 'is a format("eosink") stream that committed a micro-batch' in (
            capsys.readouterr().err
        )
    finally:
        q.stop()
    assert cli(abandon) == 2  # its last heartbeat is fresh: it may still run elsewhere
    store = MetaStore(url)
    try:
        with store._tx() as conn:  # 90 s later
            stale = time.time() - HEARTBEAT_STALE_SECONDS - 1
            conn.execute(update(SinkRow).values(heartbeat_at=stale))
    finally:
        store.close()
    capsys.readouterr()
    assert cli(["status", "--metastore-url", url, "--json"]) == 0
    [s] = json.loads(capsys.readouterr().out)
    assert s["owner_alive"] is False, s
    assert cli(abandon) == 1  # no longer refused as running: epoch 0 is COMMITTED
    assert "only a PENDING epoch" in capsys.readouterr().err


def test_default_metastore_is_shared_by_batch_and_stream(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 3 of issue 7: with defaults, a batch run and a stream on one target share one
    meta store ($EOSINK_HOME), so they share fencing and one epoch sequence."""
    monkeypatch.setenv("EOSINK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EOSINK_METASTORE_URL", raising=False)
    inp, expected = _stream_input(tmp_path, files=1)
    out, chk = tmp_path / "out", tmp_path / "chk"
    t0 = time.time()
    r = eosink.run(spark.range(1000, 1010), sink="file", path=str(out))
    assert isinstance(r, BatchResult) and r.epoch == 0
    eosink.run(
        _stream(spark, inp),
        sink="file",
        path=str(out),
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        new_checkpoint="continue",
    ).await_termination()
    db = tmp_path / "home" / "metastore.db"
    assert db.stat().st_mtime >= t0 - 1
    # The meta store is not in the checkpoint (where pre-release eosink kept it); the checkpoint
    # holds the stream's journal only (its generation and the newest committed epoch's entry).
    assert not (chk / "eosink" / "metastore.db").exists()
    assert len(list(chk.glob("eosink/*/generations/*.json"))) == 1
    assert len(list(chk.glob("eosink/*/pending/*.json"))) == 1
    assert read_ids(out) == sorted(expected + list(range(1000, 1010)))
    from eosink._metastore import MetaStore

    store = MetaStore(f"sqlite:///{db}")
    (sink,) = store.sinks()
    assert sink.generation == 2  # one sink row: the stream's acquire fenced the batch run's
    # The batch run had no epoch= (it got the next free one).
    assert [e.origin for e in store.epochs(sink.sink_id)][:1] == ["batch-auto"]
    store.close()


def test_disk_full_on_staging(spark, tmp_path: Path) -> None:
    """A real 1 MiB tmpfs fills up: clear error, nothing published, nothing left staged,
    and the same epoch succeeds once there is room."""
    import subprocess

    from eosink import SinkError

    out = tmp_path / "tiny"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(out)], check=True)
    try:
        df = spark.range(0, 200_000, numPartitions=2).selectExpr(
            "id", "sha2(cast(id as string), 256) as h"
        )
        url = f"sqlite:///{tmp_path / 'm.db'}"
        with pytest.raises(SinkError, match="No space left on device"):
            eosink.run(df, sink="file", path=str(out), epoch=0, metastore_url=url)
        assert read_ids(out) == []
        assert staged_files(out) == []
        subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)
        r = eosink.run(df, sink="file", path=str(out), epoch=0, metastore_url=url)
        assert isinstance(r, BatchResult) and r.rows == 200_000
        assert read_ids(out) == list(range(200_000))
        assert staged_files(out) == []
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


@pytest.mark.parametrize("conversion", ["installed", "not installed"])
def test_stream_stopped_by_an_eosink_error_raises_it(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conversion: str
) -> None:
    """A stream whose micro-batch raised an eosink error (here: a batch run of the same sink
    took the stream's next epoch meanwhile) raises that error from await_termination, not
    Spark's wrapper (which is its cause); a restart finishes the stream exactly once. The
    same whether or not ``register_datasource`` wrapped pyspark's error conversion in this
    process before (it converts the error itself then)."""
    from pyspark.errors.exceptions import captured

    from eosink._spark_errors import _install_error_conversion

    _install_error_conversion()
    if conversion == "not installed":
        monkeypatch.setattr(captured, "convert_exception", captured.convert_exception.__wrapped__)
    inp, expected = _stream_input(tmp_path, files=2)
    out, chk = tmp_path / "out", tmp_path / "chk"
    url = f"sqlite:///{tmp_path / 'm.db'}"
    common: dict[str, Any] = dict(sink="file", path=str(out), metastore_url=url)
    h = eosink.run(
        _stream(spark, inp),
        checkpoint_location=str(chk),
        trigger={"processingTime": "200 milliseconds"},
        **common,
    )
    assert isinstance(h, StreamingHandle)
    h.process_all_available()
    batch = spark.createDataFrame(
        [(10_000 + i, "b", "x") for i in range(5)], "id long, grp string, payload string"
    )
    eosink.run(batch, **common)  # takes the next free epoch, the stream's next one
    pq.write_table(
        pa.table({"id": [20_000, 20_001], "grp": ["g", "g"], "payload": ["p", "p"]}),
        inp / "late.parquet",
    )
    with pytest.raises(SinkIdentityError) as exc:
        h.await_termination(120)
    assert type(exc.value.__cause__).__name__ == "StreamingQueryException"
    assert (
        "was written by another run (a batch job) while this query was running"
        in str(exc.value).splitlines()[0]
    )
    again = eosink.run(
        _stream(spark, inp), checkpoint_location=str(chk), trigger="availableNow", **common
    )
    assert isinstance(again, StreamingHandle)
    again.await_termination()
    assert read_ids(out) == sorted([*expected, *range(10_000, 10_005), 20_000, 20_001])


_UNREGISTERED = """
import sys
from pyspark.sql import SparkSession

out, meta = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
df = spark.range(20).selectExpr("id", "cast(id % 3 as string) as grp")
(
    df.write.format("eosink").option("sink", "file").option("path", out)
    .option("metastore_url", meta).option("epoch", "1").mode("append").save()
)
spark.stop()
"""


def test_format_eosink_without_registration(tmp_path: Path) -> None:
    """A plain SparkSession (no eosink.spark_session, no register_datasource) writes through
    format("eosink"): Spark's lookup finds pyspark_eosink's DefaultSource, which imports
    nothing of eosink until Spark asks it for a writer; every row once."""
    import os
    import subprocess
    import sys

    out, meta = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    code = _UNREGISTERED
    from jvm import fast_driver_env

    res = subprocess.run(
        [sys.executable, "-c", code, str(out), meta],
        capture_output=True,
        text=True,
        timeout=300,
        env=fast_driver_env(dict(os.environ)),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert read_ids(out) == list(range(20))
    assert staged_files(out) == []


@contextlib.contextmanager
def _file_sink_with(name: str, **methods: Callable[..., Any]) -> Iterator[None]:
    """The file sink registered as ``name``, its coordinator's ``methods`` wrapped: each
    wrapper gets the real method first (``def commit(real, epoch, committable)``)."""
    import dataclasses
    import functools

    from eosink.registry import get_sink

    base = get_sink("file")
    make = base.coordinator_factory

    def coordinator_factory(options: Any, sink_id: str) -> Any:
        coord = make(options, sink_id)
        for method, wrapper in methods.items():
            setattr(coord, method, functools.partial(wrapper, getattr(coord, method)))
        return coord

    wrapped = dataclasses.replace(base, name=name, coordinator_factory=coordinator_factory)
    with sinks_registered(f"{name}-provider", wrapped):
        yield


def test_backpressure_while_the_target_is_down(
    spark, tmp_path: Path, metrics_endpoint: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``max_pending_epochs``: while the target refuses commits (a transient error, retried),
    written epochs wait for their commit; at the limit the next micro-batch waits before it
    writes, instead of staging more; when the target is back, every row lands exactly once.
    The metrics endpoint counts the wait and the retries, by the error's class."""
    from eosink._metastore import MetaStore

    down = tmp_path / "target-down"
    down.touch()

    def commit(real: Any, epoch: int, committable: Any) -> None:
        if down.exists():
            raise ConnectionRefusedError(111, "Connection refused (the target is down)")
        real(epoch, committable)

    inp, out, url = tmp_path / "input", tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    expected = make_input(inp, files=6, rows=10)
    store = MetaStore(url)
    h = None
    try:
        with _file_sink_with("file_down", commit=commit):
            h = eosink.run(
                _stream(spark, inp),
                sink="file_down",
                path=str(out),
                checkpoint_location=str(tmp_path / "chk"),
                metastore_url=url,
                max_pending_epochs=2,
            )
            sid = h.sink_id

            def written() -> list[int]:  # epochs with a row: PENDING, COMMITTED or ABORTED
                return sorted(r.epoch for r in store.epochs(sid))

            deadline = time.monotonic() + 90
            while len(written()) < 2:
                assert time.monotonic() < deadline and h.is_active, written()
                time.sleep(0.1)
            held_until = time.monotonic() + 3.0
            while time.monotonic() < held_until:  # the third micro-batch waits, unwritten
                assert written() == [0, 1], written()
                time.sleep(0.1)
            assert {r.status for r in store.epochs(sid)} == {"PENDING"}
            said = "waits for a commit before writing"
            waits = [r.created for r in caplog.records if said in r.message]
            assert len(waits) == 1, caplog.text  # micro-batch 2 waits, said once
            back_at = time.time()
            down.unlink()  # the target is back
            h.process_all_available()
            unblocked_at = time.time()
            h.stop()
        assert read_ids(out) == expected
        assert h.committed_epochs() == list(range(6))
        assert staged_files(out) == []
        got = scrape(metrics_endpoint)
        me = {"sink_id": sid, "sink_kind": "file_down"}
        waited = value(got, "eosink_backpressure_time_seconds_total", **me)
        # micro-batch 2 waited from the moment it said so until epoch 0 committed, which was
        # not before the target came back nor before the end of the last retry's delay (the
        # wait starts a moment after the hold above began: it cannot be held to the 3 s)
        retried = [
            r.created + float(m.group(1))
            for r in caplog.records
            if (m := re.search(r"commit failed .* retrying in ([0-9.]+)s", r.message))
        ]
        committed_at = max([back_at, *retried])
        assert waited is not None and waited >= committed_at - waits[0] - 0.01, (waited, waits)
        assert waited <= unblocked_at - waits[0], (waited, waits)
        refused = value(
            got, "eosink_commit_retries_total", error_type="ConnectionRefusedError", **me
        )
        assert refused is not None and refused >= 1, refused
        assert value(got, "eosink_epochs_total", epoch_outcome="committed", **me) == 6
    finally:
        if h is not None and h.is_active:
            h.stop()
        store.close()


def _restart_run(spark, tmp_path: Path, name: str, **run: Any) -> Any:  # type: ignore[no-untyped-def]
    return eosink.run(
        _stream(spark, tmp_path / "input"),
        sink=name,
        path=str(tmp_path / "out"),
        checkpoint_location=str(tmp_path / "chk"),
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
        trigger="availableNow",
        **run,
    )


def test_a_stream_restarts_after_a_transient_failure(
    spark, tmp_path: Path, metrics_endpoint: int
) -> None:
    """The target resets the connection once in phase 1 of epoch 1: the query fails; the
    handle the user waits on starts it again from its checkpoint (RestartPolicy), and every
    row lands exactly once. The metrics endpoint counts the restart, with its reason."""
    expected = make_input(tmp_path / "input", files=4, rows=10)
    once = tmp_path / "reset-once"
    once.touch()

    def pre_commit(real: Any, epoch: int, results: Any) -> Any:
        if epoch == 1 and once.exists():
            once.unlink()
            raise ConnectionResetError(104, "the target reset the connection")
        return real(epoch, results)

    with _file_sink_with("file_reset", pre_commit=pre_commit):
        h = _restart_run(spark, tmp_path, "file_reset", restart=eosink.RestartPolicy(delay_s=0.2))
        first = h.query.runId
        assert h.await_termination() is True
    assert h.restarts == 1 and h.query.runId != first
    assert read_ids(tmp_path / "out") == expected
    assert h.committed_epochs() == [0, 1, 2, 3]
    assert staged_files(tmp_path / "out") == []
    got = scrape(metrics_endpoint)
    restarts = [
        (dict(labels), v)
        for (name, labels), v in got.items()
        if name == "eosink_stream_restarts_total" and ("eosink_sink_id", h.sink_id) in labels
    ]
    assert [v for _, v in restarts] == [1.0], restarts
    assert "ConnectionResetError" in restarts[0][0]["eosink_restart_reason"], restarts


@pytest.mark.parametrize("case", ["permanent", "too-often"])
def test_a_stream_is_not_restarted_on_an_error_a_restart_cannot_fix(
    spark, tmp_path: Path, case: str
) -> None:
    """A bug (ValueError) is never retried; a transient error that goes on is retried
    ``max_failures`` times, then raised."""
    make_input(tmp_path / "input", files=2, rows=10)

    def pre_commit(real: Any, epoch: int, results: Any) -> Any:
        if case == "permanent":
            raise ValueError("the pipeline's own bug")
        raise ConnectionResetError(104, "the target reset the connection")

    policy = eosink.RestartPolicy(max_failures=2, delay_s=0.1)
    with _file_sink_with("file_broken", pre_commit=pre_commit):
        h = _restart_run(spark, tmp_path, "file_broken", restart=policy)
        with pytest.raises(Exception, match=r"pipeline's own bug|reset the connection"):
            h.await_termination()
    assert h.restarts == (0 if case == "permanent" else 2)
    assert read_ids(tmp_path / "out") == []


@pytest.mark.parametrize("bad", [0, -1, "2", 2.5, True])
def test_max_pending_epochs_must_be_a_whole_number_from_1(spark, tmp_path: Path, bad: Any) -> None:
    (tmp_path / "input").mkdir()
    with pytest.raises(ConfigError, match="max_pending_epochs must be"):
        eosink.run(
            _stream(spark, tmp_path / "input"),
            sink="file",
            path=str(tmp_path / "out"),
            checkpoint_location=str(tmp_path / "chk"),
            metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
            max_pending_epochs=bad,
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.db").exists()
