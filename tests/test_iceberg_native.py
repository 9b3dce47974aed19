"""The iceberg sink's native path: Spark's own Parquet writer stages the data files.

Read back with pyiceberg scans (the independent reader), row by row; every data file's
partition record is checked against pyiceberg's own transforms of the file's rows; scans with
a row filter on a partition source prune files.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import to_arrow

import eosink


def _opts(tmp_path: Path, table: str = "db.events", **kw: Any) -> dict[str, Any]:
    return {"table": table, "warehouse": str(tmp_path / "wh"), **kw}


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'm.db'}"


def _table(tmp_path: Path, name: str = "db.events") -> Any:
    from pyiceberg.catalog import load_catalog

    o = eosink.get_sink("iceberg").parse_options(_opts(tmp_path))
    return load_catalog(o.catalog_name, **o.catalog_properties()).load_table(name)


def _run(df: Any, tmp_path: Path, epoch: int = 0, **kw: Any) -> eosink.BatchResult:
    r = eosink.run(
        df, sink="iceberg", epoch=epoch, metastore_url=_url(tmp_path), **_opts(tmp_path, **kw)
    )
    assert isinstance(r, eosink.BatchResult) and r.committed
    return r


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


def _local(path: str) -> str:
    return path.split("://", 1)[-1]


def _data_files(table: Any) -> list[Any]:
    return [t.file for t in table.scan().plan_files()]


def _partition_repr(v: Any) -> Any:
    """A transform's output as a partition record holds it (dates as days, ...)."""
    if isinstance(v, dt.datetime):
        epoch = dt.datetime(1970, 1, 1, tzinfo=v.tzinfo)
        return (v - epoch) // dt.timedelta(microseconds=1)
    if isinstance(v, dt.date):
        return (v - dt.date(1970, 1, 1)).days
    return v


def _assert_partitions_exact(table: Any) -> int:
    """Every data file's partition record equals pyiceberg's transform of each of its rows."""
    schema, spec = table.schema(), table.spec()
    files = _data_files(table)
    for f in files:
        data = pq.read_table(_local(f.file_path))
        by_id = {fld.field_id: fld for fld in schema.fields}
        for i, pf in enumerate(spec.fields):
            source = by_id[pf.source_id]
            column = data.column(source.name).combine_chunks()
            values = pf.transform.pyarrow_transform(source.field_type)(column).to_pylist()
            expected = {_partition_repr(v) for v in values}
            assert expected == {f.partition[i]}, (f.file_path, pf.name, expected, f.partition)
    return len(files)


# -- round trips ----------------------------------------------------------------------------
def test_native_round_trip_of_every_type(spark: Any, tmp_path: Path) -> None:
    """Unpartitioned: timestamps (with and without time zone), dates, decimals, nested
    structs, binary and nulls come back exactly; the files carry Iceberg field ids and
    INT64 microsecond timestamps."""
    df = spark.range(0, 50).selectExpr(
        "id",
        "cast(id as int) as n",
        "cast(id as short) as small",
        "if(id % 7 = 0, null, concat('name-', id, '-é')) as name",
        "id % 2 = 0 as flag",
        "cast(id as double) / 3 as ratio",
        "cast(id / 4 as float) as f",
        "date_add(date'1969-12-25', cast(id as int) * 3) as d",
        "timestamp_micros(1700000000123456 + id * 3600000001) as ts",
        "cast(timestamp_micros(-1000000 + id * 86400000007) as timestamp_ntz) as local_ts",
        "cast(id * 1.25 as decimal(10, 2)) as price",
        "cast(id as decimal(30, 5)) / 7 as big",
        "if(id % 5 = 0, null, cast(concat('b', id) as binary)) as raw",
        "named_struct('a', cast(id as int), 'inner', named_struct('c', concat('c', id),"
        " 'when', date_add(date'2024-02-28', cast(id as int)))) as s",
        "if(id % 3 = 0, null, named_struct('x', if(id > 40, null, id))) as maybe",
    )
    legacy = "spark.sql.parquet.writeLegacyFormat"
    spark.conf.set(legacy, "true")  # a user's setting: overridden for the write, restored
    try:
        r = _run(df, tmp_path)
        assert spark.conf.get(legacy) == "true"
    finally:
        spark.conf.unset(legacy)
    assert r.rows == 50 and r.figures is not None and r.figures.writer == "spark"
    table = _table(tmp_path)
    expected = _by_id(to_arrow(df).to_pylist())
    got = _by_id(table.scan().to_arrow().to_pylist())
    assert got == expected
    assert str(table.schema().find_field("small").field_type) == "int"
    for f in _data_files(table):
        assert "/eosink-" in f.file_path and f.record_count > 0
        file_schema = pq.read_schema(_local(f.file_path))
        ids = {
            name: int(file_schema.field(name).metadata[b"PARQUET:field_id"])
            for name in file_schema.names
        }
        assert ids == {fld.name: fld.field_id for fld in table.schema().fields}
        assert file_schema.field("ts").type == pa.timestamp("us", tz="UTC")
        assert file_schema.field("local_ts").type == pa.timestamp("us")
        inner = file_schema.field("s").type.field("inner")
        assert (
            inner.metadata[b"PARQUET:field_id"]
            == str(table.schema().find_field("s.inner").field_id).encode()
        )
        assert f.lower_bounds and f.upper_bounds and f.value_counts
    # The session's Parquet confs are the user's again.
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "INT96"
    # Column statistics prune: a filter outside every file's bounds plans no file.
    assert list(table.scan(row_filter="id > 1000").plan_files()) == []


