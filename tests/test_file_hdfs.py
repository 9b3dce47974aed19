"""The file sink on HDFS: a real MiniDFSCluster (NameNode and DataNode), hdfs:// paths.

The cluster runs in its own JVM (Hadoop's ``hadoop-client-minicluster`` from Maven Central,
fetched once into the jar cache by ``tests/jvm.py``, about 110 MB; started through a py4j
gateway: no Hadoop installation needed). Spark's writers stage each epoch on HDFS; the
driver lists, reads Parquet/ORC footers with their Java readers, publishes by rename and
rewrites the marker with ``FileContext.rename(OVERWRITE)``, all through Spark's Hadoop
FileSystem (``eosink_file._hadoop``). The output is read back independently: the cluster's
own FileSystem copies it to local disk, pyarrow reads it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Job, epoch_states, make_input

import eosink
from eosink import BatchResult

MINICLUSTER = "org.apache.hadoop:hadoop-client-minicluster:3.5.0"


class MiniDFS:
    """A MiniDFSCluster with one DataNode in a JVM of its own, driven over py4j."""

    def __init__(self, base: Path) -> None:
        import pyspark
        from jvm import fetch, free_port, java
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        t0 = time.monotonic()
        jars = fetch([MINICLUSTER])
        py4j_jar = next((Path(pyspark.__file__).parent / "jars").glob("py4j-*.jar"))
        self.log = open(base / "minidfs.log", "w")
        port = launch_gateway(
            classpath=":".join(str(j) for j in jars),
            jarpath=str(py4j_jar),
            java_path=java(),
            die_on_exit=True,
            redirect_stdout=self.log,
            redirect_stderr=self.log,
        )
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
        j = self.gateway.jvm
        conf = j.org.apache.hadoop.conf.Configuration()
        conf.set("hdfs.minidfs.basedir", str(base / "dfs"))
        conf.set("dfs.replication", "1")
        self.cluster = (
            j.org.apache.hadoop.hdfs.MiniDFSCluster.Builder(conf)
            .numDataNodes(1)
            .nameNodePort(free_port())
            .build()
        )
        self.cluster.waitActive()
        self.url = str(self.cluster.getURI().toString()).rstrip("/")
        self.fs = self.cluster.getFileSystem()
        self.started_in = time.monotonic() - t0

    def files(self, rel: str) -> dict[str, int]:
        """Every file under ``<url>/<rel>``: relative path -> size (the cluster's own view)."""
        path = self.gateway.jvm.org.apache.hadoop.fs.Path(f"{self.url}/{rel}")
        if not self.fs.exists(path):
            return {}
        it = self.fs.listFiles(path, True)
        out: dict[str, int] = {}
        while it.hasNext():
            st = it.next()
            full = str(st.getPath().toUri().getPath())
            out[full.split(f"/{rel}/", 1)[1]] = int(st.getLen())
        return out

    def copy_to_local(self, rel: str, dest: Path) -> Path:
        jpath = self.gateway.jvm.org.apache.hadoop.fs.Path
        self.fs.copyToLocalFile(False, jpath(f"{self.url}/{rel}"), jpath(str(dest)), True)
        return dest

    def stop(self) -> None:
        try:
            self.cluster.shutdown()
        finally:
            self.gateway.shutdown()
            self.log.close()


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniDFS]:
    dfs = MiniDFS(tmp_path_factory.mktemp("minidfs"))
    print(f"MiniDFSCluster {dfs.url} started in {dfs.started_in:.1f} s")
    yield dfs
    dfs.stop()


def _visible(files: dict[str, int]) -> list[str]:
    return sorted(f for f in files if not any(x[:1] in "_." for x in f.split("/")))


