"""The iceberg sink against real pyiceberg SQL catalogs (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from eosink.testing import SinkConformance


def iceberg_rows(options: Any) -> list[dict[str, Any]]:
    """The independent reader: a pyiceberg scan of the table."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    cat = load_catalog(options.catalog_name, **options.catalog_properties())
    try:
        table = cat.load_table(options.table)
    except NoSuchTableError:
        return []
    return table.scan().to_arrow().to_pylist()


def orphan_files(options: Any) -> list[str]:
    """Data files under the table location that no snapshot of the table references."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    cat = load_catalog(options.catalog_name, **options.catalog_properties())
    try:
        table = cat.load_table(options.table)
    except NoSuchTableError:
        return []
    from pyarrow import fs as pafs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    # List the location with pyarrow, on the local disk or the S3 server alike.
    scheme, netloc, root = PyArrowFileIO.parse_location(table.location() + "/data")
    filesystem = PyArrowFileIO(options.catalog_properties()).fs_by_scheme(scheme, netloc)
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    present = {
        i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")
    }
    referenced: set[str] = set()
    for snap in table.snapshots():
        for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
            referenced.add(task.file.file_path.split("://", 1)[-1])
    return sorted(present - referenced)


class TestIcebergSqliteConformance(SinkConformance):
    sink_name = "iceberg"

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"table": "db.events", "warehouse": str(tmp_path / "wh")}

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        return iceberg_rows(options)

    def leftovers(self, options: Any) -> list[str]:
        return orphan_files(options)


class TestIcebergS3WarehouseConformance(TestIcebergSqliteConformance):
    @pytest.fixture(autouse=True)
    def _s3(self, s3_endpoint: str) -> None:
        self.endpoint = s3_endpoint

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        from conftest import s3_catalog

        cat = s3_catalog(self.endpoint, f"sqlite:///{tmp_path / 'cat.db'}")
        return {"table": "db.events", "catalog": cat}

    def test_files_are_on_the_s3_server(self, setup: Any) -> None:
        import boto3

        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.commit(0, committable)
        bucket = options.catalog["warehouse"].split("/")[2]
        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        assert any(k.endswith(".parquet") and "/data/" in k for k in keys)
        assert sorted(int(r["id"]) for r in self.read_rows(options)) == list(range(10))


class TestIcebergPostgresCatalogConformance(TestIcebergSqliteConformance):
    @pytest.fixture(autouse=True)
    def _pg(self, pg_url: str) -> None:
        self.pg = pg_url

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "table": f"ns_{uuid.uuid4().hex[:12]}.events",
            "catalog": {"type": "sql", "uri": self.pg, "warehouse": f"file://{tmp_path / 'wh'}"},
        }


# --- on Spark ------------------------------------------------------------------------------
def _opts(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"table": "db.events", "warehouse": str(tmp_path / "wh"), **kw}


def _table(tmp_path: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    import eosink

    o = eosink.get_sink("iceberg").parse_options(_opts(tmp_path))
    return load_catalog(o.catalog_name, **o.catalog_properties()).load_table("db.events")


def test_batch_and_stream_one_snapshot_per_epoch(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from harness import make_input

    import eosink

    url = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.range(0, 300).selectExpr("id", "cast(id % 3 as string) as grp", "'x' as payload")
    r = eosink.run(
        df, sink="iceberg", epoch=0, metastore_url=url, partition_by=["grp"], **_opts(tmp_path)
    )
    again = eosink.run(df, sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path))
    assert r.rows == 300 and again.skipped  # type: ignore[union-attr]
    inp = tmp_path / "in"
    expected = make_input(inp, files=3, rows=20)
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
        .selectExpr("id + 1000 as id", "grp", "payload")
    )
    h = eosink.run(
        sdf,
        sink="iceberg",
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"availableNow": True},
        metastore_url=url,
        new_checkpoint="continue",
        **_opts(tmp_path),
    )
    h.await_termination()  # type: ignore[union-attr]
    table = _table(tmp_path)
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(300)) + [i + 1000 for i in expected]
    summaries = [
        s.summary.additional_properties
        for s in table.snapshots()
        if s.summary and "eosink.epoch" in s.summary.additional_properties
    ]
    assert [s["eosink.epoch"] for s in summaries] == ["0", "1", "2", "3"]
    assert {s["eosink.sink-id"] for s in summaries} == {"iceberg:eosink.db.events"}
    assert [f.name for f in table.spec().fields] == ["grp"]
    assert orphan_files(eosink.get_sink("iceberg").parse_options(_opts(tmp_path))) == []


def test_files_deleted_while_pending_are_refused_not_committed(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An orphan-file cleanup or a lifecycle rule deletes a PENDING epoch's data files (no
    snapshot references them yet): the next run must not commit dangling references. It
    refuses the epoch naming the missing files and ``eosink abandon``, nothing is written;
    the runbook's command records the loss and the run after it goes on, every referenced
    file present (apache/storm#8950's lesson). The release tier's
    ``test_orphan_cleanup_while_pending_is_refused_not_committed`` deletes them with
    Iceberg's own ``remove_orphan_files`` through Spark's runtime, in a stream."""
    from harness import status_json

    import eosink
    from eosink import SinkError
    from eosink._cli import main as cli
    from eosink.faults import SimulatedCrash, simulate

    url = f"sqlite:///{tmp_path / 'm.db'}"
    o = {**_opts(tmp_path), "metastore_url": url, "writer": "python"}
    opts = eosink.get_sink("iceberg").parse_options(_opts(tmp_path))
    first = spark.range(0, 30).selectExpr("id", "'x' as payload")
    with simulate("after_persist"), pytest.raises(SimulatedCrash):
        eosink.run(first, sink="iceberg", epoch=1, **o)
    staged = orphan_files(opts)
    assert staged, "epoch 1's data files should be unreferenced while it is PENDING"
    for f in staged:  # what the cleanup does
        Path(f.removeprefix("file://")).unlink()
    second = spark.range(100, 110).selectExpr("id", "'y' as payload")
    with pytest.raises(SinkError, match=r"epoch 1 cannot be committed.*eosink abandon"):
        eosink.run(second, sink="iceberg", epoch=2, **o)
    assert iceberg_rows(opts) == []
    sid = status_json(url, capsys)["sink_id"]
    argv = ["abandon", "--sink-id", sid, "--epoch", "1", "--metastore-url", url]
    assert cli([*argv, "--reason", "files deleted by an orphan cleanup", "--accept-data-loss"]) == 0
    assert eosink.run(second, sink="iceberg", epoch=2, **o).committed  # type: ignore[union-attr]
    assert sorted(int(r["id"]) for r in iceberg_rows(opts)) == list(range(100, 110))
    assert orphan_files(opts) == []
    assert [x["epoch"] for x in status_json(url, capsys)["losses"]] == [1]


