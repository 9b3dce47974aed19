"""eosink_iceberg._compat: the installed pyiceberg is in the tested range and every function
that reaches into pyiceberg's internals works with it (no Spark needed)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eosink_iceberg import _compat
from eosink_iceberg.datafiles import data_file_from_json, data_file_to_json

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("price", pa.decimal128(10, 2)),
        pa.field("s", pa.struct([pa.field("a", pa.int32()), pa.field("d", pa.date32())])),
    ]
)


@pytest.fixture
def table(tmp_path: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    cat = load_catalog(
        "compat",
        type="sql",
        uri=f"sqlite:///{tmp_path / 'cat.db'}",
        warehouse=f"file://{tmp_path / 'wh'}",
    )
    cat.create_namespace("db")
    return cat.create_table("db.t", schema=_compat.new_table_schema(SCHEMA))


def _data(n: int = 20) -> pa.Table:
    import datetime as dt
    import decimal

    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": [f"n{i}" if i % 4 else None for i in range(n)],
            "ts": [
                dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(hours=i)
                for i in range(n)
            ],
            "price": [decimal.Decimal(i) / 4 for i in range(n)],
            "s": [{"a": i, "d": dt.date(2024, 2, 1) + dt.timedelta(days=i)} for i in range(n)],
        },
        schema=SCHEMA,
    )


def test_installed_pyiceberg_is_in_the_tested_range() -> None:
    assert _compat.check_version() is None, _compat.pyiceberg_version()
    assert _compat._release("0.12.0") == (0, 12, 0)
    assert _compat._release("0.13.0rc1") == (0, 13, 0)


def test_new_table_schema_and_arrow_to_schema(table: Any) -> None:
    ice = _compat.new_table_schema(SCHEMA)
    assert [f.name for f in ice.fields] == SCHEMA.names
    assert ice.find_field("id").required and ice.find_field("s.d").field_id > 5
    back = _compat.arrow_to_schema(SCHEMA, table.schema().name_mapping)
    assert back.as_struct() == table.schema().as_struct()


def test_table_metadata_round_trip_and_ancestors(table: Any) -> None:
    assert _compat.parse_table_metadata(table.metadata.model_dump_json()) == table.metadata
    table.append(_data(3))
    table.append(_data(2))
    ancestors = list(_compat.snapshot_ancestors(table.refresh()))
    assert len(ancestors) == 2 and ancestors[0].snapshot_id == table.current_snapshot().snapshot_id


def test_arrow_to_data_files_and_json_round_trip(table: Any) -> None:
    from pyiceberg.io import load_file_io

    wu = uuid.uuid4()
    files = list(
        _compat.arrow_to_data_files(table.metadata, _data(), load_file_io(table.io.properties), wu)
    )
    assert len(files) == 1 and str(wu) in files[0].file_path and files[0].record_count == 20
    js = data_file_to_json(files[0], table.metadata.default_spec_id)
    again = data_file_from_json(js)
    assert data_file_to_json(again, table.metadata.default_spec_id) == js
    assert again.spec_id == table.metadata.default_spec_id


def test_data_file_from_a_footer_matches_pyicebergs_own(table: Any, tmp_path: Path) -> None:
    """A Parquet file with the table's field ids written by another writer: its DataFile
    from the footer has the statistics pyiceberg gives the same data written by itself."""
    from pyiceberg.io import load_file_io

    own = next(
        iter(
            _compat.arrow_to_data_files(
                table.metadata, _data(), load_file_io(table.io.properties), uuid.uuid4()
            )
        )
    )
    ids = {f.name: f.field_id for f in table.schema().fields}
    nested = table.schema().find_field("s").field_type
    fields = []
    for f in SCHEMA:
        t = f.type
        if f.name == "s":
            t = pa.struct(
                [
                    t.field(i).with_metadata(
                        {"PARQUET:field_id": str(nested.field_by_name(t.field(i).name).field_id)}
                    )
                    for i in range(t.num_fields)
                ]
            )
        fields.append(f.with_type(t).with_metadata({"PARQUET:field_id": str(ids[f.name])}))
    path = tmp_path / "other.parquet"
    pq.write_table(_data().cast(pa.schema(fields)), path, store_decimal_as_integer=True)
    footer = pq.read_metadata(path)
    df = _compat.data_file_from_parquet_footer(
        table.metadata, f"file://{path}", footer, path.stat().st_size, ()
    )
    assert df.record_count == own.record_count == 20
    assert df.file_size_in_bytes == path.stat().st_size
    assert df.value_counts == own.value_counts
    assert df.null_value_counts == own.null_value_counts
    assert df.lower_bounds == own.lower_bounds and df.upper_bounds == own.upper_bounds
    assert df.spec_id == table.metadata.default_spec_id
    with table.transaction() as tx, tx.update_snapshot().fast_append() as app:
        app.append_data_file(df)
    assert table.refresh().scan().to_arrow().to_pylist() == _data().to_pylist()


def test_location_filesystem_lists_the_table(table: Any) -> None:
    from pyarrow import fs as pafs

    table.append(_data(3))
    filesystem, root, scheme = _compat.location_filesystem(
        table.io.properties, table.location() + "/data"
    )
    assert scheme == "file"
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    assert [i.base_name for i in infos if i.base_name.endswith(".parquet")]


def test_transaction_computes_the_metadata_once_per_staged_state(table: Any) -> None:
    """The caching transaction commits what pyiceberg's own would, sees each staged update,
    and deep-copies the table's metadata once per state instead of once per read."""
    from unittest import mock

    from pyiceberg.table import update as updmod

    for i in range(3):
        table.append(_data(2 + i))
    real = updmod.update_table_metadata
    with mock.patch.object(updmod, "update_table_metadata", side_effect=real) as spy:
        tx = _compat.transaction(table)
        first = tx.table_metadata
        assert tx.table_metadata is first and spy.call_count == 1  # no change: no recompute
        tx.set_properties({"eosink.test": "1"})
        assert tx.table_metadata.properties["eosink.test"] == "1"
        data_files = list(
            _compat.arrow_to_data_files(tx.table_metadata, _data(4), table.io, uuid.uuid4())
        )
        calls_before = spy.call_count
        with tx.update_snapshot(snapshot_properties={"eosink.epoch": "7"}).fast_append() as app:
            for df in data_files:
                app.append_data_file(df)
        # pyiceberg's append reads tx.table_metadata ~14 times; each read was a deep copy
        assert spy.call_count - calls_before <= 3
        tx.commit_transaction()
    table = table.refresh()
    assert table.properties["eosink.test"] == "1"
    assert table.current_snapshot().summary.additional_properties["eosink.epoch"] == "7"
    assert table.scan().to_arrow().num_rows == 2 + 3 + 4 + 4
