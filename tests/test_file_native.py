"""The file sink's two writer kinds: Spark's own writers (the native path) and Python writers.

Every format is written by both and read back by Spark, row by row; the per-epoch manifests
give readers whole epochs only, also while an epoch is half published.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import make_input

import eosink
from eosink import BatchResult, ConfigError, SchemaMismatchError, StreamingHandle
from eosink.faults import SimulatedCrash, simulate

FORMATS = {
    "parquet": "zstd",
    "orc": "zlib",
    "json": "gzip",
    "csv": "bzip2",
    "text": "gzip",
}


def _read(spark: Any, out: Path, fmt: str) -> list[tuple[int, str]]:
    if fmt == "text":
        lines = spark.read.text(str(out)).collect()
        return sorted((int(r.value.split("|")[0]), r.value.split("|")[1]) for r in lines)
    reader = spark.read.format(fmt)
    if fmt in ("json", "csv"):
        reader = reader.schema("id long, name string")
    if fmt == "csv":
        reader = reader.option("header", "true").option("escape", '"')
    return sorted((int(r.id), r.name) for r in reader.load(str(out)).collect())


@pytest.mark.parametrize("writer", ["spark", "python"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_on_both_writer_kinds(
    spark: Any, tmp_path: Path, fmt: str, writer: str
) -> None:
    rows = [(i, f'n,"{i}' if i % 7 else f"name {i}") for i in range(500)]
    df = spark.createDataFrame(rows, "id long, name string").repartition(3)
    if fmt == "text":
        df = df.selectExpr("concat(id, '|', name) AS value")
    out = tmp_path / "out"
    r = eosink.run(
        df,
        sink="file",
        path=str(out),
        format=fmt,
        compression=FORMATS[fmt],
        writer=writer,
        epoch=0,
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    assert isinstance(r, BatchResult) and r.rows == 500 and r.figures is not None
    assert r.figures.writer == writer
    assert _read(spark, out, fmt) == rows
    published = [p for p in out.rglob("part-*") if "_eosink_staging" not in p.parts]
    assert len(published) == r.files >= 1
    assert r.figures.bytes == sum(p.stat().st_size for p in published)
    if fmt in ("json", "csv", "text"):  # a compressed text file says so in its name
        suffix = {"gzip": ".gz", "bzip2": ".bz2"}[FORMATS[fmt]]
        assert all(p.name.endswith(suffix) for p in published), published


def test_native_stream_partitioned_with_manifests(spark: Any, tmp_path: Path) -> None:
    """A stream on the native path: every row once, partition directories, one manifest
    per epoch listing exactly that epoch's published files."""
    from eosink_file.plugin import committed_files

    inp = tmp_path / "input"
    expected = make_input(inp, files=3, rows=40)
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )
    out = tmp_path / "out"
    h = eosink.run(
        sdf,
        sink="file",
        path=str(out),
        partition_by=["grp"],
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"availableNow": True},
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    assert isinstance(h, StreamingHandle)
    h.await_termination()
    assert [f.writer for f in h.figures] == ["spark"] * 3
    back = spark.read.parquet(str(out))
    assert sorted(r.id for r in back.select("id").collect()) == expected
    published = sorted(str(p) for p in out.rglob("part-*") if "_eosink_staging" not in p.parts)
    assert all(Path(p).parent.name.startswith("grp=") for p in published)
    assert sorted(committed_files(out)) == published
    manifests = sorted((out / "_eosink" / "commits").rglob("*.json"))
    assert [json.loads(m.read_text())["epoch"] for m in manifests] == [0, 1, 2]
    assert list((out / "_eosink_staging").rglob("*.parquet")) == []


def test_manifest_readers_never_see_half_an_epoch(spark: Any, tmp_path: Path) -> None:
    """The driver dies in the middle of publishing an epoch (``mid_commit``): a directory
    listing sees part of it, the manifests none of it; recovery publishes the rest and the
    manifest."""
    from eosink_file.plugin import committed_files

    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime
    from eosink._write import write_epoch

    out = tmp_path / "out"
    url = f"sqlite:///{tmp_path / 'm.db'}"
    plugin = eosink.get_sink("file")
    opts = plugin.parse_options({"path": str(out)})
    rt = SinkRuntime(plugin, opts, "half", MetaStore(url))
    rt.start()
    w = write_epoch(spark.range(0, 100, 1, 4), rt, 0, None)
    assert w.writer == "spark" and w.rows == 100
    committable, fig = rt.pre_commit(0, w.results, rows=w.rows, write_s=w.seconds, writer=w.writer)
    with simulate("mid_commit") as fired, pytest.raises(SimulatedCrash):
        rt.commit_epoch(0, committable, fig)
    assert fired[0]
    visible = [p for p in out.rglob("part-*") if "_eosink_staging" not in p.parts]
    assert 0 < len(visible) < fig.files  # a listing sees part of the epoch...
    assert committed_files(out) == []  # ...the manifests none of it
    rt.store.close()
    rt2 = SinkRuntime(plugin, opts, "half", MetaStore(url))
    rt2.start()
    rt2.lineage = "recovery-test"
    rt2.recover(first_epoch=1)  # the epoch was checkpointed: recovery finishes its commit
    files = committed_files(out)
    assert len(files) == fig.files
    assert sorted(spark.read.parquet(*files).toPandas()["id"]) == list(range(100))
    rt2.store.close()


def test_writer_option_is_checked(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.range(3)
    with pytest.raises(ConfigError, match="writer='spark' is not possible: Spark ships no Brotli"):
        eosink.run(
            df,
            sink="file",
            path=str(tmp_path / "o"),
            compression="brotli",
            writer="spark",
            epoch=0,
            metastore_url=url,
        )
    # auto takes the Python writers for it, and says why in the figures
    r = eosink.run(
        df, sink="file", path=str(tmp_path / "o"), compression="brotli", epoch=0, metastore_url=url
    )
    assert isinstance(r, BatchResult) and r.figures is not None and r.figures.writer == "python"
    with pytest.raises(SchemaMismatchError, match="format='text' writes one string column"):
        eosink.run(df, sink="file", path=str(tmp_path / "t"), format="text", metastore_url=url)


def test_format_options_reach_spark(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    eosink.run(
        spark.range(5).selectExpr("id", "cast(id as string) AS name"),
        sink="file",
        path=str(out),
        format="csv",
        format_options={"sep": ";"},
        epoch=0,
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    text = "".join(p.read_text() for p in out.rglob("part-*.csv"))
    assert "id;name" in text and "3;3" in text
