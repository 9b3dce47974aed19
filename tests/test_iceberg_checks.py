"""The iceberg sink is never stuck: what can be known before anything is written is checked
before any table, meta store row or Spark job (issue 21), and after the error a corrected run
succeeds. Partition specs are checked against the DataFrame's types (as the Iceberg spec
defines each transform's source types; the invalid ones asked for are rows of
tests/test_bad_inputs.py), a table an older eosink created with an invalid spec
is named with what to do, ``create_table=False`` on a missing table and a DataFrame without a
required column of the table fail first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eosink
from eosink import ConfigError, SchemaMismatchError

TABLE = "db.events"


def _opts(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"table": TABLE, "warehouse": str(tmp_path / "wh"), **kw}


def _catalog(tmp_path: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    o = eosink.get_sink("iceberg").parse_options(_opts(tmp_path))
    return load_catalog(o.catalog_name, **o.catalog_properties())


def _table_exists(tmp_path: Path) -> bool:
    if not (tmp_path / "wh" / "catalog.db").exists():
        return False
    return bool(_catalog(tmp_path).table_exists(TABLE))


def _fails_before_anything(spark: Any, tmp_path: Path, df: Any, **options: Any) -> ConfigError:
    """Run a batch write; return its error, checking that no meta store, Spark job or table
    came out of it."""
    db = tmp_path / "metastore.db"
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    existed = _table_exists(tmp_path)
    with pytest.raises(ConfigError) as exc:
        eosink.run(
            df,
            sink="iceberg",
            epoch=0,
            metastore_url=f"sqlite:///{db}",
            **_opts(tmp_path, **options),
        )
    assert not db.exists(), "the meta store was created before the sink was checked"
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs, "a job ran"
    assert _table_exists(tmp_path) == existed, "the table was created"
    return exc.value


def _run(spark: Any, tmp_path: Path, df: Any, epoch: int = 0, **options: Any) -> Any:
    return eosink.run(
        df,
        sink="iceberg",
        epoch=epoch,
        metastore_url=f"sqlite:///{tmp_path / 'metastore.db'}",
        **_opts(tmp_path, **options),
    )


def _rows(tmp_path: Path) -> int:
    return len(_catalog(tmp_path).load_table(TABLE).scan().to_arrow())


def test_transform_source_types_agree_with_pyiceberg() -> None:
    """The allowed source types are the Iceberg spec's; pyiceberg's ``can_transform`` agrees
    for every primitive type and transform eosink writes."""
    from eosink_iceberg.transforms import PartitionTerm, applicable_transforms, source_type_error
    from pyiceberg import types as T

    types = [
        T.BooleanType(),
        T.IntegerType(),
        T.LongType(),
        T.FloatType(),
        T.DoubleType(),
        T.DecimalType(10, 2),
        T.DateType(),
        T.TimeType(),
        T.TimestampType(),
        T.TimestamptzType(),
        T.StringType(),
        T.UUIDType(),
        T.FixedType(16),
        T.BinaryType(),
    ]
    for ty in types:
        for term in [
            PartitionTerm("identity", "c"),
            PartitionTerm("year", "c"),
            PartitionTerm("month", "c"),
            PartitionTerm("day", "c"),
            PartitionTerm("hour", "c"),
            PartitionTerm("bucket", "c", 4),
            PartitionTerm("truncate", "c", 4),
        ]:
            ok = source_type_error(term, ty) is None
            assert ok == term.iceberg().can_transform(ty), (term, ty)
        assert applicable_transforms(ty, "c")  # identity at least
    struct = T.StructType(T.NestedField(2, "a", T.IntegerType(), required=False))
    why = source_type_error(PartitionTerm("identity", "c"), struct)
    assert why is not None and "no transform partitions a struct column" in why


# -- (b) a table an older eosink created with an invalid spec --------------------------------
def _table_with_invalid_spec(tmp_path: Path) -> Any:
    """What eosink before the check created from partition_by=["day(s)"] on a string s."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import LongType, NestedField, StringType

    cat = _catalog(tmp_path)
    cat.create_namespace_if_not_exists("db")
    return cat.create_table(
        TABLE,
        schema=Schema(
            NestedField(1, "id", LongType(), required=False),
            NestedField(2, "s", StringType(), required=False),
        ),
        partition_spec=PartitionSpec(PartitionField(2, 1000, DayTransform(), "s_day")),
    )


