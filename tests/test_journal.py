"""The journal in the checkpoint (eosink/_journal.py), on a local disk and through Spark's
Hadoop FileSystem (the layer HDFS, S3A, ABFS and GCS checkpoints go through; here Hadoop's
local file system behind ``file://`` URIs): generations claimed atomically fence older
drivers, entries round-trip, the newest generation's entry of an epoch wins (and deletes the
older ones), torn files are ignored, committed epochs' entries are forgotten."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eosink import ConfigError, FencedError
from eosink._checkpoint import CheckpointDir
from eosink._journal import Entry, Journal


def _entry(epoch: int, generation: int, payload: bytes = b"c") -> Entry:
    return Entry(epoch, generation, payload, 1, 10, 1, 100, 1.5, 0.1, "lineage-a")


def _exercise(ckpt: CheckpointDir, other: CheckpointDir) -> None:
    """``ckpt`` and ``other`` are two drivers' views of one checkpoint."""
    a = Journal(ckpt, "file:/out")
    assert a.state() is None and a.entries() == {}
    assert a.claim("lineage-a", 0) == 1
    a.assert_live()
    a.record(_entry(0, 1))
    a.record(_entry(1, 1, b"old"))
    b = Journal(other, "file:/out")
    assert b.claim("lineage-a", 0) == 2  # the next number: atomic create, never shared
    with pytest.raises(FencedError, match="checkpoint generation 1"):
        a.assert_live()
    b.assert_live()
    b.record(_entry(1, 2, b"new"))
    got = b.entries()
    assert sorted(got) == [0, 1]
    assert got[1].committable == b"new" and got[1].generation == 2  # newest generation wins
    assert got[0] == _entry(0, 1)
    # The superseded entry of epoch 1 is gone (generation 1 died before Spark checkpointed
    # epoch 1, its staging was discarded); a zombie's late record never deletes a newer one.
    pending = f"{b.dir}/pending"
    assert sorted(ckpt.list_names(pending)) == [f"{0:012d}.1.json", f"{1:012d}.2.json"]
    a.record(_entry(1, 1, b"zombie"))
    assert b.entries()[1].committable == b"new"
    assert f"{1:012d}.2.json" in ckpt.list_names(pending)
    assert b.state() == {**(b.state() or {}), "lineage": "lineage-a", "generation": 2}
    # Another sink's journal in the same checkpoint is its own.
    assert Journal(ckpt, "file:/elsewhere").entries() == {}
    b.forget_before(1)
    assert sorted(b.entries()) == [1]
    # Exclusive create: a generation file that exists is never overwritten.
    assert not ckpt.write_bytes(f"{b.dir}/generations/{2:012d}.json", b"{}", exclusive=True)
    # Old generations are pruned, a zombie still sees the newer one.
    for _ in range(4):
        b.claim("lineage-a", 0)
    with pytest.raises(FencedError):
        a.assert_live()
    assert len(ckpt.list_names(f"{b.dir}/generations")) == 3


def test_journal_on_a_local_checkpoint(tmp_path: Path) -> None:
    loc = str(tmp_path / "chk")
    _exercise(CheckpointDir(None, loc), CheckpointDir(None, f"file://{loc}"))


def test_journal_through_hadoop_filesystem(spark: Any, tmp_path: Path) -> None:
    loc = f"file://{tmp_path / 'chk'}"
    _exercise(
        CheckpointDir(spark, loc, via_hadoop=True), CheckpointDir(spark, loc, via_hadoop=True)
    )
    # What Hadoop wrote, a plain reader sees.
    assert (tmp_path / "chk" / "eosink").is_dir()


def test_torn_entries_are_ignored(tmp_path: Path) -> None:
    """A crash while an entry (or a generation) was written leaves a file that does not
    parse: its epoch was never persisted, so it is skipped, with a warning."""
    ckpt = CheckpointDir(None, str(tmp_path / "chk"))
    j = Journal(ckpt, "s")
    j.claim("l", 0)
    j.record(_entry(3, 1))
    ckpt.write_bytes(f"{j.dir}/pending/{4:012d}.1.json", b'{"epoch": 4, "comm')
    ckpt.write_bytes(f"{j.dir}/generations/{2:012d}.json", b"{")
    assert sorted(j.entries()) == [3]
    assert (j.state() or {})["generation"] == 1  # the newest generation that reads whole


