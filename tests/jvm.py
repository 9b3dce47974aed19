"""JVM artifacts from Maven Central, cached, and the Apache Kafka broker the tests start.

``fetch(["org.apache.kafka:kafka_2.13:4.1.1"])`` resolves the artifacts and their runtime
dependencies with Maven (``mvn dependency:copy-dependencies``) into
``~/.cache/eosink/jars/<key>/`` (``EOSINK_JAR_CACHE`` overrides the root), once: later calls
reuse the directory. The key is a digest of the sorted coordinates, so each set of
coordinates has its own directory and a partial download is never mistaken for a complete
one (a ``.complete`` file is written last).

``KafkaBroker`` starts a real single-node Apache Kafka (KRaft mode, combined broker and
controller) as a JVM process on free loopback ports, in a temp directory.

``spark_kafka_jars()`` / ``spark_kafka_conf()``: Spark's Kafka connector of the running line
(``spark_kafka_coordinates()``) for a new Spark driver that reads or writes Kafka with
``format("kafka")``.

Used by the test fixtures and by ``bench/``; needs ``mvn`` and ``java`` (17+) on the machine,
and says so when either is missing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

KAFKA_VERSION = "4.1.1"
KAFKA = f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}"
# Kafka logs through SLF4J 1.7: log4j2 prints it (Kafka's own scripts ship the same binding).
KAFKA_RUNTIME = [KAFKA, "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"]
KAFKA_TOOLS = [f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}", *KAFKA_RUNTIME]
"""Kafka's command line tools (``kafka-console-consumer``'s class among them)."""

# JVM flags that make short-lived test JVMs start faster and use less memory.
FAST_JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


class MissingToolError(RuntimeError):
    """``mvn`` or ``java`` is not installed."""


def cache_root() -> Path:
    root = os.environ.get("EOSINK_JAR_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "eosink" / "jars"


def _tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None and name == "java" and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        path = str(candidate) if candidate.exists() else None
    if path is None:
        raise MissingToolError(f"'{name}' is not installed or not on the PATH: {hint}")
    return path


def java() -> str:
    return _tool("java", "install Java 17+ (apt-get install openjdk-17-jre-headless)")


def _pom(coordinates: Sequence[str]) -> str:
    deps = []
    for coord in coordinates:
        parts = coord.split(":")
        if len(parts) != 3:
            raise ValueError(f"Maven coordinates must be group:artifact:version, got {coord!r}")
        g, a, v = parts
        deps.append(
            f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
            f"<version>{v}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>eosink.cache</groupId><artifactId>jars</artifactId><version>1</version>"
        f"<dependencies>{''.join(deps)}</dependencies></project>"
    )


_CENTRAL_ONLY = (
    "<settings><mirrors><mirror><id>central-for-all</id><mirrorOf>*</mirrorOf>"
    "<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>"
)


def fetch(coordinates: Sequence[str], timeout: float = 900) -> list[Path]:
    """The jars of ``coordinates`` and their runtime dependencies, fetched once and cached.

    Args:
        coordinates: Maven coordinates ``group:artifact:version``.
        timeout: seconds Maven may take for a first download.

    Returns:
        Every jar of the resolved set (sorted paths).

    Raises:
        MissingToolError: ``mvn`` is not installed (only when the set is not cached yet).
        RuntimeError: Maven failed; the message carries the end of its output.
    """
    key = hashlib.sha256("\n".join(sorted(coordinates)).encode()).hexdigest()[:16]
    target = cache_root() / key
    done = target / ".complete"
    if not done.exists():
        mvn = _tool("mvn", "install Maven (apt-get install maven) to fetch JVM test artifacts")
        target.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="eosink-mvn-"))
        try:
            (work / "pom.xml").write_text(_pom(coordinates))
            # Spark's POMs name extra repositories (a GCS mirror) that this network cannot
            # reach and Maven stops at the first unreachable one: send every repository to
            # Maven Central. EOSINK_MAVEN_SETTINGS names a settings.xml to use instead.
            settings = os.environ.get("EOSINK_MAVEN_SETTINGS")
            if not settings:
                settings = str(work / "settings.xml")
                Path(settings).write_text(_CENTRAL_ONLY)
            staging = target / f".partial-{uuid.uuid4().hex[:8]}"
            proc = subprocess.run(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-s",
                    settings,
                    "-f",
                    str(work / "pom.xml"),
                    "dependency:copy-dependencies",
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={staging}",
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if proc.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                raise RuntimeError(
                    f"mvn could not fetch {', '.join(coordinates)} "
                    f"(exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
                )
            for jar in staging.iterdir():
                os.replace(jar, target / jar.name)
            staging.rmdir()
            (target / "coordinates.txt").write_text("\n".join(coordinates) + "\n")
            done.write_text("ok\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return sorted(target.glob("*.jar"))


def classpath(coordinates: Sequence[str]) -> str:
    return os.pathsep.join(str(p) for p in fetch(coordinates))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"Kafka exited with {proc.returncode} while starting:\n{log.read_text()[-4000:]}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(
        f"Kafka did not listen on {port} in {timeout:.0f} s:\n{log.read_text()[-4000:]}"
    )


class KafkaBroker:
    """A single-node Apache Kafka in KRaft mode on 127.0.0.1, started as a JVM process.

    ``bootstrap`` is ``127.0.0.1:<port>``. One partition per topic by default, replication
    factor 1 everywhere (transactions included). ``stop()`` kills the process group and
    deletes the log directory; ``restart()`` keeps the data (a broker outage).
    """

    def __init__(self, base: Path | None = None, heap: str = "384m") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eosink-kafka-", dir=base))
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.heap = heap
        self.cp = classpath(KAFKA_RUNTIME)
        self.config = self.root / "server.properties"
        self.config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={self.root / 'data'}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "transaction.state.log.num.partitions=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    "log.flush.interval.messages=1",
                    "",
                ]
            )
        )
        self.log = self.root / "kafka.log"
        self._format()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def _java(self, main: str, *args: str) -> list[str]:
        log4j = self.root / "log4j2.yaml"
        if not log4j.exists():
            log4j.write_text(
                "Configuration:\n  Appenders:\n    Console:\n      name: STDOUT\n"
                "      PatternLayout:\n        pattern: '[%d] %p %m (%c)%n'\n"
                "  Loggers:\n    Root:\n      level: WARN\n"
                "      AppenderRef:\n        - ref: STDOUT\n"
            )
        return [
            java(),
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            *FAST_JVM_FLAGS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            self.cp,
            main,
            *args,
        ]

    def _format(self) -> None:
        cluster_id = "eosinkTestCluster0000A"  # 22 characters of base64, as Kafka wants
        proc = subprocess.run(
            self._java(
                "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config)
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed:\n{proc.stdout}{proc.stderr}")

    def start(self, timeout: float = 90) -> None:
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self._java("kafka.Kafka", str(self.config)),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        fh.close()
        _wait_port(self.port, self.proc, timeout, self.log)

    def kill(self) -> None:
        """SIGKILL the broker (its data stays)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def console_consume(self, topic: str, isolation: str = "read_committed") -> list[str]:
        """The values of every record of ``topic`` as Kafka's own Java console consumer
        (``kafka-console-consumer --from-beginning --isolation-level ...``) prints them:
        an independent reader beside the tests' confluent-kafka (librdkafka) one."""
        cmd = self._java(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server",
            self.bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--isolation-level",
            isolation,
            "--timeout-ms",
            "5000",  # idle this long after the last record: the end of the topic
        )
        cmd[cmd.index("-cp") + 1] = classpath(KAFKA_TOOLS)
        tools_log = self.root / "log4j2-tools.yaml"  # the tool's own logs: not on stdout
        tools_log.write_text(
            "Configuration:\n  Appenders:\n    Console:\n      name: STDERR\n"
            "      target: SYSTEM_ERR\n      PatternLayout:\n        pattern: '%p %m%n'\n"
            "  Loggers:\n    Root:\n      level: WARN\n"
            "      AppenderRef:\n        - ref: STDERR\n"
        )
        cmd = [
            f"-Dlog4j2.configurationFile={tools_log}" if a.startswith("-Dlog4j2") else a
            for a in cmd
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert "Processed a total of" in proc.stderr, proc.stderr[-3000:]
        return [line for line in proc.stdout.splitlines() if line.strip()]

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)]
        )
        futures[name].result(timeout=60)


