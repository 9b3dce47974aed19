"""The iceberg sink: atomic table creation with its spec, partition_by checks, nullability,
exact idempotency (backfills), orphaned data files, and the sink's marker in the table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import eosink

SINK_ID = "iceberg:eosink.db.events"  # the default sink_id of table db.events


def _opts(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"table": "db.events", "warehouse": str(tmp_path / "wh"), **kw}


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'm.db'}"


def _catalog(tmp_path: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    o = eosink.get_sink("iceberg").parse_options(_opts(tmp_path))
    return load_catalog(o.catalog_name, **o.catalog_properties())


def _table(tmp_path: Path) -> Any:
    return _catalog(tmp_path).load_table("db.events")


def _coordinator(tmp_path: Path, sink_id: str = SINK_ID, **kw: Any) -> Any:
    plugin = eosink.get_sink("iceberg")
    coord = plugin.coordinator_factory(plugin.parse_options(_opts(tmp_path, **kw)), sink_id)
    coord.init()
    return coord


def _write_epoch(coord: Any, epoch: int, ids: list[int]) -> dict[str, Any]:
    """Writers of one epoch (one partition per id chunk) and pre_commit: the committable."""
    from eosink.testing import drive_writers

    plugin = eosink.get_sink("iceberg")
    batch = pa.record_batch({"id": pa.array(ids, pa.int64())})
    setup = coord.writer_setup(batch.schema)
    results = drive_writers(plugin, coord.opts, coord.sink_id, epoch, [[batch]], setup)
    return coord.pre_commit(epoch, results).committable  # type: ignore[no-any-return]


def _parquet(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "wh").rglob("*.parquet"))


def _referenced(table: Any) -> set[str]:
    out = set()
    for snap in table.snapshots():
        for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
            out.add(task.file.file_path.split("://", 1)[-1])
    return out


# -- (a) the table never exists without its partition spec -------------------------------
def test_created_table_has_its_spec_in_its_first_metadata(spark: Any, tmp_path: Path) -> None:
    df = spark.range(0, 30).selectExpr("id", "cast(id % 3 as string) as grp", "id % 2 as odd")
    r = eosink.run(
        df,
        sink="iceberg",
        epoch=0,
        metastore_url=_url(tmp_path),
        partition_by=["grp", "identity(odd)"],
        **_opts(tmp_path),
    )
    assert r.rows == 30  # type: ignore[union-attr]
    table = _table(tmp_path)
    # One spec ever (no unpartitioned spec 0 followed by an update_spec commit).
    assert len(table.metadata.partition_specs) == 1
    assert [f.name for f in table.spec().fields] == ["grp", "odd"]
    # The very first metadata file of the table (what a crash right after the creation
    # leaves behind) already has the spec.
    first = table.metadata.metadata_log[0].metadata_file if table.metadata.metadata_log else None
    assert first is not None
    meta = json.loads(Path(first.split("://", 1)[-1]).read_text())
    spec = next(s for s in meta["partition-specs"] if s["spec-id"] == meta["default-spec-id"])
    assert [f["name"] for f in spec["fields"]] == ["grp", "odd"]
    assert len(meta["partition-specs"]) == 1
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(30))


# -- (b) partition_by must match an existing table's spec ----------------------------------
def test_partition_by_on_an_existing_table_with_another_spec_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 10).selectExpr("id", "cast(id % 2 as string) as grp")
    eosink.run(df, sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path))
    table = _table(tmp_path)
    files, snaps, meta = _parquet(tmp_path), len(table.snapshots()), table.metadata_location
    with pytest.raises(eosink.ConfigError, match=r"unpartitioned.*partition_by asks for grp"):
        eosink.run(
            df, sink="iceberg", epoch=1, metastore_url=url, partition_by="grp", **_opts(tmp_path)
        )
    table = _table(tmp_path)
    assert _parquet(tmp_path) == files
    assert len(table.snapshots()) == snaps and table.metadata_location == meta
    assert table.spec().is_unpartitioned()
    assert len(table.scan().to_arrow()) == 10


def test_partition_by_names_the_actual_spec_and_accepts_the_same(
    spark: Any, tmp_path: Path
) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 10).selectExpr("id", "cast(id % 2 as string) as grp")
    eosink.run(
        df, sink="iceberg", epoch=0, metastore_url=url, partition_by="grp", **_opts(tmp_path)
    )
    with pytest.raises(eosink.ConfigError, match=r"partitioned by grp.*truncate\(8, id\)"):
        eosink.run(
            df.selectExpr("id + 10 as id", "grp"),
            sink="iceberg",
            epoch=1,
            metastore_url=url,
            partition_by="truncate(8, id)",
            **_opts(tmp_path),
        )
    # The same spec, or none at all, writes with the table's spec.
    eosink.run(
        df.selectExpr("id + 10 as id", "grp"),
        sink="iceberg",
        epoch=1,
        metastore_url=url,
        partition_by="identity(grp)",
        **_opts(tmp_path),
    )
    eosink.run(
        df.selectExpr("id + 20 as id", "grp"),
        sink="iceberg",
        epoch=2,
        metastore_url=url,
        **_opts(tmp_path),
    )
    ids = sorted(_table(tmp_path).scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(30))


def test_transforms_without_pyiceberg_core_are_refused_before_creation(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extra installs pyiceberg-core; an environment without it gets a clear error."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyiceberg_core" else real(name, *a),
    )
    df = spark.range(0, 10).selectExpr("id", "current_date() as day")
    with pytest.raises(eosink.ConfigError, match=r"day.*pyiceberg-core"):
        eosink.run(
            df,
            sink="iceberg",
            epoch=0,
            metastore_url=_url(tmp_path),
            partition_by="day(day)",
            **_opts(tmp_path),
        )
    from pyiceberg.exceptions import NoSuchTableError

    with pytest.raises(NoSuchTableError):
        _table(tmp_path)


# -- (c) required columns stay required -----------------------------------------------------
def _required_long_table(tmp_path: Path) -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    cat = _catalog(tmp_path)
    cat.create_namespace_if_not_exists("db")
    return cat.create_table(
        "db.events",
        schema=Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "s", StringType(), required=False),
        ),
    )


def test_int_data_into_a_required_long_column_keeps_it_required(spark: Any, tmp_path: Path) -> None:
    _required_long_table(tmp_path)
    # A nullable int column (Spark cannot prove it has no null) without any null.
    df = spark.range(0, 10).selectExpr("if(id >= 0, cast(id as int), null) as id", "'x' as s")
    assert df.schema["id"].nullable
    eosink.run(df, sink="iceberg", epoch=0, metastore_url=_url(tmp_path), **_opts(tmp_path))
    table = _table(tmp_path)
    field = table.schema().find_field("id")
    assert field.required and str(field.field_type) == "long"
    assert len(table.schemas()) == 1
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(10))


def test_null_into_a_required_column_names_it_and_writes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    _required_long_table(tmp_path)
    df = spark.range(0, 10).selectExpr("if(id < 7, id, null) as id", "'x' as s")
    with pytest.raises(eosink.EosinkError, match=r"column 'id' is required \(NOT NULL\)"):
        eosink.run(df, sink="iceberg", epoch=0, metastore_url=_url(tmp_path), **_opts(tmp_path))
    table = _table(tmp_path)
    assert table.schema().find_field("id").required
    assert table.current_snapshot() is None
    assert _parquet(tmp_path) == []


def test_new_columns_are_optional_and_promotions_keep_required(tmp_path: Path) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, NestedField

    cat = _catalog(tmp_path)
    cat.create_namespace_if_not_exists("db")
    cat.create_table("db.events", schema=Schema(NestedField(1, "n", IntegerType(), required=True)))
    coord = _coordinator(tmp_path)
    schema = pa.schema([pa.field("n", pa.int64()), pa.field("extra", pa.string(), False)])
    setup = coord.writer_setup(schema)
    assert setup["evolve"] is not None
    from eosink.testing import drive_writers

    batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=schema)
    results = drive_writers(eosink.get_sink("iceberg"), coord.opts, SINK_ID, 0, [[batch]], setup)
    coord.commit(0, coord.pre_commit(0, results).committable)
    s = _table(tmp_path).schema()
    assert s.find_field("n").required and str(s.find_field("n").field_type) == "long"
    assert s.find_field("extra").optional


# -- (d) backfill: exact idempotency, epochs committed out of order ---------------------------
def test_backfill_of_an_older_epoch_commits_exactly_once(spark: Any, tmp_path: Path) -> None:
    url = _url(tmp_path)
    r5 = eosink.run(
        spark.range(500, 510), sink="iceberg", epoch=5, metastore_url=url, **_opts(tmp_path)
    )
    assert r5.rows == 10  # type: ignore[union-attr]
    r3 = eosink.run(
        spark.range(300, 310), sink="iceberg", epoch=3, metastore_url=url, **_opts(tmp_path)
    )
    coord = _coordinator(tmp_path)
    if r3.skipped:  # type: ignore[union-attr]
        # The core of this checkout does not write an epoch below its high-water mark yet:
        # drive epoch 3 through the coordinator's own commit path.
        c3 = _write_epoch(coord, 3, list(range(300, 310)))
        coord.commit(3, c3)
        coord.commit(3, c3)  # a replayed commit: nothing twice
    table = _table(tmp_path)
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(300, 310)) + list(range(500, 510))
    assert coord.read_marker()["last_epoch"] == 5
    assert coord._committed(table, 3) and coord._committed(table, 5)
    assert not coord._committed(table, 4) and not coord._committed(table, 6)
    # Replays of both epochs publish nothing.
    again = eosink.run(
        spark.range(300, 310), sink="iceberg", epoch=3, metastore_url=url, **_opts(tmp_path)
    )
    eosink.run(spark.range(500, 510), sink="iceberg", epoch=5, metastore_url=url, **_opts(tmp_path))
    assert again.skipped  # type: ignore[union-attr]
    assert len(_table(tmp_path).scan().to_arrow()) == 20


def test_commit_path_backfill_and_replays(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path, sink_id="backfill")
    c5 = _write_epoch(coord, 5, [50, 51])
    coord.commit(5, c5)
    c3 = _write_epoch(coord, 3, [30, 31])
    c4 = _write_epoch(coord, 4, [40])
    table = _table(tmp_path)
    assert not coord._committed(table, 3)
    coord.commit(3, c3)
    for e, c in ((5, c5), (3, c3), (3, c3), (5, c5)):
        coord.commit(e, c)  # replays: nothing twice
    table = _table(tmp_path)
    assert coord._committed(table, 3) and not coord._committed(table, 4)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [30, 31, 50, 51]
    assert table.properties[coord.prop] == "5"  # never lowered by the backfill
    coord.commit(4, c4)
    assert sorted(_table(tmp_path).scan().to_arrow().column("id").to_pylist()) == [
        30,
        31,
        40,
        50,
        51,
    ]
    assert _table(tmp_path).properties[coord.epochs_prop] == "3-5"


def test_backfill_is_exact_after_snapshot_expiry(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path, sink_id="expiry", expire_snapshots_keep=2)
    cs = {e: _write_epoch(coord, e, [e]) for e in (10, 11)}
    coord.commit(11, cs[11])
    c2 = _write_epoch(coord, 2, [2])
    coord.commit(2, c2)
    coord.commit(10, cs[10])
    for e in (12, 13, 14):
        coord.commit(e, _write_epoch(coord, e, [e]))
    table = _table(tmp_path)
    assert len(table.snapshots()) == 2  # epochs 2, 10 and 11 have no snapshot any more
    for e, c in ((2, c2), (10, cs[10]), (11, cs[11])):
        coord.commit(e, c)
    assert sorted(_table(tmp_path).scan().to_arrow().column("id").to_pylist()) == [
        2,
        10,
        11,
        12,
        13,
        14,
    ]


# -- (e) orphaned data files ---------------------------------------------------------------
def _plant(tmp_path: Path, epoch: int, sink_id: str = SINK_ID) -> Path:
    """A copy of a real data file of the table, named like a writer of ``epoch`` names its
    files (a dead executor's file that no committable names)."""
    from eosink_iceberg.datafiles import epoch_of_file, write_uuid

    src = next(p for p in _parquet(tmp_path) if epoch_of_file(str(p), sink_id) is not None)
    dst = src.parent / f"00099-7-{write_uuid(sink_id, epoch)}.parquet"
    shutil.copy(src, dst)
    assert epoch_of_file(str(dst), sink_id) == epoch
    return dst


def _assert_referenced_intact(tmp_path: Path) -> None:
    for p in _referenced(_table(tmp_path)):
        assert Path(p).exists(), p


def test_orphan_of_a_committed_epoch_is_swept_at_the_next_start(spark: Any, tmp_path: Path) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 40).repartition(2)
    eosink.run(df, sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path))
    planted = _plant(tmp_path, 0)
    uncommitted = _plant(tmp_path, 9)  # staged by a crashed run: aborted by the core
    eosink.run(spark.range(40, 50), sink="iceberg", epoch=1, metastore_url=url, **_opts(tmp_path))
    assert not planted.exists() and not uncommitted.exists()
    _assert_referenced_intact(tmp_path)
    table = _table(tmp_path)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(50))
    assert {str(p) for p in _parquet(tmp_path)} == _referenced(table)


