"""The Spark lines eosink runs on, and what differs between them: one place.

eosink supports pyspark 3.5 (the LTS line of EMR 7, Glue 5, Dataproc 2.2, Databricks 15.4)
and every 4.x line. What differs, decided here by the running pyspark's version (never by
``try/except ImportError`` elsewhere):

* ``format("eosink")`` is a Python data source (``pyspark.sql.datasource``), an API Spark 4
  added: on 3.5 it does not exist, and :func:`require_python_data_sources` raises a
  :class:`~eosink.ConfigError` that names the version and the alternative
  (:func:`eosink.run`, the same sinks with the same guarantees).
* A data source's stream writer gets Arrow batches from 4.1 on, Rows on 4.0; pyspark's
  ``to_arrow_schema`` takes a time zone from 4.2 on (:data:`ARROW_STREAM_WRITERS`,
  :data:`ARROW_SCHEMA_TIMEZONE`).
* Spark 4 looks up installed ``pyspark_*`` data source modules by itself; 3.5 does not.
* Spark 4.0 refuses to register a data source name twice (``DATA_SOURCE_ALREADY_EXISTS``)
  and its lookup of installed ``pyspark_*`` modules may have registered ``eosink`` already;
  later lines replace it (:func:`register_data_source`).
* A DataFrame's ``Observation`` is completed when its write returns on 4.x; on 3.5 a
  query listener completes it a moment later, from Spark's listener bus
  (:func:`observed`).
* Spark's Kafka connector and Iceberg's Spark runtime are built per Spark line and Scala
  version: :func:`check_connectors` refuses one of another Scala version, another Spark
  major version or a newer minor line at start, with the coordinates that match
  (:func:`connector_problems`).
* An error's condition is ``getCondition()`` on 4.x, ``getErrorClass()`` on 3.5
  (:func:`condition`).
* Spark Connect on 3.5 has no ``Observation`` (``df.observe``), which the native write path
  counts its rows with: over Connect on 3.5 every sink writes with the Python writers
  (:data:`CONNECT_OBSERVATION`); nor does its client get a failed stream's cause, so the
  restart policy does not restart a stream there (:data:`CONNECT_FAILURE_CAUSE`).

The other seams (the checkpoint's logs, the JVM gateway, error conversion) read the same on
3.5 and 4.x so far; a difference found later is added here.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pyspark

from .errors import ConfigError

log = logging.getLogger("eosink")

__all__ = [
    "ARROW_SCHEMA_TIMEZONE",
    "ARROW_STREAM_WRITERS",
    "CONNECT_FAILURE_CAUSE",
    "CONNECT_OBSERVATION",
    "PYSPARK",
    "PYTHON_DATA_SOURCES",
    "check_connectors",
    "condition",
    "connector_problems",
    "format_eosink_unsupported",
    "observed",
    "register_data_source",
    "require_python_data_sources",
]


def _line(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:  # pragma: no cover - pyspark always has a numbered version
        raise ConfigError(f"pyspark version {version!r} cannot be read")
    return int(m.group(1)), int(m.group(2))


PYSPARK = _line(pyspark.__version__)
"""The running pyspark's line, e.g. ``(3, 5)``."""

PYTHON_DATA_SOURCES = PYSPARK >= (4, 0)
"""Whether Spark's Python data source API exists, which ``format("eosink")`` is."""

ARROW_STREAM_WRITERS = PYSPARK >= (4, 1)
"""Whether a Python data source's stream writer gets Arrow batches
(``DataSourceStreamArrowWriter``, 4.1); 4.0 hands it Rows."""

ARROW_SCHEMA_TIMEZONE = PYSPARK >= (4, 2)
"""Whether pyspark's ``to_arrow_schema`` takes the session's time zone (4.2, SPARK-54903;
not 4.1.x, where the release matrix found a ``TypeError``); before, it writes timestamps as
UTC."""


CONNECT_OBSERVATION = PYSPARK >= (4, 0)
"""Whether a Spark Connect DataFrame has ``observe(Observation)`` (4.0; 3.5 raises
``NOT_IMPLEMENTED``): without it, Spark's own writers (the native path) are not used over
Connect."""


CONNECT_FAILURE_CAUSE = PYSPARK >= (4, 0)
"""Whether a Spark Connect client's ``StreamingQueryException`` carries the failure's cause.
On 3.5 it says ``terminated with exception: `` and nothing more (found by the release
matrix's 3.5 row, a server worker SIGKILLed): the restart policy cannot tell a transient
failure there, and the stream ends with the error; start it again (it resumes exactly
once)."""


def format_eosink_unsupported() -> ConfigError:
    """The error of ``format("eosink")`` on a Spark without Python data sources."""
    return ConfigError(
        f'format("eosink") is a Python data source, an API Spark 4.0 added; this is pyspark '
        f"{pyspark.__version__}. Write with eosink.run(df, sink=..., ...) instead (the same "
        "sinks, batch and streaming, with the same exactly-once guarantees), or upgrade to "
        "pyspark>=4.0"
    )


def require_python_data_sources() -> None:
    """Raise :func:`format_eosink_unsupported` on a Spark without Python data sources."""
    if not PYTHON_DATA_SOURCES:
        raise format_eosink_unsupported()


def condition(exc: object) -> str | None:
    """A pyspark exception's error condition (``getCondition`` on Spark 4, ``getErrorClass``
    on 3.5); None for other exceptions.

    A Python error raised in a task (a writer's, a UDF's) is ``PYTHON_EXCEPTION`` on every
    line: pyspark 4.2 and later give its ``PythonException`` that condition, with the
    traceback among its message parameters; 4.0 and 4.1 give it none (the release matrix's
    first 4.1 run found ``format("eosink")``'s errors of a task raised as Spark's there)."""
    for name in ("getCondition", "getErrorClass"):
        get = getattr(exc, name, None)
        if get is not None:
            value = get()
            if value is None and type(exc).__name__ == "PythonException":
                return "PYTHON_EXCEPTION"
            return str(value) if value is not None else None
    return None


