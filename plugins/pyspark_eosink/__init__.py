"""``format("eosink")`` without registering it: Spark's lookup of installed data sources.

Spark 4 looks, once per driver JVM, for top-level Python modules named ``pyspark_*`` that
define a ``DefaultSource`` data source, and registers each under its ``name()``
(``pyspark/sql/worker/lookup_data_sources.py``). This module is that entry for eosink: a
session whose Python environment has eosink installed (a Spark Connect server's included)
knows ``format("eosink")`` before any ``eosink.register_datasource(spark)``.

The lookup runs in a new Python worker at every driver's first data source resolution (a
``spark.read.parquet`` too), importing every ``pyspark_*`` module: this one imports nothing of
eosink until Spark asks it for a writer (eosink's data source module, with the meta store's
SQLAlchemy, took ~3-4 s of that worker's start).

:func:`eosink.register_datasource` (which :func:`eosink.spark_session` calls) is still worth
calling on the client: it also turns ``format("eosink")``'s errors into eosink's own and,
over Spark Connect, resolves relative paths against the client's working directory.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

__all__ = ["DefaultSource"]


class DefaultSource(DataSource):
    """``format("eosink")`` as Spark's lookup finds it: eosink's data source, imported when
    Spark asks for a writer (:class:`eosink._datasource.EosinkDataSource`)."""

    @classmethod
    def name(cls) -> str:
        return "eosink"

    def _source(self) -> Any:
        from eosink._datasource import EosinkDataSource

        return EosinkDataSource(self.options)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        return self._source().writer(schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return self._source().streamWriter(schema, overwrite)
