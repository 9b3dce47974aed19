"""The compatibility profile: eosink under the other Spark lines it supports.

The suite runs on the lock's pyspark (4.3). Here the same checkout runs under pyspark 3.5
(the LTS line of EMR 7, Glue 5, Dataproc 2.2, Databricks 15.4) and the oldest 4.x line, each
in its own cached environment (``bench/_pylines.py``: only pyspark differs from the main
environment): the demo end to end (a batch, its re-run skipped, a stream, read back row by
row), a stream whose driver is SIGKILLed at the protocol's points, each restart on a new
machine (new HOME, TMPDIR and working directory: only the checkpoint and the target
survive), and on 3.5 the error that ``format("eosink")`` gives where Spark has no Python
data sources, each other sink's stream killed, a stream upgraded from 3.5 to this line, and
Spark Connect (a 3.5 server and client). The 3.5 environment has numpy<2 and pyarrow 25
(``pyspark[connect]`` 3.5 requires numpy<2): what a 3.5 Connect user installs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from harness import Job, crash_chain, make_input
from test_driver_moves import check_files, moving_chain

from bench import _pylines

pytestmark = pytest.mark.crash

LINES = ["3.5.9", "4.0.5"]
"""pyspark 3.5 and the oldest 4.x line supported."""


@cache
def python_of(pyspark: str) -> Path:
    """The line's Python (its environment built once, cached), and its drivers'
    class-data-sharing archive (tests/jvm.py: built once per line, cached)."""
    py = _pylines.venv(pyspark, lambda msg: print(msg, file=sys.stderr))
    if os.environ.get("EOSINK_TEST_CDS", "0") != "0":
        import fcntl

        from jvm import build_spark_cds_archive, spark_cds_archive_path

        archive = spark_cds_archive_path(py)
        archive.parent.mkdir(parents=True, exist_ok=True)
        with open(archive.with_name(f".{archive.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # pytest's workers build it once
            build_spark_cds_archive(archive, str(py), env=_pylines.child_env(py))
    return py


def _run(py: Path, cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``cmd`` (a program of ``py``'s environment) as on a fresh machine under ``tmp_path``."""
    env = _pylines.child_env(py)
    env.update(TMPDIR=str(tmp_path), HOME=str(tmp_path / "home"))
    env.pop("EOSINK_HOME", None)
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def _ran_on(job: Job, pyspark: str) -> None:
    """Every driver of ``job`` ran on pyspark ``pyspark`` (tests/crashjob.py prints it)."""
    assert all(f"SPARK {pyspark}" in log for log in job.logs), job.last_log()