# ---------------------------------------------------------------------------------------
# Class-data sharing for the many short-lived Spark drivers of the crash tests
# ---------------------------------------------------------------------------------------
_CDS_WORKLOAD = """
import os, sys, tempfile
os.environ["PYSPARK_PYTHON"] = sys.executable
import eosink
from pyspark import SparkContext
tmp = tempfile.mkdtemp(prefix="eosink-cds-")
spark = eosink.spark_session("local[2]", app_name="eosink-cds")
spark.sparkContext.setLogLevel("ERROR")
df = spark.range(0, 2000).selectExpr("id", "cast(id % 3 as string) as grp", "'x' as payload")
df.write.parquet(tmp + "/input")
meta = "sqlite:///" + tmp + "/m.db"
eosink.run(df, sink="file", path=tmp + "/batch", partition_by=["grp"], epoch=1, metastore_url=meta)
sdf = spark.readStream.schema(df.schema).option("maxFilesPerTrigger", 1).parquet(tmp + "/input")
h = eosink.run(sdf, sink="file", path=tmp + "/stream", checkpoint_location=tmp + "/chk",
               trigger={"availableNow": True}, metastore_url=meta)
h.await_termination()
spark.read.parquet(tmp + "/stream").count()
proc = SparkContext._gateway.proc
try:
    spark._jvm.java.lang.System.exit(0)  # a normal JVM exit writes the archive
except Exception:
    pass
proc.wait(timeout=300)
import shutil
shutil.rmtree(tmp, ignore_errors=True)
"""


