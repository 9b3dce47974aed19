"""Temporary files that a crash leaves in Spark's checkpoint are removed before the query starts.

A driver killed while Spark writes its first offset-log entry leaves ``offsets/.0.<uuid>.tmp``
(and its Hadoop checksum ``offsets/..0.<uuid>.tmp.crc``). Spark never removes them, and every
later start of plain Spark fails with ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY`` ("The
checkpoint location .../offsets should be empty on batch 0").
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import make_input, read_ids

import eosink
from eosink._checkpoint import CheckpointDir


def _plant_crash_leftovers(chk: Path, log: str = "offsets", batch: int = 0) -> list[Path]:
    """What a driver killed in the middle of writing ``<log>/<batch>`` leaves behind."""
    d = chk / log
    d.mkdir(parents=True, exist_ok=True)
    u = uuid.uuid4()
    tmp = d / f".{batch}.{u}.tmp"
    tmp.write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":17')  # cut short
    crc = d / f"..{batch}.{u}.tmp.crc"
    crc.write_bytes(b"crc\x00\x00\x00\x02\x00\x00\x00\x00")
    return [tmp, crc]


def _stream(spark: Any, inp: Path) -> Any:
    return (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "eosink" and r.levelno == logging.WARNING and "removed" in r.getMessage()
    ]


def test_run_starts_after_a_crash_during_the_first_offset_write(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inp, out, chk = tmp_path / "input", tmp_path / "out", tmp_path / "chk"
    expected = make_input(inp, files=2, rows=50)
    planted = _plant_crash_leftovers(chk)
    db = tmp_path / "metastore.db"
    with caplog.at_level(logging.WARNING, logger="eosink"):
        h = eosink.run(
            _stream(spark, inp),
            sink="file",
            path=str(out),
            checkpoint_location=str(chk),
            metastore_url=f"sqlite:///{db}",
            trigger={"availableNow": True},
        )
        assert isinstance(h, eosink.StreamingHandle)
        h.await_termination()
    assert read_ids(out) == expected
    assert [p for p in planted if p.exists()] == []
    assert sorted(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit()) == [0, 1]
    msgs = _warnings(caplog)
    assert len(msgs) == 2, msgs
    for p in planted:
        assert any(str(p) in m and "left by a crash while Spark wrote offsets/0" in m for m in msgs)


def test_repair_removes_only_spark_temporary_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chk = tmp_path / "chk"
    u = uuid.uuid4()
    keep = {
        "metadata": '{"id":"q"}',
        ".metadata.crc": "crc",
        "eosink-lineage.json": "{}",
        "offsets/0": "v1\n{}",
        "offsets/.0.crc": "crc",
        "offsets/1": "v1\n{}",
        "commits/0": "v1\n{}",
        "commits/.0.crc": "crc",
        "sources/0/0": "v1\n",
        "state/0/0/1.delta": "x",
        "offsets/.1.tmp": "not Spark's naming: no uuid",
        f"offsets/1.{u}.tmp": "not hidden",
        f"offsets/.1.{u}.tmp.bak": "not a temp file",
        f"offsets/.1.{str(u)[:-1]}.tmp": "not a uuid",
        f"eosink/.metastore.db.{u}": "not Spark's",
    }
    remove = {
        f"offsets/.2.{u}.tmp": "offsets/2",
        f"offsets/..2.{u}.tmp.crc": "offsets/2",
        f"commits/.1.{u}.tmp": "commits/1",
        f"commits/..1.{u}.tmp.crc": "commits/1",
        f".metadata.{u}.tmp": "metadata",
        f"sources/0/.1.{u}.tmp": "sources/0/1",
        f"state/0/0/.2.delta.{u}.TID17.tmp": "state/0/0/2.delta",
        f"state/0/0/..2.delta.{u}.TID17.tmp.crc": "state/0/0/2.delta",
    }
    for rel, body in {**keep, **remove}.items():
        (chk / rel).parent.mkdir(parents=True, exist_ok=True)
        (chk / rel).write_text(body)
    (chk / "offsets" / f".9.{u}.tmp").mkdir()  # a directory is never removed

    ck = CheckpointDir(None, str(chk))
    with caplog.at_level(logging.WARNING, logger="eosink"):
        removed = ck.repair()
    assert sorted(removed) == sorted(str(chk / r) for r in remove)
    for rel, body in keep.items():
        assert (chk / rel).read_text() == body, rel
    assert (chk / "offsets" / f".9.{u}.tmp").is_dir()
    msgs = _warnings(caplog)
    for rel, target in remove.items():
        assert any(
            str(chk / rel) in m and f"left by a crash while Spark wrote {target} " in m
            for m in msgs
        ), rel
    assert ck.last_committed_batch() == 0
    assert ck.repair() == []  # nothing left
    assert CheckpointDir(None, str(tmp_path / "missing")).repair() == []
    assert not (tmp_path / "missing").exists()


def test_repair_never_removes_a_valid_offset_entry(spark: Any, tmp_path: Path) -> None:
    """A finished batch 0 and a crash while writing batch 1: restart keeps offsets/0."""
    inp, out, chk = tmp_path / "input", tmp_path / "out", tmp_path / "chk"
    expected = make_input(tmp_path / "all", files=2, rows=50)
    inp.mkdir()
    url = f"sqlite:///{tmp_path / 'metastore.db'}"

    def run(f: str) -> None:
        (tmp_path / "all" / f).rename(inp / f)
        h = eosink.run(
            _stream(spark, inp),
            sink="file",
            path=str(out),
            checkpoint_location=str(chk),
            metastore_url=url,
            trigger={"availableNow": True},
        )
        assert isinstance(h, eosink.StreamingHandle)
        h.await_termination()

    run("in-000.parquet")
    entry = (chk / "offsets" / "0").read_bytes()
    planted = _plant_crash_leftovers(chk, "offsets", 1)
    run("in-001.parquet")
    assert (chk / "offsets" / "0").read_bytes() == entry
    assert (chk / "offsets" / "1").exists()
    assert [p for p in planted if p.exists()] == []
    assert read_ids(out) == expected


def test_repair_through_the_hadoop_file_system(spark: Any, tmp_path: Path) -> None:
    """Non-local locations go through Spark's Hadoop FileSystem (here: its local one)."""
    chk = tmp_path / "chk"
    planted = _plant_crash_leftovers(chk, "offsets", 0) + _plant_crash_leftovers(chk, "commits")
    (chk / "offsets" / "1").write_text("v1\n{}")
    ck = CheckpointDir(spark, str(chk))
    jvm = spark.sparkContext._jvm
    ck._local = None  # as for hdfs:// or s3a://
    ck._jpath = jvm.org.apache.hadoop.fs.Path
    ck._fs = ck._jpath(f"file://{chk}").getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    ck.location = f"file://{chk}"
    removed = ck.repair()
    assert sorted(Path(r.removeprefix("file:")) for r in removed) == sorted(
        p for p in planted if not p.name.endswith(".crc")
    )
    assert [p for p in planted if p.exists()] == []  # the .crc went with its file
    assert (chk / "offsets" / "1").exists()
