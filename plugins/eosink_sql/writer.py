"""The sql sink's writers (Spark tasks): one staging table per task attempt, loaded in one
transaction. PostgreSQL: binary ``COPY`` of the Arrow batches through ADBC's PostgreSQL
driver when every column's Arrow type has a binary form for its column (the batches are
cast to it first: a value that does not fit fails the task), else ``COPY ... FROM STDIN`` of
CSV that pyarrow writes (PostgreSQL converts the text as it always does). SQLite:
``executemany``. A task that dies before ``finish_write`` leaves nothing: its transaction
is rolled back with the table it created."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eosink import CoordinatedSinkWriter, SinkError, WriterContext
from eosink.util import sink_key

from .db import Db, adbc_uri, arrow_type_of, python_rows, staging_name
from .options import SqlSinkOptions

__all__ = ["SqlWriter", "make_writer"]


def _csv(batch: pa.RecordBatch) -> bytes:
    """CSV PostgreSQL's ``COPY (FORMAT csv)`` reads: strings quoted, NULL unquoted empty,
    binary as ``\\x`` hex."""
    import pyarrow.csv as pacsv

    cols = []
    for col in batch.columns:
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            col = pa.array(
                [None if v is None else "\\x" + v.hex() for v in col.to_pylist()], pa.string()
            )
        cols.append(col)
    out = io.BytesIO()
    pacsv.write_csv(
        pa.Table.from_arrays(cols, names=batch.schema.names),
        out,
        pacsv.WriteOptions(include_header=False, quoting_style="needed"),
    )
    return out.getvalue()


class SqlWriter(CoordinatedSinkWriter[dict[str, Any]]):
    """Stages one task's rows into its own table (see the module)."""

    def __init__(self, opts: SqlSinkOptions, ctx: WriterContext) -> None:
        self.opts = opts
        self.setup: dict[str, Any] = dict(ctx.setup or {})
        self.table = staging_name(sink_key(ctx.sink_id), ctx.epoch, ctx.attempt_id)
        self.rows = 0
        self.epoch = ctx.epoch
        self._db: Db | None = None
        self._raw: Any = None
        self._adbc: Any = None  # the ADBC connection (binary COPY), or None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_db": None, "_raw": None, "_adbc": None}

    def _refused(self, exc: Exception) -> SinkError:
        """A database error of this task as a SinkError: its first line is what the user
        reads (a value out of range, too long for its column...)."""
        assert self._db is not None
        return self._db.error(
            f"epoch {self.epoch}: a task's rows could not be staged in {self.table} (nothing "
            "was written)",
            exc,
        )

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._db = Db(self.opts)
        try:
            self._begin()
        except SinkError:
            raise
        except Exception as exc:
            raise self._refused(exc) from None

    def _begin(self) -> None:
        assert self._db is not None
        if self._db.pg and self.setup.get("binary"):
            import adbc_driver_postgresql.dbapi as adbc

            self._adbc = adbc.connect(adbc_uri(self.opts))  # not autocommit: one transaction
            with self._adbc.cursor() as cur:
                cur.execute(str(self.setup["create"]).format(table=self._db.staging(self.table)))
            return
        self._raw = self._db.engine.raw_connection()
        cur = self._raw.cursor()
        if not self._db.pg:  # sqlite3 would autocommit the CREATE: one transaction
            cur.execute("BEGIN IMMEDIATE")
        cur.execute(str(self.setup["create"]).format(table=self._db.staging(self.table)))
        cur.close()

    def write_batch(self, batch: pa.RecordBatch) -> None:
        try:
            self._write(batch)
        except SinkError:
            raise
        except Exception as exc:
            raise self._refused(exc) from None

    def _write(self, batch: pa.RecordBatch) -> None:
        assert self._db is not None
        names = list(self.setup["columns"])
        batch = pa.record_batch([batch.column(n) for n in names], names=names)
        if batch.num_rows == 0:
            return
        if self.setup.get("op_column"):  # no surprise from op values with spaces or case
            op = self.setup["op_column"]
            i = names.index(op)
            batch = batch.set_column(i, op, pc.utf8_trim_whitespace(batch.column(i)))
        table = self._db.staging(self.table)
        if self._adbc is not None:
            cols = [
                self._cast(name, c, arrow_type_of(k, c.type))
                for name, c, k in zip(names, batch.columns, self.setup["binary"], strict=True)
            ]
            with self._adbc.cursor() as cur:
                cur.adbc_ingest(
                    self.table,
                    pa.record_batch(cols, names=names),
                    mode="append",
                    db_schema_name=self.opts.staging_schema,
                )
        elif self._db.pg:
            conn = self._raw.driver_connection
            with conn.cursor() as cur:
                sql = f"COPY {table} ({self._db.columns(names)}) FROM STDIN (FORMAT csv)"
                with cur.copy(sql) as copy:
                    copy.write(_csv(batch))
        else:
            cur = self._raw.cursor()
            marks = ", ".join("?" for _ in names)
            cur.executemany(
                f"INSERT INTO {table} ({self._db.columns(names)}) VALUES ({marks})",
                python_rows(batch),
            )
            cur.close()
        self.rows += batch.num_rows

    def _cast(self, name: str, col: pa.Array, to: pa.DataType) -> pa.Array:
        """``col`` as ``to`` (the staging column's type); a value that does not fit fails
        the task, naming the column."""
        if col.type == to:
            return col
        try:
            return col.cast(to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SinkError(
                f"sql sink {self.opts.target_label}: epoch {self.epoch}: column {name!r} of a "
                f"task's rows does not fit table {self.opts.table}'s column (nothing was "
                f"written): {exc}"
            ) from None

    def finish_write(self, epoch: int) -> dict[str, Any]:
        try:
            (self._adbc or self._raw).commit()
        except Exception as exc:
            raise self._refused(exc) from None
        self._close()
        return {"table": self.table, "rows": self.rows}

    def abort_write(self) -> None:
        conn = self._adbc or self._raw
        if conn is not None:
            try:
                conn.rollback()  # the table was created in this transaction: gone
            finally:
                self._close()

    def _close(self) -> None:
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._db is not None:
            self._db.close()
            self._db = None


def make_writer(opts: SqlSinkOptions, ctx: WriterContext) -> SqlWriter:
    return SqlWriter(opts, ctx)