@pytest.mark.parametrize("pyspark", LINES)
def test_the_demo(tmp_path: Path, pyspark: str) -> None:
    """The README's demo under that line: a batch, its re-run skipped, a stream; every row
    read back exactly once, nothing staged left."""
    py = python_of(pyspark)
    done = _run(py, [str(py.parent / "eosink"), "demo"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert f"Spark {pyspark} started" in out, out[-2000:]
    assert "batch re-run of epoch 1: skipped=True" in out, out[-2000:]
    assert "OK: every row landed exactly once" in out, out[-2000:]


@pytest.mark.parametrize("pyspark", LINES)
def test_a_stream_killed_and_moved(tmp_path: Path, pyspark: str) -> None:
    """An ``eosink.run`` stream (file sink, partitioned, Python writers: the demo runs
    Spark's own) killed at the points between PENDING and COMMITTED, each restart on a new
    machine with its own default meta store: it finishes every checkpointed epoch from its
    journal; exact."""
    py = python_of(pyspark)
    job = Job(tmp_path, "stream", "default", python=py, partition_by="grp", writer="python")
    # On 3.5 every point between PENDING and COMMITTED; 4.0 is 4.3's protocol on an older
    # Spark 4 (CI's budget): the checkpointed epoch's recovery, and a commit killed midway.
    faults = ["after_persist@2", "before_commit@1", "mid_commit@1", "after_commit@1"]
    if pyspark != "3.5.9":
        faults = ["before_commit@2", "mid_commit@1"]
    expected = make_input(job.input, files=len(faults) + 3)
    moving_chain(job, faults)
    _ran_on(job, pyspark)
    check_files(job, expected, partitioned=True)


_FORMAT_ON_35 = textwrap.dedent(
    """
    import sys
    import eosink

    spark = eosink.spark_session(master="local[1]")
    df = spark.range(3)
    for name, call in (
        ("write", lambda: df.write.format("eosink").option("sink", "file")
            .option("path", sys.argv[1]).save()),
        ("register", lambda: eosink.register_datasource(spark)),
    ):
        try:
            call()
        except eosink.ConfigError as exc:
            print(f"{name}: {exc}")
        else:
            print(f"{name}: no error")
    """
)


def test_format_eosink_on_3_5_says_what_to_do(tmp_path: Path) -> None:
    """Spark 3.5 has no Python data sources: ``format("eosink")`` fails with eosink's
    ConfigError naming the version and the alternative, for a write and for an explicit
    ``register_datasource``; nothing is written."""
    out = tmp_path / "out"
    py = python_of("3.5.9")
    done = _run(py, [str(py), "-c", _FORMAT_ON_35, str(out)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    for name in ("write", "register"):
        said = lines.get(name, "")
        assert 'format("eosink") is a Python data source' in said, done.stdout
        assert "this is pyspark 3.5.9" in said and "eosink.run(df, sink=" in said, said
        assert said.endswith("(see docs/errors.md#configerror)"), said
    assert not out.exists()


def test_a_stream_upgraded_from_3_5_to_this_line(tmp_path: Path) -> None:
    """A user's upgrade: a stream runs on pyspark 3.5 and its driver dies with an epoch
    checkpointed and not committed; the same pipeline, checkpoint and meta store, restarted
    on this environment's Spark (4.x), commits it and goes on; every row exactly once."""
    from test_crash import _check

    job = Job(tmp_path, "stream", f"sqlite:///{tmp_path / 'm.db'}", python=python_of("3.5.9"))
    expected = make_input(job.input, files=5)
    job.assert_fired("before_commit@2", job.run(fault="before_commit@2"))
    job.python = None  # the upgraded driver
    assert job.run() == 0, job.last_log()
    assert "SPARK 3.5.9" in job.logs[0] and "SPARK 3.5.9" not in job.logs[1], job.logs[1]
    assert "recovery commits checkpointed epoch 1" in job.logs[1], job.logs[1]
    _check(job, expected)


def test_spark_connect_on_3_5(tmp_path: Path) -> None:
    """Spark Connect on 3.5 (a server of pyspark 3.5.9 with the ``spark-connect_2.12`` jar, a
    3.5.9 client): an ``eosink.run`` stream (its micro-batches in the server's ``foreachBatch``
    worker) and a batch, run again (skipped), write every row exactly once, with the Python
    writers (3.5's Connect has no ``Observation``, which the native path counts rows with);
    ``format("eosink")`` is refused with the version and the alternative."""
    from connect import ConnectJob, ConnectServer, run_client
    from test_connect import check_output

    py = python_of("3.5.9")
    # the server's jars: 3.5's Connect plugin (connect.connect_jars)
    with ConnectServer(tmp_path / "server", python=py) as server:
        jobs = {}
        for mode, front in (("stream", "run"), ("batch", "run"), ("batch", "format")):
            d = tmp_path / f"{mode}-{front}"
            d.mkdir()
            metastore = f"sqlite:///{d / 'metastore.db'}"
            jobs[mode, front] = ConnectJob(
                server, d, mode, metastore, front=front, sink="file", partition_by="grp"
            )
        expected = {key: make_input(job.input, files=2, rows=20) for key, job in jobs.items()}
        steps = [
            jobs["stream", "run"].step(),
            jobs["batch", "run"].step(),
            jobs["batch", "run"].step(),
            jobs["batch", "format"].step(),
        ]
        client = run_client(server.url, steps, tmp_path / "client.log", python=str(py))
        log = server.log.read_text(errors="replace")
    assert "CONNECTED 3.5.9" in client.log, client
    assert [e["step"] for e in client.errors] == [3], client
    said = client.errors[0]
    assert said["eosink_class"] == "ConfigError" and "this is pyspark 3.5.9" in said["message"]
    stream = client.result(0)
    assert stream is not None and stream["committed_epochs"] == [0, 1], client
    first, again = client.result(1)["batch"], client.result(2)["batch"]
    assert first["committed"] and first["rows"] == 40 and first["figures"]["writer"] == "python"
    assert again["skipped"] and again["rows"] == 0, again
    for key in (("stream", "run"), ("batch", "run")):
        check_output(jobs[key], expected[key])
    assert not jobs["batch", "format"].out.exists()
    assert "Running Spark version 3.5.9" in log, log[:3000]  # the server is 3.5 too


def test_the_sql_sink_killed_on_3_5(tmp_path: Path) -> None:
    """The sql sink (SQLite target) on pyspark 3.5: a stream killed after PENDING and inside
    its commit; every row once, nothing staged, every epoch recorded once at the target.
    (It is also the suite's ``eosink.run`` stream kill of the sql sink on a SQLite target:
    the sink's code is the same on every Spark line; tests/test_sql_crash.py kills the other
    front ends there.)"""
    from test_sql_crash import _appended, _check, sql_job

    url = f"sqlite:///{tmp_path / 'target.sqlite'}"
    job = sql_job(tmp_path, "stream", url)
    job.python = python_of("3.5.9")
    make_input(job.input, files=5, rows=50)
    crash_chain(job, ["after_persist@2", "mid_commit@2"])
    _ran_on(job, "3.5.9")
    _check(job, url, _appended(job))


def test_the_iceberg_sink_killed_on_3_5(tmp_path: Path) -> None:
    """The iceberg sink (SQLite catalog, local warehouse, Spark's own Parquet writer) on
    pyspark 3.5: a stream killed after PENDING, inside its commit and after it; every row
    once, no orphan file, every epoch COMMITTED."""
    from test_iceberg_crash import _check_table

    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'metastore.db'}",
        python=python_of("3.5.9"),
        sink="iceberg",
    )
    expected = make_input(job.input, files=6)
    crash_chain(job, ["after_persist@2", "mid_commit@2", "after_commit@2"])
    _ran_on(job, "3.5.9")
    _check_table(job, expected, native=True)


def test_the_kafka_sink_killed_on_3_5(kafka: Any, tmp_path: Path) -> None:
    """The kafka sink on pyspark 3.5: a stream killed after PENDING, between a chunk's
    records and its transaction's commit, and inside the epoch's commit; every record once
    (``read_committed``), in order per key, nothing staged, every epoch COMMITTED."""
    from test_kafka_crash import ROWS, check_topic, kafka_job

    job, _ = kafka_job(kafka, tmp_path, "stream", f"sqlite:///{tmp_path / 'm.db'}")
    job.python = python_of("3.5.9")
    expected = make_input(job.input, files=5, rows=ROWS)
    crash_chain(job, ["after_persist@2", "kafka_before_commit@3", "mid_commit@2"])
    _ran_on(job, "3.5.9")
    check_topic(job, expected, aborted=True, per_epoch=ROWS)


def test_the_delta_sink_killed_on_3_5(tmp_path: Path) -> None:
    """The delta sink (a local table partitioned by ``grp``, Spark's own Parquet writer) on
    pyspark 3.5: a stream killed after PENDING and inside its commit (after the Delta
    version is written); every row once as delta-rs reads the table, each epoch in one
    commit of its history, nothing staged left, every epoch COMMITTED."""
    from test_delta_crash import check_job

    job = Job(
        tmp_path,
        "stream",
        f"sqlite:///{tmp_path / 'metastore.db'}",
        python=python_of("3.5.9"),
        sink="delta",
        partition_by="grp",
    )
    expected = make_input(job.input, files=4)
    crash_chain(job, ["after_persist@2", "mid_commit@2"])
    _ran_on(job, "3.5.9")
    check_job(job, expected)
    assert list(job.out.glob("eosink-*/e*/spark-*")), "not staged by Spark's writer"


def test_an_observation_completed_late_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark 3.5 completes a write's ``Observation`` from its listener bus, a moment after
    the write returned (1 write in 30 here): ``observed`` waits for it, and gives up (a
    write that never ran) after ``OBSERVATION_WAIT_S``. A stand-in for the Java object: the
    timing is what is checked."""
    import time

    from eosink import _spark_version

    class Late:
        def __init__(self, after: float) -> None:
            self.at = time.monotonic() + after

        def future(self) -> Late:
            return self

        def isCompleted(self) -> bool:
            return time.monotonic() >= self.at

    assert _spark_version.observed(Late(0.2))
    monkeypatch.setattr(_spark_version, "OBSERVATION_WAIT_S", 0.3)
    t0 = time.monotonic()
    assert not _spark_version.observed(Late(60))
    assert 0.3 <= time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    ("jars", "spark", "scala", "error", "warning"),
    [
        # the tests' own: pyspark 4.3 with the newest connector on Maven Central, 4.2
        ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0", "4.3.0", "2.13", "", "_2.13:4.3.0"),
        ("/j/spark-sql-kafka-0-10_2.13-4.3.0.jar", "4.3.0", "2.13", "", ""),
        ("org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.9", "4.3.0", "2.13", "_2.13:4.3.0", ""),
        ("/j/spark-sql-kafka-0-10_2.13-4.0.0.jar", "3.5.9", "2.12", "_2.12:3.5.9", ""),
        (
            "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.11.0",
            "3.5.9",
            "2.12",
            "iceberg-spark-runtime-3.5_2.12:1.11.0",
            "",
        ),
        ("file:///j/iceberg-spark-runtime-3.5_2.12-1.10.0.jar", "3.5.9", "2.12", "", ""),
        ("org.postgresql:postgresql:42.7.3, /j/hadoop-aws-3.4.1.jar", "3.5.9", "2.12", "", ""),
        ("", "4.3.0", "2.13", "", ""),
        # a newer line than Spark's: a NoSuchMethodError at the first batch (4.2's on 4.1.4)
        ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0", "4.1.4", "2.13", "_2.13:4.1.4", ""),
        (
            "/j/iceberg-spark-runtime-4.1_2.13-1.11.0.jar",
            "4.0.5",
            "2.13",
            "iceberg-spark-runtime-4.0_2.13:1.11.0",
            "",
        ),
        # lines are ordered as numbers: 4.10 is newer than 4.9
        ("/j/spark-sql-kafka-0-10_2.13-4.9.0.jar", "4.10.0", "2.13", "", "_2.13:4.10.0"),
        ("/j/spark-sql-kafka-0-10_2.13-4.10.0.jar", "4.9.1", "2.13", "_2.13:4.9.1", ""),
    ],
)
def test_connector_jars_of_another_line(
    jars: str, spark: str, scala: str, error: str, warning: str
) -> None:
    """A Kafka connector or an Iceberg runtime of another Scala version, another Spark major
    version or a newer minor line is an error naming the coordinates that match; an older
    minor line, a warning."""
    from eosink._spark_version import connector_problems

    errors, warnings = connector_problems(jars, spark, scala)
    assert len(errors) == bool(error) and all(error in e for e in errors), errors
    assert len(warnings) == bool(warning) and all(warning in w for w in warnings), warnings


def test_a_session_with_a_connector_of_another_scala_is_refused(tmp_path: Path) -> None:
    """``eosink.spark_session`` with ``spark.jars`` naming Spark 3.5's Scala 2.12 Kafka
    connector, on this environment's Spark 4 (Scala 2.13), or Spark 4.0's on 3.5 (the
    release matrix's row): a ConfigError at start that names the connector to use, not a
    missing class at the query's first batch."""
    import pyspark

    from eosink import _spark_version

    on_3_5 = _spark_version.PYSPARK < (4, 0)
    scala, other = ("2.12", "2.13") if on_3_5 else ("2.13", "2.12")
    jar = tmp_path / f"spark-sql-kafka-0-10_{other}-{'4.0.0' if on_3_5 else '3.5.9'}.jar"
    jar.write_bytes(b"")  # only its name is read
    script = textwrap.dedent(
        """
        import sys
        import eosink
        try:
            eosink.spark_session(master="local[1]", spark__jars=sys.argv[1])
        except eosink.ConfigError as exc:
            print("REFUSED", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(jar)], capture_output=True, text=True, timeout=300
    )
    assert "REFUSED" in done.stdout, done.stdout + done.stderr[-3000:]
    said = done.stdout.split("REFUSED", 1)[1]
    assert f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{pyspark.__version__}" in said, said
    assert f"Scala {scala}" in said and f"Scala {other}" in said, said