@pytest.mark.parametrize("partition_by", [["s"], None])
def test_table_with_an_invalid_spec_is_named_with_the_fix(
    spark: Any, tmp_path: Path, partition_by: list[str] | None
) -> None:
    _table_with_invalid_spec(tmp_path)
    df = spark.range(0, 5).selectExpr("id", "cast(id as string) as s")
    kw = {"partition_by": partition_by} if partition_by else {}
    msg = str(_fails_before_anything(spark, tmp_path, df, **kw))
    assert "has the partition field 's_day' = day(s), which is not valid" in msg
    assert "column 's' is string, and the day transform applies to date" in msg
    assert "holds no data (no snapshot)" in msg
    assert f"catalog.drop_table({TABLE!r})" in msg
    assert "partition_by=['day(s)']" not in msg  # never suggests the invalid spec
    if partition_by:
        assert "run again with partition_by=['s']" in msg
    # The fix the message gives: drop the table; the corrected run creates and writes it.
    _catalog(tmp_path).drop_table(TABLE)
    assert _run(spark, tmp_path, df, partition_by=["s"]).rows == 5
    table = _catalog(tmp_path).load_table(TABLE)
    assert [f.name for f in table.spec().fields] == ["s"]
    assert _rows(tmp_path) == 5


def test_coordinator_refuses_a_table_with_an_invalid_spec(tmp_path: Path) -> None:
    """The same check in writer_setup (a coordinator driven without prepare_sink)."""
    import pyarrow as pa

    _table_with_invalid_spec(tmp_path)
    plugin = eosink.get_sink("iceberg")
    coord = plugin.coordinator_factory(plugin.parse_options(_opts(tmp_path)), "x")
    coord.init()
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    with pytest.raises(ConfigError, match=r"'s_day' = day\(s\), which is not valid"):
        coord.writer_setup(schema)


# -- (c) create_table=False on a missing table; a missing required column ------------------
@pytest.mark.parametrize("catalog_exists", [False, True])
def test_create_table_false_on_a_missing_table(
    spark: Any, tmp_path: Path, catalog_exists: bool
) -> None:
    if catalog_exists:
        _catalog(tmp_path).create_namespace("db")
    df = spark.range(0, 4).selectExpr("id")
    err = _fails_before_anything(spark, tmp_path, df, create_table=False)
    assert (
        f"Iceberg table {TABLE!r} does not exist in catalog 'eosink', and create_table=False"
        in (str(err))
    )
    assert "Nothing was written" in str(err)
    assert (tmp_path / "wh").exists() == catalog_exists
    assert _run(spark, tmp_path, df).rows == 4  # create_table=True (the default)
    assert _run(spark, tmp_path, df.selectExpr("id + 4 as id"), create_table=False, epoch=1)
    assert _rows(tmp_path) == 8


def test_missing_required_column_is_refused_before_anything(spark: Any, tmp_path: Path) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    cat = _catalog(tmp_path)
    cat.create_namespace("db")
    cat.create_table(
        TABLE,
        schema=Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "s", StringType(), required=False),
        ),
    )
    err = _fails_before_anything(spark, tmp_path, spark.range(0, 3).selectExpr("'x' as s"))
    assert isinstance(err, SchemaMismatchError)
    msg = str(err)
    assert "has the required (non-null) column 'id' (long), which the DataFrame lacks" in msg
    assert "u.make_column_optional('id')" in msg and "Nothing was written" in msg
    # An optional column may be missing; the required one present: written.
    assert _run(spark, tmp_path, spark.range(0, 3).selectExpr("id")).rows == 3
    assert _rows(tmp_path) == 3