def _java_version() -> str:
    out = subprocess.run([java(), "-version"], capture_output=True, text=True, check=True)
    return out.stderr.strip()


@functools.cache
def spark_cds_archive_path(python: Path | None = None) -> Path:
    """Where the class-data-sharing archive of this Java and pyspark lives (may not exist);
    with ``python``, of that interpreter's pyspark (another Spark line's environment,
    bench/_pylines.py).

    Loading Spark's classes from a dynamic CDS archive cuts a driver's start (session and
    first job) by about a third on this 2-core machine, and the crash tests start ~150
    drivers. The archive is valid for the driver's classpath only, so it is given to driver
    JVMs alone (``--driver-java-options``, see ``driver_submit_args``).
    """
    if python is None:
        import pyspark

        version = pyspark.__version__
        jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    else:
        out = subprocess.run(
            [str(python), "-c", _LINE_JARS], capture_output=True, text=True, check=True
        ).stdout.split()
        version, jars = out[0], out[1:]
    key = hashlib.sha256("\n".join([_java_version(), version, *jars]).encode()).hexdigest()[:16]
    return cache_root().parent / "cds" / f"spark-driver-{key}.jsa"


_LINE_JARS = """
import os, pyspark
print(pyspark.__version__)
print(*sorted(n for n in os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
              if n.endswith(".jar")))
"""


def build_spark_cds_archive(
    archive: Path, python: str, timeout: float = 600, env: dict[str, str] | None = None
) -> bool:
    """Build ``archive`` by running a small batch and streaming eosink job once with
    ``python`` (in ``env``: this process's environment by default).

    The JVM writes the archive when it exits normally (``-XX:ArchiveClassesAtExit``); it is
    written beside the target and renamed into place, so readers never see a partial one.
    Returns whether the archive exists afterwards.
    """
    if archive.exists():
        return True
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    env = dict(os.environ if env is None else env)
    env["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options '-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off' pyspark-shell"
    )
    try:
        proc = subprocess.run(
            [python, "-c", _CDS_WORKLOAD], env=env, capture_output=True, text=True, timeout=timeout
        )
        ok = proc.returncode == 0 and partial.exists() and partial.stat().st_size > 0
    except subprocess.TimeoutExpired:
        ok = False
    if ok:
        os.replace(partial, archive)
    partial.unlink(missing_ok=True)
    return archive.exists()


def fast_driver_env(env: dict[str, str], archive: str | None = None) -> dict[str, str]:
    """``env`` for a short-lived Spark driver program: the C1 JIT only
    (:data:`FAST_JVM_FLAGS`) and Spark's classes from a CDS archive if it exists, as the crash
    tests' drivers start (unless ``env`` sets its own). ``archive``: its path, ``"0"`` for
    none; by default conftest's (``EOSINK_TEST_CDS``: this environment's pyspark)."""
    env = dict(env)
    env.setdefault("JDK_JAVA_OPTIONS", " ".join(FAST_JVM_FLAGS))
    if archive is None:
        archive = env.get("EOSINK_TEST_CDS", os.environ.get("EOSINK_TEST_CDS", "0"))
    submit = driver_submit_args(Path(archive)) if archive != "0" else None
    if submit and "PYSPARK_SUBMIT_ARGS" not in env:
        env["PYSPARK_SUBMIT_ARGS"] = submit
    return env