def test_native_partition_transforms_exact(spark: Any, tmp_path: Path) -> None:
    """identity (string, int, bool, date), year, month, day, hour, truncate (long, string):
    values exact (empty strings, nulls, '/', '%', '..', non-ASCII; UTC days of timestamps
    in a session time zone that is not UTC; times before 1970), and files pruned."""
    from pyiceberg.expressions import EqualTo, GreaterThanOrEqual

    groups = ["fr", "", None, "de/at", "..", "x%y", "Ça=va", "日本"]
    spark.createDataFrame(
        [(i, groups[i % len(groups)]) for i in range(64)], "id long, grp string"
    ).createOrReplaceTempView("eosink_native_src")
    df = spark.sql(
        """select id, grp,
              cast(id - 30 as int) as n,
              id % 3 = 0 as flag,
              date_add(date'1969-12-20', cast(id as int) * 5) as d,
              timestamp_micros(-7200000000 + id * 5400000000) as ts,
              cast(timestamp_micros(id * 86400000000 * 11) as timestamp_ntz) as local_ts,
              concat('name-', id % 9, '-ü') as name
           from eosink_native_src"""
    )
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        a = _run(
            df,
            tmp_path,
            table="db.a",
            partition_by=["grp", "day(ts)", "truncate(4, id)"],
            writer="spark",
        )
        assert a.figures is not None and a.figures.writer == "spark"
        _run(
            df,
            tmp_path,
            table="db.b",
            partition_by=["year(d)", "month(local_ts)", "flag", "n"],
            writer="spark",
        )
        _run(
            df,
            tmp_path,
            table="db.c",
            partition_by=["hour(ts)", "truncate(6, name)", "d", "day(local_ts)"],
            writer="spark",
        )
        expected = _by_id(to_arrow(df).to_pylist())
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    for name in ("db.a", "db.b", "db.c"):
        table = _table(tmp_path, name)
        assert _by_id(table.scan().to_arrow().to_pylist()) == expected, name
        assert _assert_partitions_exact(table) > 8, name
    a = _table(tmp_path, "db.a")
    everything = len(_data_files(a))
    for g in groups:
        flt = EqualTo("grp", g) if g is not None else "grp is null"
        planned = list(a.scan(row_filter=flt).plan_files())
        assert 0 < len(planned) < everything, g
        ids = sorted(a.scan(row_filter=flt).to_arrow().column("id").to_pylist())
        assert ids == [r["id"] for r in expected if r["grp"] == g], g
    late = GreaterThanOrEqual("ts", "1970-01-03T00:00:00+00:00")
    assert len(list(a.scan(row_filter=late).plan_files())) < everything


def test_native_and_python_give_the_same_table(spark: Any, tmp_path: Path) -> None:
    """The same DataFrame through both writers: the same rows and the same partition
    records with the same rows in each (the Python path is pyiceberg's own writer)."""
    df = spark.range(0, 40).selectExpr(
        "id", "cast(id % 4 as string) as grp", "timestamp_seconds(1763769600 + id * 21600) as ts"
    )
    parts = ["grp", "day(ts)"]
    n = _run(df, tmp_path, table="db.native", partition_by=parts, writer="spark")
    assert n.figures is not None and n.figures.writer == "spark"
    r = _run(df, tmp_path, table="db.python", partition_by=parts)  # auto: partitioned
    assert r.figures is not None and r.figures.writer == "python"

    def layout(name: str) -> dict[tuple[Any, ...], list[int]]:
        out: dict[tuple[Any, ...], list[int]] = {}
        for f in _data_files(_table(tmp_path, name)):
            ids = pq.read_table(_local(f.file_path), columns=["id"]).column("id").to_pylist()
            out.setdefault(tuple(f.partition), []).extend(ids)
        return {k: sorted(v) for k, v in out.items()}

    assert layout("db.native") == layout("db.python")


