"""The file sink on Hadoop filesystem URIs, through Spark's own FileSystem on the driver.

``file://`` URIs go through the same layer as ``hdfs://``, ``abfs://``, ``gs://`` or
``s3a://`` (``eosink_file._hadoop``: Hadoop's local filesystem, reached over py4j): Spark's
writers stage each epoch at the URI, and the driver lists, publishes by rename, and writes
the marker and the manifests through Hadoop's ``FileSystem``. Everything is read back
without eosink (pyarrow on the directory), and a driver killed in the middle of a commit
is restarted and finishes the epoch exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import Job, crash_chain, epoch_states, make_input, read_ids, staged_files

import eosink
from eosink import BatchResult, ConfigError, StreamingHandle


def _published(out: Path) -> list[Path]:
    """The files readers see: none under a ``_`` or ``.`` name (eosink's own included)."""
    return sorted(
        p
        for p in out.rglob("*")
        if p.is_file() and not any(x[:1] in "_." for x in p.relative_to(out).parts)
    )


def test_batch_on_a_file_uri_is_the_local_sink_of_that_path(spark: Any, tmp_path: Path) -> None:
    """``file:///x`` is published through Hadoop's FileSystem and names the same sink as
    the local path ``/x`` (default sink_id ``file:/x``, one marker, one epoch sequence)."""
    from eosink_file.plugin import FileCoordinator, FileSinkOptions, committed_files

    ids = make_input(tmp_path / "in", files=3, rows=200)
    out = tmp_path / "out"
    store = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.read.parquet(str(tmp_path / "in")).repartition(3)
    opts = FileSinkOptions(path=f"file://{out}", partition_by=("grp",))
    assert FileCoordinator(opts, "x").hadoop is not None  # the JVM's FileSystem, not os
    r = eosink.run(
        df, sink="file", path=f"file://{out}", partition_by="grp", epoch=3, metastore_url=store
    )
    assert isinstance(r, BatchResult) and r.committed and r.rows == 600
    assert r.sink_id == f"file:{out}" and r.figures is not None and r.figures.writer == "spark"
    assert read_ids(out, partitioned=True) == ids  # pyarrow, on the directory
    assert staged_files(out) == []
    # Hadoop's checksum files stay out of what readers and eosink's readers list.
    assert [p for p in out.rglob("*.crc") if "_eosink_staging" not in p.parts] == []
    files = committed_files(f"file://{out}")
    assert files == committed_files(out) == [str(p) for p in _published(out)]
    manifest = json.loads(next((out / "_eosink" / "commits").rglob("3.json")).read_text())
    assert sorted(f["path"] for f in manifest["files"]) == sorted(
        str(p.relative_to(out)) for p in _published(out)
    )
    # The same sink by its local path, and by Hadoop's spellings of the URI: a re-run of
    # the committed epoch is a no-op.
    for path in (str(out), f"file:{out}", f"file://localhost{out}/"):
        again = eosink.run(
            df, sink="file", path=path, partition_by="grp", epoch=3, metastore_url=store
        )
        assert isinstance(again, BatchResult) and again.skipped and again.sink_id == r.sink_id
    assert read_ids(out, partitioned=True) == ids


def test_stream_on_a_file_uri(spark: Any, tmp_path: Path) -> None:
    from eosink_file.plugin import committed_files

    ids = make_input(tmp_path / "in", files=4, rows=100)
    out = tmp_path / "out"
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
    )
    h = eosink.run(
        sdf,
        sink="file",
        path=f"file://{out}",
        format="json",
        checkpoint_location=f"file://{tmp_path / 'chk'}",
        trigger={"availableNow": True},
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    assert isinstance(h, StreamingHandle)
    h.await_termination()
    figures = [f for f in h.figures if not f.skipped]
    assert [f.rows for f in figures] == [100] * 4 and {f.writer for f in figures} == {"spark"}
    got = sorted(
        json.loads(line)["id"]
        for p in committed_files(f"file://{out}")
        for line in Path(p).read_text().splitlines()
    )
    assert got == ids
    assert len(list((out / "_eosink" / "commits").rglob("*.json"))) == 4
    assert staged_files(out) == []


def test_commit_is_idempotent_and_abort_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    """The coordinator's phases on a Hadoop URI: staged_epochs, a commit repeated after it
    succeeded (a crash before the COMMITTED mark) and after a half-done one, abort."""
    from eosink_file.plugin import FileCoordinator, FileSinkOptions, committed_files

    out = tmp_path / "out"
    opts = FileSinkOptions(path=f"file://{out}", format="orc", partition_by=("k",))
    c = FileCoordinator(opts, f"file:{out}")
    c.init()
    df = spark.range(0, 300, numPartitions=3).selectExpr("id", "CAST(id % 3 AS STRING) AS k")
    results = c.write_with_spark(df, 7, "spark-a", None)
    c.check_spark_write(7, results, 300)
    prepared = c.pre_commit(7, results)
    assert prepared.files == 9 and list(c.staged_epochs()) == [7]
    committable = prepared.committable
    # Half published by a first attempt (its driver died after one rename).
    first = committable["files"][0]
    (out / first["final"]).parent.mkdir(parents=True, exist_ok=True)
    (out / first["staged"]).rename(out / first["final"])
    c.commit(7, committable)
    published = _published(out)
    assert len(published) == 9
    c.commit(7, committable)  # already committed: nothing changes
    assert _published(out) == published
    assert list(c.staged_epochs()) == [] and staged_files(out) == []
    assert len(committed_files(f"file://{out}")) == 9
    assert json.loads((out / "_eosink" / f"{c.key}.json").read_text())["last_epoch"] == 7
    # An epoch that is aborted leaves nothing behind.
    c.write_with_spark(df, 8, "spark-b", None)
    assert list(c.staged_epochs()) == [8]
    c.abort(8, None)
    assert list(c.staged_epochs()) == [] and staged_files(out) == []
    assert _published(out) == published


@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_driver_killed_mid_commit_on_a_file_uri(tmp_path: Path, mode: str) -> None:
    """Through Hadoop's FileSystem (a file:// URI, Spark's writers): a stream's driver is
    SIGKILLed in the middle of publishing (some files renamed, not all); a batch's before
    its epoch is PENDING, then while the restart deletes that epoch's staged files. The last
    restart finishes: every id exactly once (pyarrow reads the directory), nothing staged,
    every epoch COMMITTED."""
    out = tmp_path / "out"
    job = Job(
        tmp_path,
        mode,
        f"sqlite:///{tmp_path / 'm.db'}",
        sink_options={"path": f"file://{out}"},
        partition_by="grp",
        writer="spark",
    )
    expected = make_input(job.input)
    if mode == "stream":
        job.assert_fired("mid_commit@2", job.run(fault="mid_commit@2"))
        assert read_ids(out, partitioned=True) != expected  # the kill left it incomplete
        assert job.run() == 0, job.last_log()
    else:
        crash_chain(job, ["after_pre_commit", "mid_abort"])
    assert read_ids(out, partitioned=True) == expected
    assert staged_files(out) == []
    assert set(epoch_states(job.metastore, f"file:{out}")) == {"COMMITTED"}


def test_hadoop_uris_refuse_what_they_cannot_do(spark: Any, tmp_path: Path) -> None:
    """Refused before anything runs, each saying what to do instead."""
    file_sink = eosink.get_sink("file")
    bad = {
        "writer='python' cannot write": {"path": "hdfs://nn:8020/x", "writer": "python"},
        "rolling options": {"path": "abfss://c@acct.dfs.core.windows.net/x", "max_row_count": 9},
        "names the host": {"path": "file://otherhost/x"},
        "not a filesystem": {"path": "https://example.com/x"},
        "names no bucket": {"path": "s3a:///x"},
    }
    for why, options in bad.items():
        with pytest.raises(ConfigError, match=why):
            file_sink.parse_options(options)
    ok = file_sink.parse_options({"path": "s3a://bucket/x/", "format_options": {"a": "b"}})
    assert ok.path == "s3a://bucket/x" and file_sink.default_sink_id(ok) == "file:s3a://bucket/x"
    # Spark (pyspark's jars) has no FileSystem for gs://: said before any Spark job.
    df = spark.range(3)
    with pytest.raises(ConfigError, match="gcs-connector"):
        eosink.run(
            df,
            sink="file",
            path="gs://bucket/x",
            epoch=0,
            metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
        )
    # format("eosink") runs the Python writers, which do not write hdfs://.
    with pytest.raises(ConfigError, match=r"eosink\.run\(\)"):
        (
            df.write.format("eosink")
            .option("sink", "file")
            .option("path", "hdfs://nn:8020/x")
            .option("metastore_url", f"sqlite:///{tmp_path / 'm2.db'}")
            .mode("append")
            .save()
        )
