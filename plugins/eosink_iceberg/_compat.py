"""Every use of pyiceberg beyond its documented user API, in one place.

The iceberg sink writes data files and builds their descriptions with pyiceberg's own code
(field ids, statistics, partition values); that code is not pyiceberg's public API and changes
between releases. Every such use goes through a function of this module, so that a new
pyiceberg release means reading one file, and ``tests/test_iceberg_compat.py`` checks that the
installed pyiceberg is in :data:`PYICEBERG_TESTED` and that every function here works.

The rest of the package uses only the documented API: catalogs, tables, transactions,
``update_schema``, schemas, types, transforms, expressions and exceptions.
"""

from __future__ import annotations

import functools
import itertools
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

__all__ = [
    "PYICEBERG_TESTED",
    "arrow_to_data_files",
    "arrow_to_schema",
    "check_version",
    "data_file_from_parquet_footer",
    "location_filesystem",
    "new_data_file",
    "new_table_schema",
    "parse_table_metadata",
    "pyiceberg_version",
    "snapshot_ancestors",
    "transaction",
]

log = logging.getLogger("eosink.iceberg")

PYICEBERG_TESTED = ">=0.10,<0.13"
"""The pyiceberg versions the sink runs without a warning. The test suite runs the lock file's
pyiceberg (0.12); 0.10 and 0.11 passed ``tests/test_iceberg_compat.py`` and the iceberg tests
by hand when this module was written, and nothing re-runs them. pyiceberg 0.9 worked too (the
shims below) except for decimal columns, which its own Parquet writer cannot write (its
statistics code expects INT32/INT64 decimals, its writer writes FIXED_LEN_BYTE_ARRAY)."""

_LOW, _HIGH = (0, 10), (0, 13)
_warned: list[str] = []


def pyiceberg_version() -> str:
    """The installed pyiceberg's version."""
    from importlib.metadata import version

    return version("pyiceberg")


def _release(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for p in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, p))
        if not digits:
            break
        parts.append(int(digits))
        if digits != p:
            break
    return tuple(parts)


def check_version() -> str | None:
    """None when the installed pyiceberg is in :data:`PYICEBERG_TESTED`, else a warning (also
    logged once per process)."""
    v = pyiceberg_version()
    if _LOW <= _release(v)[:2] < _HIGH:
        return None
    msg = (
        f"pyiceberg {v} is not in the range the iceberg sink is tested with "
        f"({PYICEBERG_TESTED}); writing uses pyiceberg internals (eosink_iceberg/_compat.py)"
    )
    if v not in _warned:
        _warned.append(v)
        log.warning("iceberg: %s", msg)
    return msg


# -- schemas and metadata -------------------------------------------------------------------
def new_table_schema(schema: pa.Schema, format_version: int = 2) -> Any:
    """The Iceberg schema of an Arrow schema, with fresh field ids (as ``create_table`` would
    assign them), so that a partition spec can be built on it before the table exists."""
    import inspect

    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    convert: Any = Catalog._convert_schema_if_needed
    if "format_version" in inspect.signature(convert).parameters:  # pyiceberg >= 0.10
        return assign_fresh_schema_ids(convert(schema, format_version))
    return assign_fresh_schema_ids(convert(schema))


def arrow_to_schema(schema: pa.Schema, name_mapping: Any) -> Any:
    """The Iceberg schema of an Arrow schema, field ids taken from ``name_mapping``."""
    from pyiceberg.io.pyarrow import pyarrow_to_schema

    return pyarrow_to_schema(schema, name_mapping=name_mapping)


def parse_table_metadata(text: str) -> Any:
    """TableMetadata from its JSON (``metadata.model_dump_json()``)."""
    from pyiceberg.table.metadata import TableMetadataUtil

    return TableMetadataUtil.parse_raw(text)


def snapshot_ancestors(table: Any) -> Iterator[Any]:
    """The current snapshot of ``table`` and its ancestors, newest first."""
    from pyiceberg.table.snapshots import ancestors_of

    return iter(ancestors_of(table.current_snapshot(), table.metadata))


# -- transactions ---------------------------------------------------------------------------
def transaction(table: Any) -> Any:
    """``table.transaction()``, whose ``table_metadata`` is computed once per staged state.

    pyiceberg's ``Transaction.table_metadata`` replays every staged update and deep-copies the
    whole table metadata, snapshot list included, on *each* read, and one ``fast_append``
    reads it about fourteen times: a stream's commit then costs time in proportion to the
    table's history (48 ms at 40 snapshots, 145 ms at 150, measured; the same cost
    apache/iceberg-python#2673 and #3784 describe). This transaction caches the result until
    an update is staged or the table's metadata changes. The cached object is itself a deep
    copy of the table's metadata, as pyiceberg's is, and pyiceberg treats it as immutable.
    Falls back to the plain transaction when pyiceberg's internals differ.
    """
    tx = table.transaction()
    if not hasattr(tx, "_updates") or not hasattr(tx, "_table"):
        return tx
    return _caching_transaction_class()(table)


@functools.cache
def _caching_transaction_class() -> Any:
    from pyiceberg.table import Transaction
    from pyiceberg.table import update as table_update

    class CachingTransaction(Transaction):
        _eosink_cache: tuple[Any, Any, Any] | None = None

        @property
        def table_metadata(self) -> Any:
            base, updates = self._table.metadata, self._updates
            cached = self._eosink_cache
            if cached is None or cached[0] is not base or cached[1] is not updates:
                cached = (base, updates, table_update.update_table_metadata(base, updates))
                self._eosink_cache = cached
            return cached[2]

    return CachingTransaction


# -- data files -----------------------------------------------------------------------------
def arrow_to_data_files(
    metadata: Any, data: pa.Table, io: Any, write_uuid: uuid.UUID
) -> Iterator[Any]:
    """Write ``data`` as Parquet data files of the table (pyiceberg's writer: field ids,
    partition values and statistics); yield their DataFiles. File names carry
    ``write_uuid``."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    yield from _dataframe_to_data_files(metadata, data, io, write_uuid, itertools.count(0))


def new_data_file(spec_id: int, **fields: Any) -> Any:
    """A DataFile of the given fields, bound to partition spec ``spec_id``."""
    from pyiceberg.manifest import DataFile

    if hasattr(DataFile, "from_args"):  # pyiceberg >= 0.10
        df = DataFile.from_args(spec_id=spec_id, **fields)
    else:
        make: Any = DataFile  # pyiceberg 0.9: the constructor takes the fields
        df = make(spec_id=spec_id, **fields)
    df.spec_id = spec_id
    return df


def data_file_from_parquet_footer(
    metadata: Any, file_path: str, footer: Any, size: int, partition: tuple[Any, ...]
) -> Any:
    """The DataFile of a Parquet file written with the table's field ids (by Spark), its
    statistics computed from the footer ``footer`` (``pyarrow.parquet.FileMetaData``) as
    pyiceberg computes those of the files it writes.

    (pyiceberg's ``add_files`` is for files *without* field ids and refuses these.)
    """
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = metadata.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return new_data_file(
        metadata.default_spec_id,
        content=DataFileContent.DATA,
        file_path=file_path,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        file_size_in_bytes=size,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **stats.to_serialized_dict(),
    )


def location_filesystem(properties: dict[str, str], location: str) -> tuple[Any, str, str]:
    """(pyarrow filesystem, path in it, scheme) of ``location``, with pyiceberg's own
    filesystem for the location's scheme (its endpoint and credentials applied)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    scheme, netloc, root = PyArrowFileIO.parse_location(location)
    return PyArrowFileIO(properties).fs_by_scheme(scheme, netloc), root, scheme
