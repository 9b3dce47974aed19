"""Where a sink stages an epoch's data when the user does not say: the ``staging_path`` option.

A sink whose writers stage data that the coordinator publishes later (the kafka sink's
chunks) needs a location that the executors writing and the driver publishing both reach,
and that a driver restarted on another machine still finds. A sink options model that
declares a ``staging_path`` field defaulting to None gets it filled per run by
:func:`resolve_staging_path`, called by both front ends before anything is written:

* a stream: ``<checkpoint_location>/eosink/staging``. The checkpoint is the one location
  every driver of the query must reach anyway (and every executor, for stateful queries);
  Hadoop's ``s3a://`` / ``s3n://`` spellings become ``s3://``;
* a batch run on a local master (``local``, ``local[...]``): ``$EOSINK_HOME/<sink>-staging``
  on this machine's disk;
* a batch run on any other master: refused with a :class:`~eosink.errors.ConfigError`
  (there is no location every node is known to reach: the user must name one).

The value is validated by the sink's own options model like a value the user gave. A value
the user gave is kept as it is (on a cluster it must be shared; the sink may verify it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ._s3 import is_s3, normalize_s3
from .errors import ConfigError

log = logging.getLogger("eosink")

__all__ = [
    "STAGING_OPTION",
    "default_staging_path",
    "is_connect",
    "is_local_master",
    "resolve_staging_path",
    "spark_master",
    "staging_under_checkpoint",
]

STAGING_OPTION = "staging_path"
"""The name of the option a sink declares to have its staging location resolved."""

OptionsT = TypeVar("OptionsT", bound=BaseModel)


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs the driver and every executor in one process (``local``,
    ``local[4]``, ``local[*]``, ``local[2,3]``). ``local-cluster[...]`` is a cluster."""
    m = master.strip().lower()
    return m == "local" or m.startswith("local[")


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session (``SparkSession.builder.remote``):
    no JVM in this process; the driver is the Connect server's."""
    return spark is not None and type(spark).__module__.startswith("pyspark.sql.connect")


def spark_master(spark: Any) -> str | None:
    """The master of a SparkSession (classic or Spark Connect), or None if it cannot tell."""
    try:
        value = spark.conf.get("spark.master", None)
    except Exception:  # a session without the setting: unknown
        return None
    return str(value) if value else None


def staging_under_checkpoint(checkpoint_location: str) -> str:
    """``<checkpoint_location>/eosink/staging``: a local path made absolute, ``file:``
    stripped, ``s3a://`` and ``s3n://`` written ``s3://``, other schemes kept."""
    loc = checkpoint_location.strip()
    if is_s3(loc):
        base = normalize_s3(loc)
    elif loc.startswith("file:"):  # file:///x or Hadoop's file:/x
        base = str(Path(re.sub(r"^file:(//)?", "", loc)).expanduser().resolve())
    elif "://" in loc:
        base = loc
    else:
        base = str(Path(loc).expanduser().resolve())
    return f"{base.rstrip('/')}/eosink/staging"


def default_staging_path(sink: str, checkpoint_location: str | None, master: str | None) -> str:
    """The staging location of a run that gives none (see the module).

    Args:
        sink: the sink's name (``kafka``): the batch default is ``$EOSINK_HOME/<sink>-staging``.
        checkpoint_location: a stream's checkpoint location; None for a batch run.
        master: the Spark master of a batch run; None when it cannot be known (the driver
            side of ``format("eosink")`` runs in a Python worker without a SparkSession):
            taken as local.

    Raises:
        ConfigError: a batch run on a master that is not local.
    """
    if checkpoint_location:
        return staging_under_checkpoint(checkpoint_location)
    if master is not None and not is_local_master(master):
        raise ConfigError(
            f"sink {sink!r} stages every epoch before publishing it (option {STAGING_OPTION}); "
            f"on master {master!r} the executors that stage and the driver that publishes run "
            f"on different machines, so the default $EOSINK_HOME/{sink}-staging (a directory "
            "on each machine's own disk) cannot hold it. Set "
            f"{STAGING_OPTION} to a location every node reaches: a shared mount (NFS...) or "
            "s3://bucket/prefix (with the s3_* options)"
        )
    from ._metastore.engine import eosink_home

    return str((eosink_home() / f"{sink}-staging").resolve())


def resolve_staging_path(
    options: OptionsT,
    *,
    sink: str,
    checkpoint_location: str | None,
    master: str | Callable[[], str | None] | None,
) -> OptionsT:
    """``options`` with an unset ``staging_path`` filled in (:func:`default_staging_path`).

    Options models without a ``staging_path`` field, and options that give one, are returned
    unchanged. The filled-in value goes through the model's validators, as a given one does.

    Args:
        options: the sink's validated options.
        sink: the sink's name.
        checkpoint_location: a stream's checkpoint location; None for a batch run.
        master: the Spark master, or a function returning it (called only when a batch run
            needs it), or None when it cannot be known.

    Raises:
        ConfigError: a batch run on a master that is not local, or a derived location the
            sink refuses (e.g. an ``hdfs://`` checkpoint for a sink that stages on local
            disks and S3 only); before anything is written.
    """
    model = type(options)
    if STAGING_OPTION not in model.model_fields or getattr(options, STAGING_OPTION) is not None:
        return options
    if not checkpoint_location and callable(master):
        master = master()
    path = default_staging_path(sink, checkpoint_location, None if callable(master) else master)
    fields = model.model_fields
    data: dict[str, Any] = {
        (fields[name].alias or name): getattr(options, name) for name in options.model_fields_set
    }
    data.update(options.model_extra or {})
    key = fields[STAGING_OPTION].alias or STAGING_OPTION
    data[key] = path
    try:
        resolved = model.model_validate(data)
    except ValidationError as exc:
        try:
            model.model_validate({**data, key: None})
        except ValidationError:
            # The model cannot re-read its own values (a validator that is not idempotent):
            # fill the field alone.
            log.debug("sink %s: options not re-validated (%s)", sink, exc)
            return options.model_copy(update={STAGING_OPTION: path})
        from .sink import describe_option_errors

        where = (
            f"the checkpoint location {checkpoint_location!r}"
            if checkpoint_location
            else "this machine"
        )
        raise ConfigError(
            f"sink {sink!r}: the default {STAGING_OPTION} {path!r} (under {where}) cannot be "
            f"used: {describe_option_errors(model, exc)}. Set {STAGING_OPTION} (a location "
            "every node of the query reaches: a shared mount or s3://bucket/prefix), or change "
            "the option it conflicts with"
        ) from None
    log.debug("sink %s: %s=%s (default)", sink, STAGING_OPTION, path)
    return resolved
