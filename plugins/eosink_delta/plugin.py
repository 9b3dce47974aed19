"""The ``delta`` sink's entry point: :data:`SINK` and the ``eosink_sinks`` hook.

The sink is a package of modules with one job each (see ``docs/delta.md``, "Package layout"):

* ``options.py``: the options model, the table's location and filesystem, secrets kept out
  of messages;
* ``epochs.py``: which epochs the table holds, in its own app transactions (pure);
* ``stats.py``: Delta's file statistics from Parquet footers;
* ``layout.py``: the names of the sink's files in the table's directory;
* ``table.py``: opening and creating the table, what the sink refuses, schema evolution;
* ``s3check.py``: refusing an object store whose commits would not be atomic;
* ``writer.py``: the Python writer (Spark tasks); ``native.py``: Spark's own Parquet writer;
* ``changes.py``: change data capture (``mode="upsert"``): checks, winners, one MERGE;
* ``coordinator.py``: phase 1, the commit, abort, cleanup and the marker.

Nothing here imports deltalake: without it the sink is still listed (``eosink plugins``).
"""

from __future__ import annotations

from typing import Any

import eosink
from eosink import JsonCodec, SinkPlugin

from .coordinator import describe_open, make_coordinator
from .options import DeltaSinkOptions
from .writer import make_writer

__all__ = ["SINK", "eosink_sinks"]

SINK: SinkPlugin[DeltaSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="delta",
    options_model=DeltaSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    committable_codec=JsonCodec[dict[str, Any]](version=1),
    default_sink_id=lambda o: f"delta:{o.path}",
    description="Delta Lake tables through delta-rs (local or s3://; appends and upserts)",
    requires={"deltalake": "eosink[delta]"},
    path_options=("path",),
    describe_open=describe_open,
    capabilities=eosink.Capabilities(
        target_marker=True,
        staged_epochs=True,
        journal_home=True,
        spark_writer=True,
        epoch_spec=True,
    ),
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    """The delta sink."""
    return [SINK]
