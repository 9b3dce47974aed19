"""The ``iceberg`` sink's entry point: :data:`SINK` and the ``eosink_sinks`` hook.

The sink is a package (see ``docs/iceberg.md``, "Package layout"):

* ``options.py``: the options model, the catalog, secrets kept out of messages;
* ``transforms.py``: the ``partition_by`` grammar parsed once into typed terms;
* ``datafiles.py``: data file names (sink and epoch) and DataFile <-> JSON;
* ``writer.py``: the Python writer (Spark tasks, pyiceberg's Parquet writer);
* ``native.py``: the native path (Spark's own Parquet writer, on the driver), with
  ``native_checks.py`` (what it cannot express), ``native_plan.py`` (the projection) and
  ``native_files.py`` (the DataFiles of what Spark wrote);
* ``coordinator.py``: the phases, made of ``checks.py``, ``setup.py`` (the table, schema
  evolution), ``marker.py``, ``files.py`` (cleanup) and ``upsert.py``;
* ``cdc.py``: change-data-capture (``mode="upsert"``): staging and checks; ``rewrite.py``:
  its copy-on-write;
* ``_compat.py``: every use of pyiceberg internals, and the versions it is tested with.

Nothing here imports pyiceberg: without it the sink is still listed (``eosink plugins``).
"""

from __future__ import annotations

from typing import Any

import eosink
from eosink import JsonCodec, SinkPlugin

from .checks import validate_schema
from .coordinator import make_coordinator
from .options import IcebergSinkOptions
from .writer import make_writer

__all__ = ["SINK", "eosink_sinks"]

SINK: SinkPlugin[IcebergSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="iceberg",
    options_model=IcebergSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    committable_codec=JsonCodec[dict[str, Any]](version=1),
    default_sink_id=lambda o: f"iceberg:{o.catalog_name}.{o.table}",
    validate_schema=validate_schema,
    description="Apache Iceberg tables through pyiceberg (any catalog; local or S3 warehouse)",
    # pyiceberg is imported inside the factories only: without it the sink is still listed.
    requires={"pyiceberg": "eosink[iceberg]"},
    path_options=("warehouse",),
    capabilities=eosink.Capabilities(target_marker=True, staged_epochs=True, spark_writer=True),
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    """The iceberg sink."""
    return [SINK]
