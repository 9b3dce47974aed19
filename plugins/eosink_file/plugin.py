"""The ``file`` sink: Parquet, ORC, JSON lines, CSV or text files, local, on S3 or on a
Hadoop filesystem.

Layout under ``path`` (a local directory, an ``s3://bucket/prefix`` with the same keys, or a
Hadoop filesystem URI)::

    _eosink_staging/<sink key>/<epoch>/<attempt>/<partition dirs>/<file>           (staged)
    _eosink_staging/<sink key>/slots/<slot>-<start epoch>.<ext>   (an open file, local rows)
    <col=value>/.../part-<epoch>-<n>-<token>.<ext>                (published, every epoch)
    <col=value>/.../part-<start epoch>-s<sink key 8>.<ext>        (published, rolled)
    _eosink/<sink key>.json                                    (the sink's marker)
    _eosink/layout.json                         (format and partition_by, every sink's)
    _eosink/<sink key>.slots.json                              (open files, rolling)
    _eosink/commits/<sink key>/<epoch>[.roll-<n>].json         (the manifests)

Two writer kinds stage an epoch: Spark's own ``DataFrameWriter`` on the driver (the native
path, :class:`~eosink.sink.SparkWriter`; the rows never leave the JVM) or Python writers in
Spark tasks (``format("eosink")``, or ``writer="python"``). Readers (Spark, pyarrow, pandas)
ignore directories starting with ``_``, so staged files are invisible. ``commit`` publishes
each staged file with an atomic rename (fsync'd), then writes the epoch's manifest, and is
idempotent: a published file that is present with the committed size counts as done.
``abort`` deletes the epoch's staging directory; nothing else is ever written. With
rolling options files span epochs (:mod:`eosink_file._rolling`); on S3 files are multipart
uploads completed at commit (:mod:`eosink_file._s3`); on other Hadoop filesystems
(``hdfs://``...) the driver works through Spark's own FileSystem (:mod:`eosink_file._hadoop`).
Before an epoch is persisted, its staged files must hold the rows Spark wrote
(:meth:`~eosink_file.native.SparkStaging.check_spark_write`): a path that is not the same
directory on every node loses the remote tasks' files without an error from Spark.

The package: :mod:`~eosink_file.options` (the options model and the column checks),
:mod:`~eosink_file.layout` (partition directories, schema ids, the layout record),
:mod:`~eosink_file.writer` (the Python writers), :mod:`~eosink_file.coordinator` (the driver
side: publish and abort) with its parts :mod:`~eosink_file.native` (Spark's writers, the
staged-rows check), :mod:`~eosink_file.publish`, :mod:`~eosink_file.marker` (the layout
record and the marker) and :mod:`~eosink_file.state`, :mod:`~eosink_file.committed` (reading
whole epochs back); this module registers the
sink and keeps the names readers import (``from eosink_file.plugin import committed_files``).
"""

from __future__ import annotations

from typing import Any

import eosink
from eosink import JsonCodec, SinkPlugin

from ._rolling import describe_open
from .committed import committed_files
from .coordinator import FileCoordinator, make_coordinator
from .layout import validate_schema
from .options import FileSinkOptions
from .writer import FileWriter, make_writer

__all__ = [
    "SINK",
    "FileCoordinator",
    "FileSinkOptions",
    "FileWriter",
    "committed_files",
    "eosink_sinks",
    "validate_schema",
]


SINK: SinkPlugin[FileSinkOptions, dict[str, Any], dict[str, Any]] = SinkPlugin(
    name="file",
    options_model=FileSinkOptions,
    writer_factory=make_writer,
    coordinator_factory=make_coordinator,
    write_result_codec=JsonCodec[dict[str, Any]](version=1),
    committable_codec=JsonCodec[dict[str, Any]](version=1),
    default_sink_id=lambda o: f"file:{o.sink_path}",
    validate_schema=validate_schema,
    description="Parquet / ORC / JSON lines / CSV / text files, local or on S3, Hive "
    "partitions, files per epoch or rolling across epochs",
    # pyarrow only, a core dependency; s3:// paths need boto3 (eosink[s3]), checked when used
    requires={},
    describe_open=describe_open,
    capabilities=eosink.Capabilities(
        target_marker=True, staged_epochs=True, journal_home=True, spark_writer=True, rolling=True
    ),
)


@eosink.hookimpl
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:
    return [SINK]