def test_schema_evolution_adds_columns_and_rejects_incompatible(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import eosink
    from eosink import SchemaMismatchError

    url = f"sqlite:///{tmp_path / 'm.db'}"
    eosink.run(
        spark.range(0, 10).selectExpr("id", "cast(id as int) as n"),
        sink="iceberg",
        metastore_url=url,
        **_opts(tmp_path),
    )
    eosink.run(
        spark.range(10, 20).selectExpr("id", "cast(id as long) as n", "'new' as extra"),
        sink="iceberg",
        metastore_url=url,
        **_opts(tmp_path),
    )
    table = _table(tmp_path)
    assert [f.name for f in table.schema().fields] == ["id", "n", "extra"]
    # The schema change and the epoch's data are one metadata commit: create, epoch 0,
    # then epoch 1 (with the new schema); no version with the new column but not the data.
    assert len(table.metadata.metadata_log) == 2
    assert table.current_snapshot().schema_id == table.schema().schema_id
    assert str(table.schema().find_field("n").field_type) == "long"  # int -> long promotion
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["extra"] for r in rows] == [None] * 10 + ["new"] * 10
    files_before = len(list((tmp_path / "wh").rglob("*.parquet")))
    with pytest.raises(SchemaMismatchError, match="n"):
        eosink.run(
            spark.range(3).selectExpr("id", "'text' as n"),
            sink="iceberg",
            metastore_url=url,
            **_opts(tmp_path),
        )
    assert len(list((tmp_path / "wh").rglob("*.parquet"))) == files_before