def test_orphan_of_the_epoch_is_deleted_by_its_commit(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path)
    c0 = _write_epoch(coord, 0, list(range(10)))
    planted = _plant(tmp_path, 0)
    assert coord.commit(0, c0) is None  # made visible by this call
    assert not planted.exists()
    planted = _plant(tmp_path, 0)
    other_epoch = _plant(tmp_path, 1)
    again = coord.commit(0, c0)  # already committed, still sweeps the epoch's orphans
    assert again is not None and again.kind == "already_committed", again
    assert not planted.exists() and other_epoch.exists()
    _assert_referenced_intact(tmp_path)
    assert len(_table(tmp_path).scan().to_arrow()) == 10
    assert list(coord.staged_epochs()) == [1]


def test_abort_of_a_committed_epoch_never_deletes_referenced_files(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path)
    c0 = _write_epoch(coord, 0, list(range(10)))
    coord.commit(0, c0)
    replay = _plant(tmp_path, 0)  # a replay's output, discarded by the core with abort
    coord.abort(0, None)
    coord.abort(0, c0)
    assert not replay.exists()
    _assert_referenced_intact(tmp_path)
    assert len(_table(tmp_path).scan().to_arrow()) == 10


# -- (f) the sink's marker in the table -------------------------------------------------------
def test_marker_round_trip_and_last_epoch(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path, sink_id="marked")
    target = coord.target_id()
    assert target is not None and target.startswith("iceberg:eosink.db.events in sqlite:///")
    assert coord.read_marker() is None  # no table yet
    marker = {
        "sink_id": "marked",
        "plugin": "iceberg",
        "target": coord.target_id(),
        "lineage": None,
        "epoch_base": 0,
    }
    coord.write_marker({**marker, "last_epoch": 99})  # remembered until the table exists
    c4 = _write_epoch(coord, 4, [4])  # creates the table, with the marker
    table = _table(tmp_path)
    assert json.loads(table.properties[coord.marker_prop]) == marker
    assert not table.metadata.metadata_log  # one metadata version: created with the marker
    assert coord.read_marker() == {**marker, "last_epoch": -1}
    coord.commit(4, c4)
    assert coord.read_marker() == {**marker, "last_epoch": 4}
    coord.commit(2, _write_epoch(coord, 2, [2]))  # a backfill never lowers it
    assert coord.read_marker() == {**marker, "last_epoch": 4}
    coord.commit(7, _write_epoch(coord, 7, [7]))
    moved = {**marker, "lineage": "q-2", "epoch_base": 8}
    coord.write_marker(moved)
    assert coord.read_marker() == {**moved, "last_epoch": 7}
    # Markers are per sink_id.
    other = _coordinator(tmp_path, sink_id="other")
    assert other.read_marker() is None
    other.write_marker({**marker, "sink_id": "other"})
    assert other.read_marker() == {**marker, "sink_id": "other", "last_epoch": -1}
    assert _coordinator(tmp_path, sink_id="marked").read_marker() == {**moved, "last_epoch": 7}
    # A property that is not an eosink marker (edited by hand) is refused, naming it.
    with _table(tmp_path).transaction() as tx:
        tx.set_properties({coord.marker_prop: "not json"})
    with pytest.raises(eosink.SinkError) as err:
        _coordinator(tmp_path, sink_id="marked").read_marker()
    assert str(err.value) == (
        f"Iceberg table 'db.events': table property {coord.marker_prop!r} is not an eosink "
        "marker (not a JSON object): 'not json' (see docs/errors.md#sinkerror)"
    )


def test_same_table_name_in_another_catalog_is_another_target(spark: Any, tmp_path: Path) -> None:
    """The default sink_id names catalog and table; the same name in another warehouse is
    another target: refused, not silently skipped."""
    url = _url(tmp_path)
    df = spark.range(0, 5).selectExpr("id", "'g' as grp")
    eosink.run(df, sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path))
    other = {**_opts(tmp_path), "warehouse": str(tmp_path / "other-wh")}
    with pytest.raises(eosink.SinkIdentityError, match=r"is bound to iceberg:eosink\.db\.events"):
        eosink.run(df, sink="iceberg", epoch=0, metastore_url=url, **other)