def register_data_source(spark: Any, source: type) -> None:
    """``spark.dataSource.register(source)``; on Spark 4.0, where a name registers once,
    the name being registered already (by Spark's lookup of the installed ``pyspark_eosink``
    module, which is eosink's own data source) is not an error."""
    try:
        spark.dataSource.register(source)
    except Exception as exc:
        if condition(exc) != "DATA_SOURCE_ALREADY_EXISTS":
            raise
        log.debug("data source %s was registered already (pyspark %s)", source, PYSPARK)


OBSERVATION_WAIT_S = 10.0
"""How long :func:`observed` waits for Spark 3.5's listener bus to complete an observation."""


def observed(jo: Any) -> bool:
    """Whether the query that was to fill the Java ``Observation`` ``jo`` ran: at once on
    Spark 4; on 3.5 its query listener completes it from the listener bus, after the write
    returned, so wait for it (at most :data:`OBSERVATION_WAIT_S`: a write that never ran
    never completes it)."""
    deadline = time.monotonic() + OBSERVATION_WAIT_S
    while not jo.future().isCompleted():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


_KAFKA = re.compile(
    r"(?:org\.apache\.spark:)?spark-sql-kafka-0-10_(?P<scala>\d+\.\d+)[:-](?P<version>\d+\.\d+[\w.-]*?)(?:\.jar)?$"
)
_ICEBERG = re.compile(
    r"(?:org\.apache\.iceberg:)?iceberg-spark-runtime-(?P<line>\d+\.\d+)_(?P<scala>\d+\.\d+)"
    r"(?:[:-](?P<version>\d[\w.-]*?))?(?:\.jar)?$"
)


def connector_problems(jars: str, spark: str, scala: str) -> tuple[list[str], list[str]]:
    """The errors and warnings of the Spark Kafka connectors and Iceberg Spark runtimes among
    ``jars`` (``spark.jars`` and ``spark.jars.packages``: paths, URLs or Maven coordinates,
    comma-separated) for Spark ``spark`` (``"3.5.9"``) built with Scala ``scala``
    (``"2.12"``).

    Errors: another Scala version, another Spark major version, or a *newer* minor line than
    the running Spark's (each is a class or method Spark does not have, at the query's first
    batch: Spark 4.2's Kafka connector on Spark 4.1 fails with a ``NoSuchMethodError`` in
    ``KafkaSourceInitialOffsetWriter``). Warnings: an older minor line of the same major
    (eosink's tests run pyspark 4.3 with the 4.2 Kafka connector, the newest on Maven
    Central; it works).
    """
    errors: list[str] = []
    warnings: list[str] = []
    line = ".".join(spark.split(".")[:2])
    for item in (j.strip() for j in jars.split(",")):
        name = item.rsplit("/", 1)[-1]
        if m := _KAFKA.search(name):
            what, their_scala, their = "Spark's Kafka connector", m["scala"], m["version"]
            right = f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}"
        elif m := _ICEBERG.search(name):
            what, their_scala, their = "Iceberg's Spark runtime", m["scala"], m["line"]
            version = m["version"] or "<iceberg version>"
            right = f"org.apache.iceberg:iceberg-spark-runtime-{line}_{scala}:{version}"
        else:
            continue
        their_line = ".".join(their.split(".")[:2])
        said = (
            f"{what} {item} is built for Spark {their_line} with Scala {their_scala}; this is "
            f"Spark {spark} with Scala {scala}: use {right}"
        )
        if their_scala != scala or their_line.split(".")[0] != line.split(".")[0]:
            errors.append(said)
        elif _line_key(their_line) > _line_key(line):
            errors.append(said + f" (a newer line than Spark {line}'s, or the newest {line}.x)")
        elif their_line != line:
            warnings.append(said + " (an older minor line: it may work)")
    return errors, warnings


def _line_key(line: str) -> tuple[int, ...]:
    """``"4.10"`` as ``(4, 10)``, to order lines as numbers, not strings."""
    return tuple(int(p) for p in line.split(".") if p.isdigit())


_CHECKED: set[int] = set()


def check_connectors(spark: Any) -> None:
    """Refuse, before any epoch, a session whose ``spark.jars`` or ``spark.jars.packages``
    name a Kafka connector or an Iceberg runtime of another Scala version, another Spark
    major version or a newer minor line (:func:`connector_problems`); warn for an older
    minor line. Once per session; a
    session whose JVM eosink cannot read (Spark Connect, a vendor runtime that blocks it)
    is not checked."""
    key = id(spark)
    if key in _CHECKED:
        return
    try:
        conf = spark.sparkContext.getConf()
        jars = ",".join(conf.get(k, "") or "" for k in ("spark.jars", "spark.jars.packages"))
        props = spark.sparkContext._jvm.scala.util.Properties
        scala = ".".join(str(props.versionNumberString()).split(".")[:2])
        version = str(spark.version)
    except Exception as exc:  # no JVM here: nothing to check
        log.debug("connector jars not checked: %s", exc)
        return
    _CHECKED.add(key)
    errors, warnings = connector_problems(jars, version, scala)
    for w in warnings:
        log.warning("%s", w)
    if errors:
        raise ConfigError(
            "; ".join(errors) + ". Set it in spark.jars.packages (or spark.jars) before the "
            "session starts: a new Python process"
        )