def test_secrets_never_leak(spark, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    import logging
    import subprocess
    import sys

    import eosink
    from eosink import EosinkError

    secret = "S3CR3T-never-print-me"
    url = f"sqlite:///{tmp_path / 'm.db'}"
    opts = {
        "table": "db.events",
        "catalog": {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'cat.db'}",
            "warehouse": f"file://{tmp_path / 'wh'}",
            "s3.secret-access-key": secret,
            "token": secret,
        },
    }
    caplog.set_level(logging.DEBUG)
    r = eosink.run(spark.range(5), sink="iceberg", epoch=0, metastore_url=url, **opts)
    assert r.rows == 5  # type: ignore[union-attr]
    bad = {**opts, "catalog": {**opts["catalog"], "uri": f"postgresql://u:{secret}@127.0.0.1:1/x"}}
    with pytest.raises(EosinkError) as exc:
        eosink.run(spark.range(5), sink="iceberg", epoch=1, metastore_url=url, **bad)
    with pytest.raises(EosinkError) as exc2:
        eosink.get_sink("iceberg").parse_options({**opts, "colour": secret})
    assert secret not in str(exc.value) and secret not in str(exc2.value)
    assert secret not in repr(eosink.get_sink("iceberg").parse_options(opts))
    assert secret not in caplog.text
    assert secret.encode() not in (tmp_path / "m.db").read_bytes()
    status = subprocess.run(
        [sys.executable, "-m", "eosink._cli", "status", "--metastore-url", url, "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert secret not in status and "iceberg:eosink.db.events" in status


def test_second_writer_commits_during_the_stream(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Another application appends to the same table while eosink streams into it: commit
    conflicts are retried after a refresh; both writers' rows are there exactly once."""
    import threading

    import pyarrow as pa
    from harness import make_input

    import eosink

    url = f"sqlite:///{tmp_path / 'm.db'}"
    inp = tmp_path / "in"
    expected = make_input(inp, files=8, rows=25)
    eosink.run(
        spark.range(0).selectExpr("id", "'g' as grp", "'p' as payload"),
        sink="iceberg",
        epoch=0,
        metastore_url=url,
        **_opts(tmp_path),
    )  # creates the table
    table = _table(tmp_path)
    foreign: list[int] = []
    stop = threading.Event()

    def other_app() -> None:
        n = 0
        while not stop.is_set() and n < 40:
            ids = list(range(100_000 + n * 10, 100_000 + n * 10 + 10))
            t = _table(tmp_path)
            try:
                t.append(
                    pa.table(
                        {
                            "id": pa.array(ids, pa.int64()),
                            "grp": ["o"] * 10,
                            "payload": ["other"] * 10,
                        },
                        schema=t.schema().as_arrow(),
                    )
                )
                foreign.extend(ids)
            except Exception:  # the other app loses a race too; it just tries again
                pass
            n += 1

    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )
    writer = threading.Thread(target=other_app)
    writer.start()
    h = eosink.run(
        sdf,
        sink="iceberg",
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"availableNow": True},
        metastore_url=url,
        new_checkpoint="continue",
        **_opts(tmp_path),
    )
    h.await_termination()  # type: ignore[union-attr]
    stop.set()
    writer.join()
    ids = sorted(table.refresh().scan().to_arrow().column("id").to_pylist())
    assert foreign, "the second writer never committed"
    assert ids == sorted(expected + foreign)


def test_commit_conflict_is_retried(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """A deterministic conflict: another application commits between eosink's read of the
    table and its commit. The commit fails with a conflict, is retried on fresh metadata, and
    both applications' rows are there exactly once."""
    import logging

    import pyarrow as pa
    from eosink_iceberg.coordinator import IcebergCoordinator

    import eosink

    url = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.range(0, 10).selectExpr("id", "'g' as grp")
    eosink.run(df.limit(0), sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path))
    original_commit, original_table = IcebergCoordinator.commit, IcebergCoordinator._table
    calls: list[int] = []

    def commit(self: Any, epoch: int, committable: Any) -> None:
        calls.append(epoch)
        if len(calls) > 1:
            return original_commit(self, epoch, committable)
        stale = original_table(self)  # eosink's view of the table...
        other = _table(tmp_path)  # ...then another application commits
        other.append(
            pa.table(
                {"id": pa.array([999], pa.int64()), "grp": ["o"]},
                schema=other.schema().as_arrow(),
            )
        )
        monkeypatch.setattr(self, "_table", lambda: stale)
        try:
            return original_commit(self, epoch, committable)
        finally:
            monkeypatch.delattr(self, "_table")

    monkeypatch.setattr(IcebergCoordinator, "commit", commit)
    with caplog.at_level(logging.WARNING):
        r = eosink.run(df, sink="iceberg", epoch=1, metastore_url=url, **_opts(tmp_path))
    assert isinstance(r, eosink.BatchResult) and r.committed
    assert calls[0] == 1, calls
    # The conflict happened and was retried: by pyiceberg's own commit retry on fresh
    # metadata, or (once pyiceberg gives up) by eosink's retry of the CommitFailedError.
    assert "concurrent update, retrying" in caplog.text or (
        calls == [1, 1] and "conflicted" in caplog.text
    ), caplog.text
    ids = sorted(_table(tmp_path).scan().to_arrow().column("id").to_pylist())
    assert ids == [*list(range(10)), 999]


def test_snapshot_expiry_keeps_the_newest(tmp_path: Path) -> None:
    import pyarrow as pa

    import eosink
    from eosink.testing import drive_writers

    plugin = eosink.get_sink("iceberg")
    opts = plugin.parse_options(_opts(tmp_path, expire_snapshots_keep=5))
    coord = plugin.coordinator_factory(opts, "expiry")
    coord.init()
    committables = {}
    for e in range(12):
        batch = pa.record_batch({"id": pa.array([e], pa.int64())})
        results = drive_writers(
            plugin, opts, "expiry", e, [[batch]], coord.writer_setup(batch.schema)
        )
        committables[e] = coord.pre_commit(e, results).committable
        coord.commit(e, committables[e])
    table = _table(tmp_path)
    assert len(table.snapshots()) == 5
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(12))
    # Idempotency survives expiry: the table property remembers the last epoch.
    assert all(
        s.summary.additional_properties.get("eosink.epoch") != "3" for s in table.snapshots()
    )  # epoch 3's snapshot is expired
    coord.commit(3, committables[3])
    assert len(table.refresh().scan().to_arrow()) == 12