def test_a_new_entry_is_created_in_place_and_a_second_record_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Locally a driver's first entry of an epoch is created under its final name (one sync
    less than a rename: the protocol's cost per epoch); its second record of the epoch (a
    micro-batch run again by the same driver) replaces it atomically."""
    import eosink._checkpoint as checkpoint

    ckpt = CheckpointDir(None, str(tmp_path / "chk"))
    j = Journal(ckpt, "s")
    j.claim("l", 0)

    def no_rename(*_: Any) -> None:
        raise AssertionError("a new entry went through a rename")

    with monkeypatch.context() as m:
        m.setattr(checkpoint.os, "replace", no_rename)
        j.record(_entry(5, 1, b"first"))
    assert j.entries()[5].committable == b"first"
    j.record(_entry(5, 1, b"second"))
    assert j.entries()[5].committable == b"second"
    assert ckpt.list_names(f"{j.dir}/pending") == [f"{5:012d}.1.json"]


def test_checkpoint_location_is_qualified_as_spark_does(spark: Any, tmp_path: Path) -> None:
    """A checkpoint path without a scheme is where Spark puts it: on the cluster's default
    file system (HDFS on YARN), not necessarily on the driver's disk; ``file:/x`` is ``/x``."""
    assert CheckpointDir(spark, f"file:{tmp_path}/a").location == f"{tmp_path}/a"
    assert CheckpointDir(None, f"file:{tmp_path}/a").location == f"file:{tmp_path}/a"
    assert CheckpointDir(None, f"file:{tmp_path}/a")._local == tmp_path / "a"
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    before = conf.get("fs.defaultFS")
    conf.set("fs.defaultFS", "hdfs://127.0.0.1:9")  # nothing listens: qualifying only
    try:
        ckpt = CheckpointDir(spark, "/chk/orders")
        assert ckpt.location == "hdfs://127.0.0.1:9/chk/orders"
        assert ckpt._local is None  # the journal goes through Hadoop, beside Spark's files
    finally:
        conf.set("fs.defaultFS", before)
    with pytest.raises(ConfigError, match="Spark cannot reach it"):
        CheckpointDir(spark, "nosuchscheme://bucket/chk")
    with pytest.raises(ConfigError, match="need a local one"):
        CheckpointDir(None, "dbfs:/chk")


@pytest.mark.parametrize("failing", ["checkpoint", "target"])
def test_an_entry_that_cannot_be_written_fails_the_epoch_before_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A stream of the file sink records each epoch's entry in two journals, its
    checkpoint's and the target's, written side by side: either write failing (an I/O
    error injected into that journal's file layer) fails the epoch's phase 1 with that
    error, and the epoch is not PENDING (nothing the checkpoint could record as done)."""
    import pyarrow as pa

    import eosink
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime

    plugin = eosink.get_sink("file")
    opts = plugin.parse_options({"path": str(tmp_path / "out")})
    store = MetaStore(f"sqlite:///{tmp_path / 'meta.db'}")
    sid = f"file:{tmp_path / 'out'}"
    rt = SinkRuntime(plugin, opts, sid, store)
    try:
        rt.start()
        rt.lineage = "lineage-a"
        rt.journal = Journal(CheckpointDir(None, str(tmp_path / "ckpt")), sid)
        rt.journal.claim(rt.lineage, 0)
        target = rt.target_journal()
        assert target is not None  # the file sink keeps one beside its target
        broken = rt.journal if failing == "checkpoint" else target

        def disk_full(rel: str, data: bytes, **_: Any) -> bool:
            raise OSError(28, f"No space left on device: {rel}")

        monkeypatch.setattr(broken.ckpt, "write_bytes", disk_full)
        ep = rt.stream_epoch(0)
        ep.setup(pa.schema([("id", pa.int64())]))
        with pytest.raises(OSError, match="No space left on device"):
            ep.prepare([], 0, 0.0)
        assert store.epoch(sid, 0) is None
    finally:
        rt.close()
        store.close()