# -- what the native path cannot express --------------------------------------------------------
def test_fallback_to_python_and_writer_option(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A list column and a bucket transform take the Python writers (logged, with the
    reason); writer='spark' refuses them with a clear error before writing anything."""
    tags = spark.range(0, 10).selectExpr("id", "array(id, id + 1) as tags")
    with caplog.at_level(logging.INFO, logger="eosink"):
        r = _run(tags, tmp_path, table="db.tags")
    assert r.figures is not None and r.figures.writer == "python"
    assert "Python writers for this sink, not Spark's: column 'tags' is a list" in caplog.text
    assert sorted(
        x["tags"][1] for x in _table(tmp_path, "db.tags").scan().to_arrow().to_pylist()
    ) == list(range(1, 11))
    with pytest.raises(
        eosink.SchemaMismatchError, match=r"writer='spark'.*column 'tags' is a list"
    ):
        _run(tags, tmp_path, epoch=1, table="db.tags", writer="spark")

    plain = spark.range(0, 10).selectExpr("id", "cast(id as string) as s")
    with pytest.raises(eosink.ConfigError, match=r"bucket\(4, id\): Spark cannot compute"):
        _run(plain, tmp_path, table="db.bucketed", partition_by=["bucket(4, id)"], writer="spark")
    r = _run(plain, tmp_path, epoch=1, table="db.bucketed", partition_by=["bucket(4, id)"])
    assert r.figures is not None and r.figures.writer == "python"
    assert sorted(
        _table(tmp_path, "db.bucketed").scan().to_arrow().column("id").to_pylist()
    ) == list(range(10))
    # Identity on a timestamp: its directory value would not be exact.
    ts = spark.range(0, 3).selectExpr("id", "timestamp_seconds(id) as ts")
    with pytest.raises(eosink.SchemaMismatchError, match=r"partition field ts on a timestamptz"):
        _run(ts, tmp_path, table="db.ts", partition_by=["ts"], writer="spark")


def test_crash_after_the_spark_write_is_recovered(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies right after Spark wrote the epoch's files (simulated in process at
    ``after_spark_write``): the next run aborts them (found by their directory) and writes
    the epoch again: rows once, no file or directory of the dead attempt left."""
    from eosink._protocol import Epoch
    from eosink.faults import SimulatedCrash, simulate

    df = spark.range(0, 30).selectExpr("id", "cast(id % 3 as string) as grp")
    with monkeypatch.context() as m, simulate("after_spark_write") as fired:
        m.setattr(Epoch, "discard", lambda self: None)  # a killed driver cleans nothing up
        with pytest.raises(SimulatedCrash):
            _run(df, tmp_path, partition_by=["grp"], writer="spark")
    assert fired[0] == 1
    data = Path(_local(_table(tmp_path).location())) / "data"
    dead = [p for p in data.iterdir() if p.name.startswith("eosink-")]
    assert len(dead) == 1 and list(dead[0].rglob("*.parquet"))
    r = _run(df, tmp_path, partition_by=["grp"], writer="spark")
    assert not r.recovered and r.rows == 30
    table = _table(tmp_path)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(30))
    assert not dead[0].exists()
    on_disk = {str(p) for p in data.rglob("*") if p.is_file()}
    assert on_disk == {_local(f.file_path) for f in _data_files(table)}


def test_spark_write_failure_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    """A null in a required column fails the Spark job: SchemaMismatchError naming the
    column, the epoch's staged files deleted (abort), the table unchanged."""
    _run(spark.range(0, 5), tmp_path)  # spark.range's id is NOT NULL: a required column
    table = _table(tmp_path)
    assert table.schema().find_field("id").required
    bad = spark.range(5, 10).selectExpr("if(id = 7, null, id) as id")
    with pytest.raises(eosink.SchemaMismatchError, match=r"column 'id' is required"):
        _run(bad, tmp_path, epoch=1)
    data = Path(_local(_table(tmp_path).location())) / "data"
    assert {str(p) for p in data.rglob("*") if p.is_file()} == {
        _local(f.file_path) for f in _data_files(_table(tmp_path))
    }
    assert sorted(_table(tmp_path).scan().to_arrow().column("id").to_pylist()) == list(range(5))


