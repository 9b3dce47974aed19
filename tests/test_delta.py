"""The delta sink against real Delta tables (delta-rs), without Spark: the conformance suite
on a local and on an S3 table (the moto server), and what the sink refuses.

The independent reader is delta-rs' own query engine (``QueryBuilder``, DataFusion), which
reads the table through its log exactly as any Delta reader; Delta's own Spark reader reads
what the sink writes in ``tests/test_delta_spark.py``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pytest

from eosink.testing import SinkConformance


def delta_table(options: Any) -> Any:
    from deltalake import DeltaTable

    so = options.delta_storage_options()
    if not DeltaTable.is_deltatable(options.path, storage_options=so):
        return None
    return DeltaTable(options.path, storage_options=so)


def delta_rows(options: Any) -> list[dict[str, Any]]:
    """Every row of the table, as delta-rs' query engine reads it."""
    from deltalake import QueryBuilder

    dt = delta_table(options)
    if dt is None:
        return []
    return pa.table(
        QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()
    ).to_pylist()


def leftover_files(options: Any, *, eosink_only: bool = True) -> list[str]:
    """Files under the table's directory that no version of the table references and that
    are not its log: what the sink staged and left behind (``eosink_only``: the files the
    sink names, ``eosink-*/`` and ``_eosink/``; else every one, also those of a ``MERGE``
    that delta-rs wrote and never committed: ``VACUUM``'s to remove)."""
    from eosink_delta.options import filesystem
    from pyarrow import fs as pafs

    dt = delta_table(options)
    fs, root = filesystem(options)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    present = {
        i.path[len(root) + 1 :]
        for i in infos
        if i.type == pafs.FileType.File and not i.path[len(root) + 1 :].startswith("_delta_log/")
    }
    referenced: set[str] = set()
    if dt is not None:
        for v in range(dt.version() + 1):
            old = delta_table(options)
            old.load_as_version(v)
            # The log's paths are URIs (percent-encoded), a listing's are not.
            paths = old.get_add_actions(flatten=True).column("path").to_pylist()
            referenced |= {unquote(p) for p in paths}
    left = sorted(p for p in present - referenced if "/probe-" not in p)
    if eosink_only:
        left = [p for p in left if p.startswith(("eosink-", "_eosink/"))]
    return left


class TestDeltaLocalConformance(SinkConformance):
    sink_name = "delta"

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "events")}

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        return delta_rows(options)

    def leftovers(self, options: Any) -> list[str]:
        return leftover_files(options)


class TestDeltaPartitionedConformance(TestDeltaLocalConformance):
    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "events"), "partition_by": ["name"]}


def s3_table(endpoint: str) -> dict[str, Any]:
    """The delta sink's options of a table in a fresh bucket of the S3 server."""
    from harness import s3_client

    bucket = f"delta-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    return {
        "path": f"s3://{bucket}/events",
        "storage_options": {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ALLOW_HTTP": "true",
        },
    }


class TestDeltaS3Conformance(TestDeltaLocalConformance):
    @pytest.fixture(autouse=True)
    def _s3(self, s3_endpoint: str) -> None:
        self.endpoint = s3_endpoint

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return s3_table(self.endpoint)
