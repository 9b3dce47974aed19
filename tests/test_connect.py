"""Spark Connect: eosink through a real Connect server, from client processes.

The server is a ``SparkConnectServer`` JVM of its own (``local[2]``, tests/connect.py), shared
by this module's tests on one pytest worker; the clients are ``tests/connect_job.py``
subprocesses (a Connect client would switch this process's pyspark to Connect mode). Both
front ends are exercised, ``eosink.run`` and ``format("eosink")``, batch and stream, to the
file, iceberg, kafka, sql and delta sinks; the output is read back by the crash harness's
independent readers (pyarrow, pyiceberg, a ``read_committed`` consumer, SQL, delta-rs) row
by row.

Crashes: the Connect server (the driver) is SIGKILLed mid-stream with everything it started
and restarted, and a client process is SIGKILLed while the server's query runs; a new client
then finishes the stream on the same checkpoint, exactly once. A bad option is an eosink
error before anything is written.

Over Spark Connect, eosink's stream code runs in the server's Python workers (the
``foreachBatch`` worker of ``eosink.run``, the data source's workers of ``format("eosink")``),
so fault points are armed in the server's environment; see tests/connect.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connect import Client, ConnectJob, ConnectServer, run_client
from harness import epoch_states, kafka_sink_options, make_input, read_ids

from eosink import _spark_version

SINKS = ["file", "iceberg", "kafka"]
ROWS = 40  # rows per input file (one micro-batch each)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """One Connect server for this module on this pytest worker (started on first use;
    crash tests restart it with fault points armed and leave it clean)."""
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"), start=False)
    yield server
    server.stop()


@pytest.fixture
def server(connect_server: ConnectServer) -> ConnectServer:
    """The shared server, running, with nothing armed."""
    connect_server.ensure(env={})
    return connect_server


def make_job(
    server: ConnectServer,
    tmp: Path,
    sink: str,
    mode: str,
    front: str,
    kafka: Any = None,
    **kw: Any,
) -> ConnectJob:
    """A job of ``sink`` in its own directory with its own SQLite meta store (two iceberg
    jobs would share the default sink id ``iceberg:eosink.db.events``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    opts: dict[str, Any] = dict(kw.pop("sink_options", {}))
    if sink == "kafka":
        opts = kafka_sink_options(kafka, tmp, "connect", **opts)
    extra = {"sink": sink, **kw}
    if sink == "file":
        extra.setdefault("partition_by", "grp")
    metastore = f"sqlite:///{tmp / 'metastore.db'}"
    return ConnectJob(server, tmp, mode, metastore, front=front, sink_options=opts, **extra)


def check_output(job: ConnectJob, expected: list[int], per_epoch: int | None = None) -> None:
    """The job's target holds ``expected`` exactly once (independent readers), nothing is
    left staged, every epoch is COMMITTED."""
    sink = job.extra["sink"]
    if sink == "file":
        got = read_ids(job.out, partitioned=bool(job.extra.get("partition_by")))
        assert got == expected, _diff(got, expected)
        assert job.output().staged() == []
    elif sink == "iceberg":
        from test_iceberg import iceberg_rows, orphan_files

        opts = job.iceberg_options()
        rows = iceberg_rows(opts)
        got = sorted(r["id"] for r in rows)
        assert got == expected, _diff(got, expected)
        assert all(r["payload"] == f"payload-{r['id']}" for r in rows)
        assert orphan_files(opts) == []
    else:
        from test_kafka_crash import check_topic

        check_topic(job, expected, per_epoch=per_epoch)
    states = epoch_states(job.metastore_url, job.sink_id)
    assert set(states) == {"COMMITTED"}, states


def _diff(got: list[int], expected: list[int]) -> str:
    dup = sorted({i for i in got if got.count(i) > 1})
    return (
        f"{len(got)} rows read back, {len(expected)} written; missing "
        f"{sorted(set(expected) - set(got))[:10]}, duplicated {dup[:10]}"
    )


# ---------------------------------------------------------------------------------------
# Batch and stream, both front ends, three sinks
# ---------------------------------------------------------------------------------------


# The file, iceberg (upserts) and sql sinks over Spark Connect, both front ends, batch and
# stream: test_relative_paths_are_the_clients.
@pytest.mark.parametrize("sink", [s for s in SINKS if s == "kafka"])
def test_sink_over_connect(
    request: pytest.FixtureRequest, server: ConnectServer, tmp_path: Path, sink: str
) -> None:
    """One client session: a file stream through ``eosink.run`` and one through
    ``format("eosink")`` (one input file per micro-batch, ``availableNow``) run on the server
    while the client writes a batch through each front end (epoch 5), then the same two
    batches again (no-ops: skipped, nothing written twice). Each of the four targets holds
    its input exactly once."""
    kafka = request.getfixturevalue("kafka") if sink == "kafka" else None
    fronts = ("run", "format") if _spark_version.PYTHON_DATA_SOURCES else ("run",)  # 3.5
    jobs = {
        (mode, front): make_job(server, tmp_path / f"{mode}-{front}", sink, mode, front, kafka)
        for mode in ("stream", "batch")
        for front in fronts
    }
    expected = {key: make_input(job.input, files=2, rows=ROWS) for key, job in jobs.items()}
    register = "spark"  # unregistered (Spark's lookup); test_relative_paths: registered
    steps = [
        jobs["stream", "run"].step(background=True),
        jobs["batch", "run"].step(),
        jobs["batch", "run"].step(),
    ]
    if "format" in fronts:
        steps += [
            jobs["stream", "format"].step(background=True, register=register),
            jobs["batch", "format"].step(register=register),
            jobs["batch", "format"].step(register=register),
        ]
    client = run_client(server.url, steps, tmp_path / "client.log")
    assert client.code == 0 and not client.errors, client
    first, again = client.result(1)["batch"], client.result(2)["batch"]
    assert first["rows"] == len(expected["batch", "run"]) and first["committed"], first
    assert not first["skipped"] and again["skipped"] and again["rows"] == 0, again
    stream_run = client.result(0)
    assert sorted(f["rows"] for f in stream_run["figures"]) == [ROWS] * 2, stream_run
    for key, job in jobs.items():
        try:
            check_output(job, expected[key], per_epoch=ROWS if key[0] == "stream" else None)
            epochs = epoch_states(job.metastore_url, job.sink_id)["COMMITTED"]
            assert sorted(epochs) == ([0, 1] if key[0] == "stream" else [5]), epochs
        except AssertionError as exc:
            raise AssertionError(f"{key}: {exc}\n{client}") from exc


def test_a_streams_figures_while_it_runs(server: ConnectServer, tmp_path: Path) -> None:
    """Over Spark Connect the micro-batches run in the server's worker; the client's handle
    reads their figures from the meta store while the query runs: ``committed_epochs()``
    (from ``figures``) shows an epoch the server committed before the query is stopped."""
    job = make_job(server, tmp_path / "job", "file", "stream", "run")
    expected = make_input(job.input, files=3, rows=ROWS)
    step = job.step(trigger={"processingTime": "1 second"}, end={"until_committed": 1})
    client = run_client(server.url, [step], tmp_path / "client.log")
    assert client.code == 0 and not client.errors, client
    result = client.result(0)
    assert result is not None and result["committed_while_running"][:1] == [0], client
    # Spark's own progress of each micro-batch has its rows (observed metrics "eosink");
    # Connect on 3.5 has no Observation (_spark_version.CONNECT_OBSERVATION): none there.
    if _spark_version.CONNECT_OBSERVATION:
        assert result["observed_rows"] and set(result["observed_rows"]) == {ROWS}, result
    else:
        assert result["observed_rows"] == [], result
    # stop() committed what the server's worker had checkpointed; the rest on the next run.
    check_output(job, expected[: ROWS * len(result["committed_epochs"])], per_epoch=ROWS)


@pytest.mark.crash
def test_a_stream_restarts_after_its_server_worker_died(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """The server's foreachBatch Python worker is SIGKILLed once, after phase 1 of the
    second micro-batch (a worker lost, as to the OOM killer): the query fails; the client's
    handle (eosink.run's default restart policy, a shorter first delay) finishes the dead
    run's epochs and starts the query again from its checkpoint; every row exactly once.

    On pyspark 3.5 the client is not told the failure's cause
    (``_spark_version.CONNECT_FAILURE_CAUSE``): the stream ends with the error, its dead
    run's epochs finished, and the user's second start resumes it, exactly once."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"EOSINK_FAULT": "after_persist@2", "EOSINK_FAULT_MARK": str(marks)}
    connect_server.ensure(env={**env, "EOSINK_FAULT_ONCE": "1"})
    job = make_job(connect_server, tmp_path / "job", "file", "stream", "run")
    expected = make_input(job.input, files=3, rows=ROWS)
    step = job.step(run_options={"restart": {"delay_s": 0.5}})
    told = _spark_version.CONNECT_FAILURE_CAUSE
    steps = [step] if told else [job.step(expect_error=True), job.step()]
    client = run_client(connect_server.url, steps, tmp_path / "client.log")
    assert client.code == 0, client
    assert [m.name.split(".")[0] for m in marks.iterdir()] == ["after_persist"]
    if told:
        assert not client.errors, client
        result = client.result(0)
        assert result is not None and result["restarts"] == 1, client
    else:
        assert [(e["step"], e["class"]) for e in client.errors] == [
            (0, "StreamingQueryException")
        ], client
        assert "recovery aborts epoch 1" in client.log, client  # the dead run's, finished
        result = client.result(1)
        assert result is not None and result["restarts"] == 0, client
    check_output(job, expected)
    assert sorted(epoch_states(job.metastore_url, job.sink_id)["COMMITTED"]) == [0, 1, 2]


# ---------------------------------------------------------------------------------------
# Bad options
# ---------------------------------------------------------------------------------------

# (front, mode, bad sink or eosink options, bad step entries, eosink error class, a word of
# its message). The options are merged over the job's good ones.
BAD: list[tuple[str, str, dict[str, Any], dict[str, Any], str, str]] = [
    ("run", "batch", {"colour": "red"}, {}, "ConfigError", "colour"),
    ("run", "batch", {}, {"epoch": -1}, "ConfigError", "epoch"),
    ("run", "stream", {}, {"trigger": {"bogus": 1}}, "ConfigError", "trigger"),
    ("run", "stream", {"format": "xml"}, {}, "ConfigError", "format"),
    # Over Spark Connect the checkpoint must be a path the client and the server share.
    ("run", "stream", {}, {"checkpoint_location": "hdfs://h:9/c"}, "ConfigError", "checkpoint"),
    ("format", "batch", {"colour": "red"}, {}, "ConfigError", "colour"),
    ("format", "batch", {}, {"epoch": -1}, "ConfigError", "epoch"),
    ("format", "stream", {"colour": "red"}, {}, "ConfigError", "colour"),
    ("format", "stream", {"new_checkpoint": "maybe"}, {}, "ConfigError", "new_checkpoint"),
]
if not _spark_version.PYTHON_DATA_SOURCES:  # pyspark 3.5: format("eosink") is refused whole
    BAD = [case for case in BAD if case[0] == "run"]


def test_bad_options_write_nothing(server: ConnectServer, tmp_path: Path) -> None:
    """Each bad option is an eosink error, raised in the client as that class (not Spark's
    exception around it), before anything is written: no meta store row, no output, no
    eosink state in the checkpoint (Spark's own may exist: a ``format("eosink")`` stream
    starts before Spark asks the data source for its writer). One client runs every case."""
    jobs, steps = [], []
    for n, (front, mode, options, entries, _, _) in enumerate(BAD):
        job = make_job(server, tmp_path / f"case{n}", "file", mode, front)
        make_input(job.input, files=1, rows=5)
        jobs.append(job)
        opts = {**job.sink_opts(), **options}
        steps.append(job.step(options=opts, **entries, expect_error=True))
    client = run_client(server.url, steps, tmp_path / "client.log")
    assert client.code == 0 and not client.results, client
    for n, (front, mode, options, entries, cls, word) in enumerate(BAD):
        job, err = jobs[n], client.error(n)
        case = f"case {n} ({front} {mode} {options} {entries}): {err}"
        assert err is not None, case
        assert (err["module"], err["class"]) == ("eosink.errors", cls), case
        assert word in err["message"], case
        # Nothing written.
        assert not job.out.exists() or not any(job.out.iterdir()), case
        assert _meta_rows(job) == [], case
        assert not (job.checkpoint / "eosink-lineage.json").exists(), case
        assert not (job.checkpoint / "eosink").exists(), case


def _meta_rows(job: ConnectJob) -> list[Any]:
    """Every row of the job's meta store (none when its file was never created)."""
    import sqlalchemy as sa

    path = Path(job.metastore_url.removeprefix("sqlite:///"))
    if not path.exists():
        return []
    eng = sa.create_engine(job.metastore_url)
    try:
        with eng.connect() as c:
            tables = sa.inspect(c).get_table_names()
            return [
                (t, *row)
                for t in tables
                if t != "alembic_version"
                for row in c.execute(sa.text(f'select * from "{t}"')).all()
            ]
    finally:
        eng.dispose()


# ---------------------------------------------------------------------------------------
# Relative paths: where the user said, never the server's session folder
# ---------------------------------------------------------------------------------------

REL_SINKS = ("file", "iceberg", "sql", "delta")


def _relative_options(sink: str, name: str) -> dict[str, Any]:
    """The sink's options with every location relative to the client's working directory."""
    if sink == "file":
        return {"path": f"out/{name}", "partition_by": ["grp"]}
    if sink == "iceberg":  # upserts (keys unique: the table holds every row once)
        return {"table": "db.events", "warehouse": f"wh/{name}", "mode": "upsert", "keys": ["id"]}
    if sink == "delta":
        return {"path": f"out/{name}", "partition_by": ["grp"]}
    return {"url": f"sqlite:///{name}.sqlite", "table": "events", "create_table": True}


def _read_back(sink: str, cwd: Path, name: str) -> list[int]:
    """The ids at the location the user named (relative to ``cwd``), read without eosink."""
    if sink == "file":
        return read_ids(cwd / "out" / name, partitioned=True)
    if sink == "delta":  # delta-rs' query engine, through the table's log
        from test_delta import delta_options, delta_rows

        return sorted(int(r["id"]) for r in delta_rows(delta_options(cwd / "out" / name)))
    if sink == "iceberg":
        from pyiceberg.catalog import load_catalog

        wh = cwd / "wh" / name
        cat = load_catalog(
            "eosink", type="sql", uri=f"sqlite:///{wh / 'catalog.db'}", warehouse=f"file://{wh}"
        )
        return sorted(cat.load_table("db.events").scan().to_arrow().column("id").to_pylist())
    import sqlite3

    with contextlib.closing(sqlite3.connect(cwd / f"{name}.sqlite")) as con:
        return sorted(r[0] for r in con.execute("select id from events"))


def _sink_id(sink: str, cwd: Path, name: str) -> str:
    if sink in ("file", "delta"):
        return f"{sink}:{cwd / 'out' / name}"
    if sink == "iceberg":
        return "iceberg:eosink.db.events"
    return f"sql:sqlite://{cwd / name}.sqlite/events"


def test_relative_paths_are_the_clients(server: ConnectServer, tmp_path: Path) -> None:
    """A client in its own working directory writes with every location relative (the
    target's path, an Iceberg warehouse, a SQLite database, the meta store, the checkpoint):
    ``format("eosink")`` batch and stream to the file, iceberg (upserts), sql and delta sinks,
    and ``eosink.run`` streams to the sql, file and delta sinks (the delta sink's native
    path: Spark's writer in the server's ``foreachBatch`` worker). The output and the meta
    store are where the user said, relative to the client's working directory, each row
    exactly once, read back without eosink; nothing lands in the server's session folder
    (Spark Connect runs the server's Python workers there, and deletes it with the session).

    A client that registers nothing (Spark's lookup of installed data sources finds
    ``format("eosink")``) gets an eosink error naming the relative option, before anything is
    written, and writes fine with absolute paths.

    On pyspark 3.5 (no ``format("eosink")``; no native path over Connect: no Observation),
    the ``eosink.run`` streams only."""
    fmt = _spark_version.PYTHON_DATA_SOURCES
    cwd = tmp_path / "client-cwd"
    cwd.mkdir()
    source = tmp_path / "input"
    expected = make_input(source, files=2, rows=ROWS)
    steps, cases = [], []
    for sink in REL_SINKS if fmt else ():
        for mode in ("batch", "stream"):
            name = f"format-{mode}-{sink}"
            step: dict[str, Any] = {
                "front": "format",
                "mode": mode,
                "sink": sink,
                "options": _relative_options(sink, name),
                "input": str(source),
                "metastore_url": f"sqlite:///meta/{name}.db",
            }
            if mode == "batch":
                step["epoch"] = 5
            else:
                # Both files in one micro-batch: each format("eosink") micro-batch starts
                # Python workers and a coordinator on the server (~8 s here).
                step.update(checkpoint_location=f"chk/{name}", max_files_per_trigger=2)
            steps.append(step)
            cases.append((sink, name, [5] if mode == "batch" else [0]))
    for sink in ("sql", "file", "delta"):
        name = f"run-stream-{sink}"
        steps.append(
            {
                "front": "run",
                "mode": "stream",
                "sink": sink,
                "options": _relative_options(sink, name),
                "input": str(source),
                "metastore_url": f"sqlite:///meta/{name}.db",
                "checkpoint_location": f"chk/{name}",
            }
        )
        cases.append((sink, name, [0, 1]))
    # Nothing registered: refused while relative, written when absolute.
    refused = {
        "front": "format",
        "mode": "batch",
        "sink": "file",
        "register": "none",
        "options": {"path": "out/unregistered"},
        "input": str(source),
        "metastore_url": f"sqlite:///{cwd / 'meta' / 'unregistered.db'}",
        "epoch": 1,
        "expect_error": True,
    }
    absolute = {
        **refused,
        "options": {"path": str(cwd / "out" / "absolute"), "partition_by": ["grp"]},
        "metastore_url": f"sqlite:///{cwd / 'meta' / 'absolute.db'}",
        "expect_error": False,
    }
    # A session of its own: one that registered eosink keeps making paths absolute.
    if fmt:
        bare = run_client(server.url, [refused, absolute], tmp_path / "bare.log", cwd=cwd)
        assert bare.code == 0 and [e["step"] for e in bare.errors] == [0], bare
    client = run_client(server.url, steps, tmp_path / "client.log", cwd=cwd)
    assert client.code == 0 and not client.errors, client
    for sink, name, epochs in cases:
        case = f"{name}: {client}"
        assert _read_back(sink, cwd, name) == expected, case
        meta = f"sqlite:///{cwd / 'meta' / name}.db"
        assert epoch_states(meta, _sink_id(sink, cwd, name)) == {"COMMITTED": epochs}, case
    # eosink.run's delta stream staged with Spark's writer (the native path) on the server
    spark_dirs = list((cwd / "out" / "run-stream-delta").glob("eosink-*/e*/spark-*"))
    if _spark_version.CONNECT_OBSERVATION:
        assert spark_dirs, "the delta sink's native path did not run over Spark Connect"
    if fmt:
        err = bare.error(0)
        assert err is not None and err["eosink_class"] == "ConfigError", bare
        assert "path='out/unregistered'" in err["message"] and "absolute" in err["message"]
        assert not (cwd / "out" / "unregistered").exists()
        assert not (cwd / "meta" / "unregistered.db").exists()
        assert read_ids(cwd / "out" / "absolute", partitioned=True) == expected
    # Nothing under the server's folders: its session folders (userFiles-*) hold no output.
    stray = [
        p
        for p in server.root.rglob("*")
        if "userFiles-" in str(p)
        and (p.suffix in (".sqlite", ".db") or {"out", "wh", "meta", "chk"} & set(p.parts))
    ]
    assert stray == [], stray


# ---------------------------------------------------------------------------------------
# Crashes: the server (the driver) and a client
# ---------------------------------------------------------------------------------------


def add_input(directory: Path, first: int, files: int, rows: int = ROWS) -> list[int]:
    """More input files after ``first`` files of ``rows`` rows (ids continue), as
    ``harness.make_input`` names and fills them; returns their ids."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        ids = make_input(Path(tmp), files=first + files, rows=rows)[first * rows :]
        for f in range(first, first + files):
            # Renamed in: a file stream never sees a half-written file.
            shutil.copy(Path(tmp) / f"in-{f:03d}.parquet", Path(tmp) / "x")
            os.replace(Path(tmp) / "x", directory / f"in-{f:03d}.parquet")
    return ids


FRONTS = ("run", "format")
RUNNING = {"trigger": {"processingTime": "1 second"}, "end": "forever"}


def start_one_by_one(jobs: list[ConnectJob]) -> list[Any]:
    """Start the jobs' clients in the background, each once the previous one's stream
    started (see ``ConnectJob.wait_started``)."""
    clients: list[Any] = []
    try:
        for job in jobs:
            clients.append(job.start())
            job.wait_started(clients[-1])
    except BaseException:
        for job, c in zip(jobs, clients, strict=False):
            job.reap(c)
        raise
    return clients


def _epochs(job: ConnectJob) -> set[int]:
    """Every epoch the job's meta store has a row for, whatever its state."""
    return {e for es in epoch_states(job.metastore_url, job.sink_id).values() for e in es}


@pytest.mark.release
@pytest.mark.crash
def test_server_killed_mid_stream(connect_server: ConnectServer, tmp_path: Path) -> None:
    """Two streams run on the server, one through each front end, their clients waiting.

    1. The server is SIGKILLed (the JVM and every Python worker it started) once both
       reached ``mid_commit@2`` in the server's Python: half of the second micro-batch's
       files are visible (``eosink.run``: after Spark checkpointed the batch, in the
       foreachBatch worker's committer; ``format("eosink")``: in the data source's inline
       commit, before Spark's checkpoint).
    2. The server restarts on the same port, more input arrives, new clients start both
       streams again; once both persisted a new epoch, the server's JVM alone is SIGKILLed
       at a random instant (up to 1.5 s later), as the OOM killer would: its Python workers
       live on as orphans (the foreachBatch worker for minutes, its Connect client retrying).
    3. The server restarts on the same port while they live; a last client runs both
       streams to the end (``availableNow``), with one more input file. Every row exactly
       once; the orphans are killed after the checks.
    """
    marks = tmp_path / "marks"
    marks.mkdir()
    connect_server.ensure(env={"EOSINK_FAULT": "mid_commit@2", "EOSINK_FAULT_MARK": str(marks)})
    jobs = [
        make_job(connect_server, tmp_path / f, "file", "stream", f, step=RUNNING) for f in FRONTS
    ]
    expected = [make_input(job.input, files=3, rows=ROWS) for job in jobs]
    clients = start_one_by_one(jobs)
    try:
        connect_server.kill_when_fired(marks, "mid_commit", count=2)
    finally:
        codes = [job.reap(c) for job, c in zip(jobs, clients, strict=True)]
    assert codes == [-9, -9], [job.last_log() for job in jobs]
    assert connect_server.processes() == [] and not connect_server.alive
    for job, want in zip(jobs, expected, strict=True):
        states = epoch_states(job.metastore_url, job.sink_id)
        assert "PENDING" in states, (job.front, states)  # the crash left epoch 1 to finish
        assert read_ids(job.out, partitioned=True) != want  # and rows to write

    connect_server.restart(env={})
    before = [_epochs(job) for job in jobs]
    for job, more in zip(jobs, expected, strict=True):
        more += add_input(job.input, first=3, files=3)
    clients = start_one_by_one(jobs)
    try:
        deadline = time.monotonic() + 300
        while not all(_epochs(j) - b for j, b in zip(jobs, before, strict=True)):
            assert time.monotonic() < deadline, [j.last_log() for j in jobs]
            assert all(c.poll() is None for c in clients), "a client ended"
            time.sleep(0.02)
        time.sleep(random.Random("connect-server-kill").uniform(0.0, 1.5))
        orphans = connect_server.kill_jvm()
    finally:
        codes = [job.reap(c) for job, c in zip(jobs, clients, strict=True)]
    assert codes == [-9, -9], [job.last_log() for job in jobs]

    connect_server.restart(env={})
    for job, more in zip(jobs, expected, strict=True):
        more += add_input(job.input, first=6, files=1)
        job.step_overrides = {}
    try:
        client = run_client(connect_server.url, [job.step() for job in jobs], tmp_path / "c.log")
        assert client.code == 0 and not client.errors, client
        for job, want in zip(jobs, expected, strict=True):
            check_output(job, want, per_epoch=ROWS)
    finally:
        print(f"orphans of the killed JVM: {orphans}, left: {connect_server.orphans()}")
        connect_server.kill_orphans()


@pytest.mark.release
@pytest.mark.crash
def test_client_killed_while_stream_runs(server: ConnectServer, tmp_path: Path) -> None:
    """Two clients start a stream each (one per front end, a 1-second processing-time
    trigger, one input file per micro-batch) and are SIGKILLed once their stream persisted
    its first PENDING epoch; the queries run on in the server without them (more epochs get
    committed). A new client starts both streams again on the same checkpoints with
    ``availableNow``: Spark stops each orphaned run, wherever it is
    (``spark.sql.streaming.stopActiveRunOnRestart``), the new runs fence it and finish.
    Then more input arrives and the same client runs both streams once more. Every row
    exactly once."""
    jobs = [make_job(server, tmp_path / f, "file", "stream", f, step=RUNNING) for f in FRONTS]
    expected = [make_input(job.input, files=6, rows=ROWS) for job in jobs]
    for job in jobs:  # one after the other (see start_one_by_one)
        c = job.start()
        try:
            job.wait_in_protocol(c)
        finally:
            code = job.reap(c)
        assert code == -9, job.last_log()
    deadline = time.monotonic() + 180
    for job in jobs:
        # The orphaned query goes on with no client: epochs after the first get committed.
        while len(epoch_states(job.metastore_url, job.sink_id).get("COMMITTED", [])) < 2:
            assert time.monotonic() < deadline, (job.front, job.last_log(), server.tail())
            time.sleep(0.2)
        job.step_overrides = {}
    log_start = len(server.tail(10**9))
    go = tmp_path / "more-input"
    steps = [job.step() for job in jobs] + [job.step(wait_for=str(go)) for job in jobs]
    client = Client(server.url, steps, tmp_path / "client.log")
    restarted = client.wait_until(lambda out: out.result(1) is not None or out.errors)
    assert not restarted.errors, restarted
    stopped = server.tail(10**9)[log_start:]
    for n in range(len(jobs)):
        query = restarted.result(n)["query_id"]
        assert f"Stopping existing streaming query [id={query}" in stopped, (query, stopped[-3000:])
    for job, more in zip(jobs, expected, strict=True):
        more += add_input(job.input, first=6, files=1)
    go.touch()
    done = client.finish()
    assert done.code == 0 and not done.errors, done
    for job, want in zip(jobs, expected, strict=True):
        check_output(job, want, per_epoch=ROWS)
    # The last runs wrote the new input, in a micro-batch each.
    assert [f["rows"] for f in done.result(2)["figures"]] == [ROWS], done.result(2)
    assert len(done.result(3)["batches"]) == 1, done.result(3)


@pytest.mark.release
@pytest.mark.crash
def test_batch_client_killed(server: ConnectServer, tmp_path: Path) -> None:
    """A batch ``eosink.run`` over Spark Connect coordinates in the client (Spark's write job
    runs on the server): the client is SIGKILLed once the server's job staged the epoch
    (``after_spark_write``), then in a re-run once the epoch is PENDING (``after_persist``).
    The third run finishes the crashed run's epoch instead of writing it again; every row
    once, nothing staged; a fourth run is a no-op."""
    job = make_job(server, tmp_path, "file", "batch", "run")
    expected = make_input(job.input, files=2, rows=ROWS)
    for fault in ("after_spark_write", "after_persist"):
        job.assert_fired(fault, job.run(fault=fault))
    assert job.run() == 0, job.last_log()
    assert job.client().result(0)["batch"]["recovered"], job.last_log()
    check_output(job, expected)
    assert job.run() == 0, job.last_log()
    assert job.client().result(0)["batch"]["skipped"], job.last_log()
    check_output(job, expected)