def _ids(dfs: MiniDFS, rel: str, local: Path, fmt: str = "parquet") -> list[int]:
    """The ids of the visible files of ``rel``, copied out of HDFS, read by pyarrow."""
    import pyarrow.dataset as ds

    dfs.copy_to_local(rel, local)
    files = [str(local / f) for f in _visible(dfs.files(rel))]
    if not files:
        return []
    table = ds.dataset(files, format=fmt).to_table(columns=["id"])
    return sorted(table.column("id").to_pylist())


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_batch_on_hdfs(spark: Any, hdfs: MiniDFS, tmp_path: Path, fmt: str) -> None:
    from eosink_file.plugin import committed_files

    rel = f"out-{fmt}-{tmp_path.name}"
    url = f"{hdfs.url}/{rel}"
    ids = make_input(tmp_path / "in", files=3, rows=200)
    df = spark.read.parquet(str(tmp_path / "in")).repartition(3)
    store = f"sqlite:///{tmp_path / 'm.db'}"
    r = eosink.run(
        df, sink="file", path=url, format=fmt, partition_by="grp", epoch=4, metastore_url=store
    )
    assert isinstance(r, BatchResult) and r.committed and r.rows == 600
    assert r.sink_id == f"file:{url}" and r.figures is not None and r.figures.writer == "spark"
    files = hdfs.files(rel)
    assert [f for f in files if f.startswith("_eosink_staging/")] == []
    visible = _visible(files)
    assert len(visible) == r.files and all(f.split("/")[0].startswith("grp=") for f in visible)
    assert _ids(hdfs, rel, tmp_path / "copy", fmt) == ids
    copied = tmp_path / "copy"  # the whole directory, copied by _ids
    manifest = json.loads(next(copied.joinpath("_eosink", "commits").rglob("4.json")).read_text())
    assert sorted(f["path"] for f in manifest["files"]) == visible
    assert committed_files(url) == [f"{url}/{f}" for f in visible]
    # A second epoch rewrites the marker in place (FileContext rename with OVERWRITE).
    r2 = eosink.run(
        df.limit(10),
        sink="file",
        path=url,
        format=fmt,
        partition_by="grp",  # the layout the path records (_eosink/layout.json)
        epoch=5,
        metastore_url=store,
    )
    assert r2.committed and r2.rows == 10
    marker = next(f for f in hdfs.files(rel) if f.startswith("_eosink/") and f.count("/") == 1)
    assert [f for f in hdfs.files(rel) if f.startswith("_eosink/.")] == []  # no temporary left
    assert marker.endswith(".json")
    again = eosink.run(
        df, sink="file", path=url, format=fmt, partition_by="grp", epoch=4, metastore_url=store
    )
    assert isinstance(again, BatchResult) and again.skipped


def test_stream_and_abort_on_hdfs(spark: Any, hdfs: MiniDFS, tmp_path: Path) -> None:
    """A JSON stream (not read back by the rows check on HDFS), then the coordinator's
    abort and staged_epochs on HDFS."""
    from eosink_file.plugin import FileCoordinator, FileSinkOptions

    rel = f"stream-{tmp_path.name}"
    url = f"{hdfs.url}/{rel}"
    ids = make_input(tmp_path / "in", files=3, rows=100)
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
    )
    h = eosink.run(
        sdf,
        sink="file",
        path=url,
        format="json",
        compression="gzip",
        checkpoint_location=f"{url}-chk",
        trigger={"availableNow": True},
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    h.await_termination()
    assert _ids(hdfs, rel, tmp_path / "copy", "json") == ids
    assert len([f for f in hdfs.files(rel) if f.startswith("_eosink/commits/")]) == 3
    c = FileCoordinator(FileSinkOptions(path=url, format="json"), f"file:{url}")
    c.init()
    c.write_with_spark(spark.range(50), 9, "spark-x", None)
    assert list(c.staged_epochs()) == [9]
    c.abort(9, None)
    assert list(c.staged_epochs()) == []
    assert [f for f in hdfs.files(rel) if f.startswith("_eosink_staging/")] == []


def test_driver_killed_mid_commit_on_hdfs(hdfs: MiniDFS, tmp_path: Path) -> None:
    """SIGKILL after the first rename of a commit on HDFS, restart: every id once."""
    rel = f"crash-{tmp_path.name}"
    url = f"{hdfs.url}/{rel}"
    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'm.db'}",
        sink_options={"path": url},
        partition_by="grp",
    )
    expected = make_input(job.input)
    job.assert_fired("mid_commit@2", job.run(fault="mid_commit@2"))
    assert job.run() == 0, job.last_log()
    assert _ids(hdfs, rel, tmp_path / "copy") == expected
    assert [f for f in hdfs.files(rel) if f.startswith("_eosink_staging/")] == []
    assert set(epoch_states(job.metastore, f"file:{url}")) == {"COMMITTED"}


def test_driver_moves_on_hdfs(hdfs: MiniDFS, tmp_path: Path) -> None:
    """The file sink on HDFS, each driver on a new machine with a meta store of its own
    (empty): killed with epoch 1 PENDING, then inside the commit that the next machine's
    recovery runs (after its first rename on HDFS), then run to the end on a third. Only the
    checkpoint's journal and the sink's marker on HDFS carry the sink from machine to
    machine: every id once, nothing staged left on HDFS."""
    from test_driver_moves import check_states, moving_chain

    rel = f"moves-{tmp_path.name}"
    url = f"{hdfs.url}/{rel}"
    job = Job(
        tmp_path,
        "stream",
        "default",
        sink_options={"path": url, "sink_id": f"file:{url}"},
        partition_by="grp",
    )
    expected = make_input(job.input, files=4, rows=50)  # a micro-batch a file
    moving_chain(job, ["after_persist@2", "mid_commit@1"])
    assert _ids(hdfs, rel, tmp_path / "copy") == expected
    assert [f for f in hdfs.files(rel) if f.startswith("_eosink_staging/")] == []
    assert any(f.startswith("_eosink/") for f in hdfs.files(rel)), "no marker on HDFS"
    check_states(job)
