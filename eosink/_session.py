"""Spark set-up: Java found, a session for eosink, Spark's own logging quiet by default."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import sys
from typing import TYPE_CHECKING

from . import _spark_version
from ._metastore import eosink_home
from .errors import ConfigError, EosinkError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eosink")

__all__ = [
    "SPARK_LOG_LEVELS",
    "find_java",
    "spark_session",
]


def find_java() -> str:
    """Return JAVA_HOME for Spark, finding Java 17+ if JAVA_HOME is unset.

    Raises:
        EosinkError: no Java installation found, with how to install one.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return home
    java = shutil.which("java")
    if java:
        return os.path.dirname(os.path.dirname(os.path.realpath(java)))
    for cand in sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True):
        return os.path.dirname(os.path.dirname(cand))
    raise EosinkError(
        "Spark needs Java 17 or newer and none was found (no JAVA_HOME, no `java` on PATH). "
        "Install one, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME."
    )


SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
"""The log4j levels ``spark_session(log_level=...)`` and ``EOSINK_SPARK_LOG_LEVEL`` accept."""

_LOG4J2 = """\
# Written by eosink.spark_session(): Spark's own log level ({level}) from the JVM's start.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# pyspark's JVM starts as a shell: Spark takes this logger's level (WARN when it has none)
# for the console; the root's level keeps it from printing "Setting default log level to".
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
# Spark's own defaults for noisy third-party loggers.
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = {jetty}
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = {parquet}
"""


def _spark_log_level(log_level: str | None) -> tuple[str, bool]:
    """The log level Spark should start at, and whether the caller asked for it explicitly.

    Raises:
        ConfigError: not a log4j level.
    """
    given = log_level or os.environ.get("EOSINK_SPARK_LOG_LEVEL") or None
    level = (given or "ERROR").strip().upper()
    if level not in SPARK_LOG_LEVELS:
        src = "log_level" if log_level else "EOSINK_SPARK_LOG_LEVEL"
        raise ConfigError(
            f"{src}={given!r} is not a Spark log level; use one of {', '.join(SPARK_LOG_LEVELS)}"
        )
    return level, given is not None


def _own_log4j_config(conf: dict[str, str]) -> bool:
    """Whether the user configures Spark's log4j already (then eosink leaves it alone)."""
    if os.environ.get("LOG4J_CONFIGURATION_FILE"):
        return True
    opts = [os.environ.get("PYSPARK_SUBMIT_ARGS", ""), *conf.values()]
    if any("log4j2.configurationFile" in o for o in opts):
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    return bool(conf_dir and glob.glob(os.path.join(conf_dir, "log4j2*")))


def _log4j2_file(level: str) -> str | None:
    """A log4j2 properties file setting Spark's root level to ``level`` (under
    ``$EOSINK_HOME/spark``), or None when it cannot be written."""

    def quieter(floor: str) -> str:  # a noisy logger: never more verbose than ``floor``
        return SPARK_LOG_LEVELS[min(SPARK_LOG_LEVELS.index(level), SPARK_LOG_LEVELS.index(floor))]

    text = _LOG4J2.format(level=level, jetty=quieter("WARN"), parquet=quieter("ERROR"))
    path = str(eosink_home() / "spark" / f"log4j2-{level.lower()}.properties")
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("cannot write %s (%s): Spark's level is set once it runs", path, exc)
        return None
    return path