def test_partition_directories_decoded_and_checked(tmp_path: Path) -> None:
    """Directory values: Spark's %XX escaping undone, the null directory, the ``v`` prefix;
    a value the file's own bounds contradict (directories merged by a case-insensitive
    filesystem) is refused. No Spark needed."""
    from eosink_iceberg.native_files import partition_record
    from eosink_iceberg.native_plan import Part
    from eosink_iceberg.transforms import PartitionTerm

    def footer(values: list[Any]) -> Any:
        path = tmp_path / "f.parquet"
        pq.write_table(pa.table({"grp": pa.array(values, pa.string())}), path)
        return pq.read_metadata(path)

    ident = [Part(PartitionTerm("identity", "grp"), "eosink_p0", "str")]
    trunc = [Part(PartitionTerm("truncate", "grp", 2), "eosink_p0", "str")]
    assert partition_record("eosink_p0=vde%2Fat%25%3D/f", ident, footer(["de/at%="])) == (
        "de/at%=",
    )
    assert partition_record("eosink_p0=v/f", ident, footer(["", ""])) == ("",)
    assert partition_record("eosink_p0=__HIVE_DEFAULT_PARTITION__/f", ident, footer([None])) == (
        None,
    )
    assert partition_record("eosink_p0=vab/f", trunc, footer(["abc", "abz"])) == ("ab",)
    with pytest.raises(eosink.SinkError, match="case-insensitive"):
        partition_record("eosink_p0=va/f", ident, footer(["A", "A"]))
    with pytest.raises(eosink.SinkError, match="not partitioned as asked"):
        partition_record("f", ident, footer(["A"]))


# -- Python writers: bounded memory -------------------------------------------------------------
def test_python_writer_writes_out_beyond_its_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python writer holds at most FLUSH_BYTES of its task's rows: beyond that it writes
    them out as data files (several files per partition, rows exact, partition records
    exact); a writer that fails after such a write deletes what it wrote."""
    from eosink_iceberg import writer as iceberg_writer

    from eosink.testing import drive_writers

    monkeypatch.setattr(iceberg_writer, "FLUSH_BYTES", 40_000)
    plugin = eosink.get_sink("iceberg")
    opts = plugin.parse_options(_opts(tmp_path, partition_by=["grp"]))
    coord = plugin.coordinator_factory(opts, "flush")
    coord.init()
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("grp", pa.string())])

    def batch(lo: int, n: int) -> pa.RecordBatch:
        ids = list(range(lo, lo + n))
        return pa.record_batch([pa.array(ids), pa.array([f"g{i % 2}" for i in ids])], schema=schema)

    batches = [batch(i * 2_000, 2_000) for i in range(10)]  # 32 KB each: 5 write-outs
    results = drive_writers(plugin, opts, "flush", 0, [batches], coord.writer_setup(schema))
    files = results[0]["files"]
    assert len(files) == 10  # two partitions, written out five times
    coord.commit(0, coord.pre_commit(0, results).committable)
    table = _table(tmp_path)
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(20_000))
    assert _assert_partitions_exact(table) == 10
    # A null in the required id, after two write-outs: the task fails, its files go.
    nullable = pa.schema([("id", pa.int64()), ("grp", pa.string())])
    bad = [b.cast(nullable) for b in batches[:4]]
    bad.append(pa.record_batch({"id": [None] * 2_000, "grp": ["g0"] * 2_000}, schema=nullable))
    with pytest.raises(eosink.SchemaMismatchError, match=r"column 'id' is required"):
        drive_writers(plugin, opts, "flush", 1, [bad], coord.writer_setup(nullable))
    data = Path(_local(_table(tmp_path).location())) / "data"
    assert {str(p) for p in data.rglob("*.parquet")} == {
        _local(f.file_path) for f in _data_files(_table(tmp_path))
    }


def test_a_stream_plans_its_projection_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The micro-batches of a stream reuse the projection the first one planned (PySpark's
    Column API costs ~5 ms a call); a table whose schema changed gets a new one."""
    from eosink_iceberg import native_plan
    from harness import make_input

    calls: list[int] = []
    plan = native_plan._plan

    def counted(*args: Any) -> Any:
        calls.append(1)
        return plan(*args)

    monkeypatch.setattr(native_plan, "_plan", counted)
    inp = tmp_path / "in"
    expected = make_input(inp, files=3, rows=20)
    sdf = (
        spark.readStream.schema("id long, grp string, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )
    h = eosink.run(
        sdf,
        sink="iceberg",
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"availableNow": True},
        metastore_url=_url(tmp_path),
        **_opts(tmp_path),
    )
    h.await_termination()  # type: ignore[union-attr]
    assert [f.writer for f in h.figures] == ["spark"] * 3  # type: ignore[union-attr]
    assert len(calls) == 1
    with _table(tmp_path).update_schema() as u:  # another application adds a column
        from pyiceberg.types import StringType

        u.add_column("note", StringType())
    more = tmp_path / "more.parquet"  # the stream's Spark schema: only the table changed
    pq.write_table(pa.table({"id": [100, 101], "grp": ["g", "g"], "payload": ["p", "p"]}), more)
    again = spark.read.schema("id long, grp string, payload string").parquet(str(more))
    assert again.schema == sdf.schema
    _run(again, tmp_path, epoch=5)
    assert len(calls) == 2
    ids = sorted(_table(tmp_path).scan().to_arrow().column("id").to_pylist())
    assert ids == sorted([*expected, 100, 101])
