"""The iceberg sink's table before the writers: loaded or created, checked, evolved.

* ``writer_setup`` loads or creates the table (with its partition spec, in one metadata
  commit), checks an existing table again (:func:`~eosink_iceberg.checks.check_table`),
  evolves its schema with the DataFrame's new columns (keeping required columns required),
  and ships the table metadata to the writers.
* The data files are written by Spark's own Parquet writer (``write_with_spark``, the native
  path, ``native.py``) or by Python writers in Spark tasks (``writer.py``); both return the
  same results. ``_apply_evolution`` applies an epoch's schema change in its commit.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eosink import ConfigError, SchemaMismatchError, SinkError

from . import _compat, cdc
from .checks import (
    check_new_spec,
    check_table,
    keep_required,
    missing_table_message,
    new_table_schema_and_spec,
)
from .marker import MarkerProperty
from .rows import utc_timestamps
from .transforms import check_transforms_writable, table_terms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TableSetup"]

log = logging.getLogger("eosink.iceberg")


class TableSetup(MarkerProperty):
    """The driver's work before the writers, and the native path's (:class:`eosink.SparkWriter`)."""

    def writer_setup(self, schema: pa.Schema) -> Any:
        schema = utc_timestamps(schema)  # a session time zone other than UTC: same instants
        if self.opts.mode == "upsert":
            schema = cdc.table_columns(self.opts, schema)  # the op_column is not written
        table = self._table()
        created = False
        if table is None:
            table, created = self._create(schema)
        if created:
            metadata, evolve = table.metadata, None
        else:
            check_table(self.opts, table, schema)
            if self._pending_marker is not None:
                self._store_marker(table, self._pending_marker)
                table = self._table()
            metadata, evolve = self._evolve(table, schema)
        self._metadata = metadata
        props = self.opts.catalog_properties()
        return {
            "metadata": metadata.model_dump_json(),
            "io": {**props, **table.io.properties},
            "evolve": evolve,
        }

    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        """Why Spark's writer cannot write this epoch (``writer="python"``, or what the
        native path cannot express exactly), or None.

        Raises:
            ConfigError: ``writer="spark"`` and the native path cannot write the epoch
                (:class:`~eosink.SchemaMismatchError` when the DataFrame's schema is why).
        """
        from .native import SchemaReason, unsupported

        if self.opts.writer == "python":
            return "the sink's option writer='python'"
        if self.opts.mode == "upsert":  # changes are staged as plain Parquet files
            from .native_checks import location_problem

            where = self._metadata.location if self._metadata is not None else None
            why = location_problem(where) if where else None
            if why is not None and self.opts.writer == "spark":
                raise ConfigError(
                    f"Iceberg table {self.opts.table!r}: writer='spark', but Spark cannot "
                    f"stage this epoch's changes: {why}. Use writer='auto' or 'python'."
                )
            return why
        metadata = self._metadata
        if metadata is None:  # writer_setup always runs first; be safe anyway
            table = self._table()
            if table is None:
                return "the table does not exist yet"
            metadata = table.metadata
        why = unsupported(metadata, schema, self.opts.catalog_properties())
        if why is None and self.opts.writer == "auto" and table_terms(metadata):
            # Measured (docs/benchmarks.md): Spark's partitioned write sorts each task's
            # rows by partition; pyiceberg's writers split them in Arrow, 1.5x faster.
            return (
                "the table is partitioned (Python writers write partitioned tables faster "
                "than Spark's sort-based partitioned write; writer='spark' forces Spark's)"
            )
        if why is not None and self.opts.writer == "spark":
            err = SchemaMismatchError if isinstance(why, SchemaReason) else ConfigError
            raise err(
                f"Iceberg table {self.opts.table!r}: writer='spark', but Spark's Parquet "
                f"writer cannot write this epoch exactly: {why}. Use writer='auto' (Python "
                "writers for such epochs) or writer='python'."
            )
        return None if why is None else str(why)

    def write_with_spark(
        self, df: DataFrame, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Stage the epoch with Spark's Parquet writer (see ``native.py``)."""
        if self.opts.mode == "upsert":
            return [cdc.stage_with_spark(df, epoch, attempt, setup, self.sink_id)]
        from .native import write_epoch

        return [write_epoch(df, epoch, attempt, setup, self.opts, self.sink_id)]

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        """Upserts: the staged change files hold every row Spark wrote (their footers)."""
        if self.opts.mode != "upsert":
            return
        staged = sum(int(c["rows"]) for r in results for c in r.get("changes", []))
        if staged != rows:
            raise SinkError(
                f"iceberg sink epoch {epoch}: Spark wrote {rows} change row(s) but the staged "
                f"files hold {staged}: the table's location is not the same for every node "
                "of the cluster (a local path that is not a shared mount?). Nothing was "
                "committed."
            )

    def _create(self, schema: pa.Schema) -> tuple[Any, bool]:
        """Create the table with its partition spec in one metadata commit.

        Returns (table, True), or (table, False) when another process created it meanwhile.
        """
        from pyiceberg.exceptions import TableAlreadyExistsError

        if not self.opts.create_table:
            raise ConfigError(missing_table_message(self.opts))
        check_new_spec(self.opts, schema)
        check_transforms_writable(self.opts.partition_by, self.opts.table)
        ns = self.opts.table.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(ns)
        ice_schema, spec = new_table_schema_and_spec(schema, self.opts.partition_by)
        properties = {}
        if self._pending_marker is not None:
            properties[self.marker_prop] = self._pending_marker
        try:
            table = self.catalog.create_table(
                self.opts.table, schema=ice_schema, partition_spec=spec, properties=properties
            )
        except TableAlreadyExistsError:
            table = self._table()
            if table is None:
                raise SinkError(
                    f"Iceberg table {self.opts.table!r} was created and dropped meanwhile"
                ) from None
            log.info("iceberg: table %s was created by another process", self.opts.table)
            return table, False
        self._pending_marker = None
        log.info(
            "iceberg: created table %s at %s (partitioned by: %s)",
            self.opts.table,
            table.location(),
            ", ".join(str(t) for t in self.opts.partition_by) or "nothing",
        )
        return table, True

    def _evolve(self, table: Any, schema: pa.Schema) -> tuple[Any, dict[str, str] | None]:
        """Stage the DataFrame's new columns (and allowed promotions) without committing.

        Returns the table metadata the writers use (new columns have their field ids) and the
        evolution to apply in the epoch's commit (None when the schema is unchanged).
        Columns the table has keep their nullability (a nullable Arrow field never makes a
        required column optional); new columns are optional.
        Raises SchemaMismatchError, naming the column, before any file is written.
        """
        current = table.schema()
        names = {f.name for f in current.fields}
        new = [f.name for f in schema if f.name not in names]
        try:
            incoming = _compat.arrow_to_schema(schema, current.name_mapping)
        except Exception:
            incoming = None
        touched = list(new)
        if incoming is not None:
            touched += [
                f.name
                for f in incoming.fields
                if f.name in names and current.find_field(f.name).field_type != f.field_type
            ]
        if not touched:
            return table.metadata, None
        evolved = self._keep_table_nullability(schema, current)
        try:
            tx = table.transaction()  # staged only: applied again in the epoch's commit
            with tx.update_schema() as upd:
                upd.union_by_name(evolved)
            staged = tx.table_metadata
        except Exception as exc:
            said = [n for n in touched if re.search(rf"\b{re.escape(n)}\b", str(exc))]
            col = (said or touched)[0]
            raise SchemaMismatchError(
                f"Iceberg table {self.opts.table!r}: the DataFrame's schema is not compatible"
                + (f" at column {col!r}" if col else "")
                + f": {exc}"
            ) from None
        if staged.schema().as_struct() == current.as_struct():
            return table.metadata, None  # e.g. int data into a long column: nothing changes
        log.info(
            "iceberg: table %s schema evolves with this epoch (new columns: %s)",
            self.opts.table,
            ", ".join(new) or "none; promotions",
        )
        evolve = {
            "arrow_schema": base64.b64encode(evolved.serialize().to_pybytes()).decode(),
            "schema": staged.schema().model_dump_json(),
        }
        return staged, evolve

    @staticmethod
    def _keep_table_nullability(schema: pa.Schema, current: Any) -> pa.Schema:
        by_name = {f.name: f for f in current.fields}
        return pa.schema([keep_required(f, by_name.get(f.name)) for f in schema])

    def _apply_evolution(self, tx: Any, evolve: dict[str, str], epoch: int) -> None:
        """Apply the epoch's schema change in its commit; the field ids must be the writers'."""
        from pyiceberg.schema import Schema

        arrow = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(evolve["arrow_schema"])))
        # Committables written before required columns were kept required carry nullable
        # fields: never let them turn a required column optional.
        arrow = self._keep_table_nullability(arrow, tx.table_metadata.schema())
        with tx.update_schema() as upd:
            upd.union_by_name(arrow)
        expected = Schema.model_validate_json(evolve["schema"])
        got = tx.table_metadata.schema()
        want = {f.field_id: (f.name, str(f.field_type)) for f in expected.fields}
        have = {f.field_id: (f.name, str(f.field_type)) for f in got.fields}
        if any(have.get(i) != v for i, v in want.items()):
            raise SinkError(
                f"epoch {epoch}: the schema of {self.opts.table!r} changed since the epoch was "
                "written (another writer evolved it); the epoch's files use other field ids"
            )