def _submitted() -> bool:
    """Whether this driver's master comes from elsewhere: a JVM started by ``spark-submit``
    (or the pyspark shell: ``PYSPARK_GATEWAY_PORT``), or ``--master`` in
    ``PYSPARK_SUBMIT_ARGS``."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT")) or "--master" in os.environ.get(
        "PYSPARK_SUBMIT_ARGS", ""
    )


def spark_session(
    master: str | None = None,
    app_name: str = "eosink",
    *,
    log_level: str | None = None,
    remote: str | None = None,
    **conf: str,
) -> SparkSession:
    """A SparkSession set up for eosink: Java found, executors on this Python, Arrow on.

    Spark's own log lines are quiet by default: its log level is ``ERROR`` from the JVM's
    first line on (a log4j2 configuration file under ``$EOSINK_HOME/spark`` handed to the JVM
    through ``LOG4J_CONFIGURATION_FILE``), so start-up warnings (hostname resolving to a
    loopback address, native-hadoop library, log4j profile...) are not printed. eosink's own
    logging (logger ``eosink``) is not affected. Your own log4j2 configuration wins: with
    ``LOG4J_CONFIGURATION_FILE``, ``-Dlog4j2.configurationFile`` in ``PYSPARK_SUBMIT_ARGS``
    or a Spark setting, or a ``log4j2*`` file in ``SPARK_CONF_DIR``, eosink does not change
    Spark's logging unless a level is asked for explicitly (then ``setLogLevel``).

    Args:
        master: Spark master URL (``local[2]``, ``spark://host:7077``...). Default: the
            master ``spark-submit`` gave the application (``--master``, also through
            ``PYSPARK_SUBMIT_ARGS``), else ``local[2]``. A submitted job on a cluster keeps
            its cluster.
        app_name: application name.
        log_level: Spark's log level: ``OFF``, ``FATAL``, ``ERROR``, ``WARN``, ``INFO``,
            ``DEBUG``, ``TRACE`` or ``ALL`` (case-insensitive). Default: the environment
            variable ``EOSINK_SPARK_LOG_LEVEL``, else ``ERROR``. ``WARN`` brings back what
            pyspark prints by default. When a SparkContext is already running, an explicit
            level is applied with ``setLogLevel`` and the default leaves it alone.
        remote: a Spark Connect server's URL (``sc://host:15002``): a Connect client session
            instead (needs ``pip install 'eosink[connect]'``; ``master`` is then the
            server's business; ``local[2]`` starts a local server, as pyspark does).
            ``format("eosink")`` is registered with it too. Default: ``SPARK_REMOTE`` when
            set and no ``master`` is given, as pyspark's builder does.
        **conf: extra Spark settings (dots written as ``__``: ``spark__ui__enabled="false"``).

    Raises:
        ConfigError: ``log_level`` or ``EOSINK_SPARK_LOG_LEVEL`` is not a log level; or
            ``remote`` with ``master``.
        MissingExtraError: ``remote`` without the Spark Connect client packages.
        EosinkError: no Java 17+ found.
    """
    if master is not None and master.startswith("sc://"):
        raise ConfigError(
            f"master={master!r} is a Spark Connect server: use "
            f"eosink.spark_session(remote={master!r})"
        )
    if remote is None and master is None and os.environ.get("SPARK_REMOTE"):
        remote = os.environ["SPARK_REMOTE"]  # as pyspark's builder does
    if remote is not None:
        return _connect_session(remote, master, app_name, conf)
    level, explicit = _spark_log_level(log_level)
    os.environ["JAVA_HOME"] = find_java()
    if master is None and not _submitted():
        master = "local[2]"
    if master is not None and master.startswith("local"):
        # Executors on this machine run this Python. On a cluster the executors' Python
        # is the cluster's (spark.pyspark.python, PYSPARK_PYTHON): this driver's path may
        # not exist on the nodes.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    b = SparkSession.builder if master is None else SparkSession.builder.master(master)
    b = b.appName(app_name).config("spark.sql.execution.arrow.pyspark.enabled", "true")
    if master is not None and master.startswith("local"):
        # A laptop's defaults. On a cluster (a submitted job) the cluster's own settings
        # and spark-submit's --conf stand: two shuffle partitions would starve it.
        b = (
            b.config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
        )
    for k, v in conf.items():
        b = b.config(k.replace("__", "."), v)
    running = SparkContext._active_spark_context is not None
    own = running or _own_log4j_config(conf)
    config = None if own else _log4j2_file(level)
    if config:  # read by log4j in the JVM spark-submit starts (inherits this environment)
        os.environ["LOG4J_CONFIGURATION_FILE"] = config
    try:
        spark = b.getOrCreate()
    finally:
        if config:
            os.environ.pop("LOG4J_CONFIGURATION_FILE", None)
    if (explicit and own) or not (own or config):
        spark.sparkContext.setLogLevel(level)
    prepare_session(spark)
    return spark


def _connect_session(
    remote: str, master: str | None, app_name: str, conf: dict[str, str]
) -> SparkSession:
    """A Spark Connect client session for eosink (see :func:`spark_session`)."""
    if master is not None:
        raise ConfigError(
            f"spark_session(remote={remote!r}) connects to a Spark Connect server, whose "
            f"master is its own: drop master={master!r}"
        )
    import importlib

    for module in ("grpc", "grpc_status", "google.protobuf", "zstandard"):
        try:
            importlib.import_module(module)
        except ImportError:
            from .errors import MissingExtraError

            raise MissingExtraError(module, "connect", "Spark Connect clients") from None
    if remote.startswith("local"):
        # pyspark starts a Connect server in a JVM of this machine: its Python workers (the
        # foreachBatch worker, UDFs) run this Python.
        os.environ["JAVA_HOME"] = find_java()
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.remote(remote).appName(app_name)
    for k, v in conf.items():
        b = b.config(k.replace("__", "."), v)
    spark = b.getOrCreate()
    prepare_session(spark)
    return spark


def register_datasource(spark: SparkSession) -> None:
    """Register ``format("eosink")`` with a SparkSession (:func:`spark_session` does it).

    Also makes the errors of ``format("eosink")`` come out as eosink's own errors on this
    driver. Raises :class:`~eosink.ConfigError` on pyspark 3.5, which has no Python data
    sources (write with :func:`eosink.run` there).
    """
    _spark_version.require_python_data_sources()
    prepare_session(spark)


def prepare_session(spark: SparkSession) -> None:
    """What eosink does to a session it starts or is given: its Kafka connector and Iceberg
    runtime jars are checked against its Spark and Scala versions, eosink's errors come out
    of Spark's as themselves, and ``format("eosink")`` is registered where Spark has Python
    data sources (Spark 4; on 3.5 a ``format("eosink")`` write fails with the error of
    :func:`~eosink._spark_version.format_eosink_unsupported`)."""
    from ._logs import default_logging
    from ._spark_errors import _install_error_conversion
    from ._staging import is_connect

    _spark_version.check_connectors(spark)
    default_logging()
    _install_error_conversion(connect=is_connect(spark))
    if _spark_version.PYTHON_DATA_SOURCES:
        from ._datasource import register

        register(spark)