def driver_submit_args(archive: Path) -> str | None:
    """``PYSPARK_SUBMIT_ARGS`` that start a Spark driver from ``archive``, if it exists yet."""
    if not archive.exists():
        return None
    # -Xshare:auto: an archive that does not match is ignored, never an error.
    return (
        f"--driver-java-options '-XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds=off' "
        "pyspark-shell"
    )


# ---------------------------------------------------------------------------------------
# Spark's Kafka connector (Kafka as a Spark source, Spark's own Kafka sink)
# ---------------------------------------------------------------------------------------
# Spark's Kafka connector is built per Spark line: a newer line's on an older Spark fails at the
# first micro-batch (4.2.0's on pyspark 4.1.4: NoSuchMethodError in
# KafkaSourceInitialOffsetWriter), so the tests take the running line's own: a patch release
# whose whole dependency set this network's Maven Central serves (December 2026: 4.0.0, 4.1.1,
# 4.2.0 and 3.5.0 resolve; 4.0.1-4.0.4, 4.1.3 and 3.5.5-3.5.9 miss their token provider or
# the connector itself). Central has none for 4.3 yet; the 4.2.0 connector works with
# pyspark 4.3.0 (batch and streaming reads with kafka.isolation.level=read_committed, batch
# and streaming writes: tests/test_kafka_source.py).
SPARK_KAFKA_BY_LINE = {
    "3.5": ("2.12", "3.5.0"),
    "4.0": ("2.13", "4.0.0"),
    "4.1": ("2.13", "4.1.1"),
    "4.2": ("2.13", "4.2.0"),
    "4.3": ("2.13", "4.2.0"),
}


def spark_kafka_coordinates(pyspark_version: str | None = None) -> str:
    """The Maven coordinates of Spark's Kafka connector for ``pyspark_version`` (the running
    pyspark's by default), from :data:`SPARK_KAFKA_BY_LINE`."""
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    line = ".".join(pyspark_version.split(".")[:2])
    if line not in SPARK_KAFKA_BY_LINE:
        raise RuntimeError(f"pyspark {pyspark_version}: add its line to SPARK_KAFKA_BY_LINE")
    scala, version = SPARK_KAFKA_BY_LINE[line]
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}"


def _artifact(jar: Path) -> str:
    """The artifact name of a jar file named ``<artifact>-<version>.jar``."""
    return jar.name[: -len(".jar")].rsplit("-", 1)[0]


@functools.cache
def spark_kafka_jars() -> list[Path]:
    """The jars to add to pyspark's for Spark's Kafka connector (``spark.jars``).

    :func:`spark_kafka_coordinates` and its runtime dependencies from Maven Central (cached, see
    :func:`fetch`; about 6 s and 67 MB when nothing is cached yet), less every artifact
    pyspark already ships in ``pyspark/jars`` whatever its version (Scala, Hadoop client,
    lz4, snappy, slf4j, spark-tags...: two copies of a class on one classpath is trouble).
    What is left: the connector, its token provider, ``kafka-clients`` and
    ``commons-pool2``. Give them to a new driver as
    ``spark.jars=",".join(map(str, spark_kafka_jars()))`` (or ``--jars`` in
    ``PYSPARK_SUBMIT_ARGS``); a running SparkContext cannot take them.
    """
    import pyspark

    shipped = {_artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    coordinates = spark_kafka_coordinates()
    jars = [j for j in fetch([coordinates]) if _artifact(j) not in shipped]
    if not any(_artifact(j) == coordinates.split(":")[1] for j in jars):
        raise RuntimeError(f"{coordinates}: the connector jar is not among {jars}")
    return jars


def spark_kafka_conf() -> dict[str, str]:
    """Spark settings of a driver that uses Spark's Kafka connector (``spark.jars``)."""
    return {"spark.jars": ",".join(str(j) for j in spark_kafka_jars())}


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["build-cds"]:
        target = spark_cds_archive_path()
        sys.exit(0 if build_spark_cds_archive(target, sys.executable) else 1)
    sys.exit(f"usage: {sys.argv[0]} build-cds")