def test_missing_pyiceberg_names_the_extra(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pyiceberg'] = None\n"
        "import eosink\n"
        "sink = eosink.get_sink('iceberg')\n"
        f"opts = sink.parse_options({{'table': 'db.t', 'warehouse': {str(tmp_path)!r}}})\n"
        "try:\n"
        "    sink.coordinator_factory(opts, 'x')\n"
        "except eosink.MissingExtraError as e:\n"
        "    assert isinstance(e, ImportError); print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'eosink[iceberg]'" in out.stdout


def test_partition_transforms_write(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """day/bucket/truncate transforms (pyiceberg-core, in the iceberg extra) write rows into
    the right partitions, read back exactly."""
    import eosink

    df = spark.range(0, 40).selectExpr(
        "id",
        "timestamp_seconds(1763769600 + id * 21600) as ts",
        "concat('name-', cast(id as string)) as name",
    )
    r = eosink.run(
        df,
        sink="iceberg",
        epoch=0,
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
        **_opts(tmp_path, partition_by=["day(ts)", "bucket(4, id)", "truncate(6, name)"]),
    )
    assert isinstance(r, eosink.BatchResult) and r.rows == 40
    table = _table(tmp_path)
    assert [str(f.transform) for f in table.spec().fields] == ["day", "bucket[4]", "truncate[6]"]
    rows = table.scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(40))
    days = {p["ts_day"] for p in table.inspect.partitions().column("partition").to_pylist()}
    assert len(days) == 10  # 40 rows, 4 per day


@pytest.mark.parametrize("point", ["before_commit", "mid_commit", "after_commit"])
def test_schema_change_epoch_crashes_around_its_commit(spark, tmp_path: Path, point: str) -> None:  # type: ignore[no-untyped-def]
    """An epoch that adds a column dies before, inside or after its commit (simulated in
    process); re-running the job finishes it: the column is added once, rows exactly once."""
    import eosink
    from eosink.faults import SimulatedCrash, simulate

    url = f"sqlite:///{tmp_path / 'm.db'}"
    eosink.run(spark.range(0, 5), sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path))
    wider = spark.range(5, 10).selectExpr("id", "concat('v', cast(id as string)) as extra")
    with simulate(point) as fired, pytest.raises(SimulatedCrash):
        eosink.run(wider, sink="iceberg", epoch=1, metastore_url=url, **_opts(tmp_path))
    assert fired[0] == 1
    r = eosink.run(wider, sink="iceberg", epoch=1, metastore_url=url, **_opts(tmp_path))
    assert isinstance(r, eosink.BatchResult) and r.committed and r.recovered
    table = _table(tmp_path)
    assert [f.name for f in table.schema().fields] == ["id", "extra"]
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda d: d["id"])
    assert rows == [{"id": i, "extra": None if i < 5 else f"v{i}"} for i in range(10)]
    snaps = [s for s in table.snapshots() if (s.summary or {}).get("eosink.epoch") in ("0", "1")]
    assert len(snaps) == 2  # one append per epoch, never two
