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
    root = Path(table.location().removeprefix("file://")) / "data"
    present = {str(p) for p in root.rglob("*.parquet")} if root.exists() else set()
    referenced: set[str] = set()
    for snap in table.snapshots():
        for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
            referenced.add(task.file.file_path.removeprefix("file://"))
    return sorted(present - referenced)


class TestIcebergSqliteConformance(SinkConformance):
    sink_name = "iceberg"

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"table": "db.events", "warehouse": str(tmp_path / "wh")}

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        return iceberg_rows(options)

    def leftovers(self, options: Any) -> list[str]:
        return orphan_files(options)


class TestIcebergPostgresCatalogConformance(TestIcebergSqliteConformance):
    @pytest.fixture(autouse=True)
    def _pg(self, pg_url: str) -> None:
        self.pg = pg_url

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "table": f"ns_{uuid.uuid4().hex[:12]}.events",
            "catalog": {"type": "sql", "uri": self.pg, "warehouse": f"file://{tmp_path / 'wh'}"},
        }
