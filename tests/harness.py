"""Helpers of the crash tests: input data, driver subprocesses, independent verification."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

TESTS = Path(__file__).resolve().parent
GROUPS = ["fr", "de/at", "..", "x%y", ""]


@contextlib.contextmanager
def sinks_registered(name: str, *plugins: Any) -> Iterator[None]:
    """``plugins`` (``eosink.SinkPlugin``) offered to this process's sink registry for the
    block, as an installed plugin module's ``eosink_sinks`` hook offers its sinks; ``name``
    is the registration's name."""
    import eosink
    from eosink.registry import plugin_manager

    class Provider:
        @eosink.hookimpl
        def eosink_sinks(self) -> list[Any]:
            return list(plugins)

    pm = plugin_manager()
    provider = Provider()
    pm.register(provider, name=name)
    try:
        yield
    finally:
        pm.unregister(provider)


def to_arrow(df: Any) -> pa.Table:
    """``df.toArrow()``, which pyspark 4 added; on 3.5 the same collection
    (``_collect_as_arrow``, what 4.x's ``toArrow`` is made of) with Spark's Arrow schema."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = df._collect_as_arrow()
    if batches:  # their own schema: 3.5's to_arrow_schema differs in time zones
        return pa.Table.from_batches(batches)
    return to_arrow_schema(df.schema).empty_table()


def micro_batches(query: Any) -> list[tuple[int, dict[str, dict[str, Any]]]]:
    """Each micro-batch's ``(numInputRows, observed metrics as dicts)`` in a query's
    ``recentProgress``: ``StreamingQueryProgress`` objects on pyspark 4, dicts on 3.5."""
    out = []
    for p in query.recentProgress:
        if isinstance(p, dict):
            rows, observed = p["numInputRows"], p.get("observedMetrics") or {}
        else:
            rows, observed = p.numInputRows, p.observedMetrics or {}
        out.append(
            (
                int(rows),
                {k: v if isinstance(v, dict) else v.asDict() for k, v in observed.items()},
            )
        )
    return out


def payload(i: int, pad: int = 0) -> str:
    """The payload column of input row ``i`` (``pad`` extra characters make rows bigger)."""
    text = f"payload-{i}"
    return f"{text}-{'x' * pad}" if pad else text


def status_json(url: str, capsys: Any) -> dict[str, Any]:
    """The one sink of ``eosink status --json`` on the meta store ``url`` (through the CLI's
    ``main``; ``capsys`` is pytest's fixture)."""
    import json

    from eosink._cli import main as cli

    capsys.readouterr()
    assert cli(["status", "--metastore-url", url, "--json"]) == 0
    (sink,) = json.loads(capsys.readouterr().out)
    return dict(sink)


def make_input(
    directory: Path,
    files: int = 4,
    rows: int = 300,
    pad: int = 0,
    empty: frozenset[int] = frozenset(),
) -> list[int]:
    """Parquet input files with distinct ids; returns every id.

    Streaming crash jobs read one file per micro-batch: 4 files give the 4 epochs the fault
    points (``point@N``, at most N=3) need; more rows or files prove nothing more. ``pad``
    makes each row's payload ``pad`` characters longer (:func:`payload`), for outputs that
    must reach a size (S3 parts of 5 MiB) with few rows. The files numbered in ``empty``
    hold no row (their micro-batches are empty). Their modification times increase with
    their names: Spark's file source takes files by modification time, and files written
    within one clock tick would come in any order (micro-batch N reads file N).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ids: list[int] = []
    now = time.time()
    for f in range(files):
        chunk = [] if f in empty else list(range(f * rows, (f + 1) * rows))
        ids += chunk
        pq.write_table(
            pa.table(
                {
                    "id": pa.array(chunk, pa.int64()),
                    "grp": [GROUPS[i % len(GROUPS)] for i in chunk],
                    "payload": [payload(i, pad) for i in chunk],
                }
            ),
            directory / f"in-{f:03d}.parquet",
        )
        os.utime(directory / f"in-{f:03d}.parquet", (now - 1000 + f, now - 1000 + f))
    return ids


# -- change streams: an oracle that sees every epoch ---------------------------------------
HOT_KEYS = ("h0", "h1", "h2")
"""The keys a change stream changes again and again (:func:`cdc_keys`)."""


def cdc_keys(f: int, rows: int) -> list[str]:
    """The key (``grp``) of each row of change file ``f`` (ids ``f * rows`` onwards; every id
    that is a multiple of 7 deletes its key, the largest id of a key in a file wins).

    Most rows insert a key of their own (``u<id>``) that no other row touches: an epoch lost,
    skipped "as committed" or never applied leaves its keys missing. Each hot key
    (:data:`HOT_KEYS`) is changed three times in most epochs (skipped in every fifth), its
    winning change alternating between deletes and upserts from epoch to epoch (deleted, then
    inserted again): the final row of a hot key is its last epoch's winner, so an old epoch
    applied after a newer one leaves a wrong row. Needs ``rows`` >= 24.
    """
    ids = list(range(f * rows, (f + 1) * rows))
    keys = {i: f"u{i}" for i in ids}
    free = sorted(ids, reverse=True)
    for k, hot in enumerate(HOT_KEYS):
        if (f + k) % 5 == 4:
            continue
        delete = (f + k) % 2 == 0
        winner = next(i for i in free if (i % 7 == 0) == delete)
        free.remove(winner)
        keys[winner] = hot
        for _ in range(2):  # two earlier changes of the key within the epoch
            earlier = next(i for i in free if i < winner)
            free.remove(earlier)
            keys[earlier] = hot
    return [keys[i] for i in ids]


def make_cdc_input(directory: Path, files: int = 4, rows: int = 40) -> list[int]:
    """Change files (``id``, ``grp`` the key, ``payload``) as :func:`make_input` names them,
    keyed by :func:`cdc_keys`, with increasing modification times (Spark's file source takes
    files by modification time, and a change stream's final state depends on their order).
    Returns every id."""
    directory.mkdir(parents=True, exist_ok=True)
    ids: list[int] = []
    now = time.time()
    for f in range(files):
        chunk = list(range(f * rows, (f + 1) * rows))
        ids += chunk
        path = directory / f"in-{f:03d}.parquet"
        pq.write_table(
            pa.table(
                {
                    "id": pa.array(chunk, pa.int64()),
                    "grp": cdc_keys(f, rows),
                    "payload": [payload(i) for i in chunk],
                }
            ),
            path,
        )
        os.utime(path, (now - 1000 + f, now - 1000 + f))
    return ids


def cdc_state(directory: Path) -> list[tuple[int, str, str]]:
    """The final state of the change files in ``directory`` applied in name order, one epoch
    each: per key the largest id of a file wins, a multiple of 7 deletes the key. Rows
    ``(id, grp, payload)``."""
    state: dict[str, tuple[int, str, str]] = {}
    for f in sorted(directory.glob("*.parquet")):
        last: dict[str, dict[str, Any]] = {}
        for r in pq.read_table(f).to_pylist():
            if r["grp"] not in last or r["id"] > last[r["grp"]]["id"]:
                last[r["grp"]] = r
        for grp, r in last.items():
            if r["id"] % 7 == 0:
                state.pop(grp, None)
            else:
                state[grp] = (r["id"], r["grp"], r["payload"])
    return sorted(state.values())


def check_commits_at_target(epochs_at_target: list[int], expected: list[int]) -> None:
    """Each epoch is in exactly one commit at the target, in epoch order (the target's own
    record: Iceberg snapshot summaries, the sql sink's ``sql_epochs``): an upsert epoch
    applied twice, or an old one after a newer one, leaves the final table unchanged but
    shows here."""
    assert epochs_at_target == sorted(expected), (
        f"the target's commits hold epochs {epochs_at_target}, expected each of "
        f"{sorted(expected)} once, in order"
    )


# -- processes: a driver and everything it started -------------------------------------
def session_members(sid: int) -> list[int]:
    """Pids of the live processes of session ``sid`` (field 6 of ``/proc/<pid>/stat``): a
    driver started with ``start_new_session`` and everything it started, pyspark's daemon
    and its Python workers included (the daemon moves to a process group of its own, not
    to another session)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(proc.name))
    return out


def _state_of(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def kill_session(sid: int, leader: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL every process of session ``sid`` (and reap ``leader``, its first process)
    until none is left (up to 30 s: on a loaded machine a killed JVM's or worker's exit,
    unmapping gigabytes, can take seconds; seen in a CI rehearsal at 5 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        members = session_members(sid)
        if not members and (leader is None or leader.poll() is not None):
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if leader is not None:
            try:
                leader.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.1)
    left = {pid: _state_of(pid) for pid in session_members(sid)}
    raise RuntimeError(f"session {sid}: processes (pid: state) {left} survive SIGKILL for 30 s")


def _driver_points(fault: str | None) -> bool:
    """Whether ``fault`` (``EOSINK_FAULT``'s value) arms driver points only."""
    from eosink.faults import EXECUTOR_FAULT_POINTS

    names = [f.split("@")[0].strip() for f in (fault or "").split(",") if f.strip()]
    return bool(names) and not set(names) & set(EXECUTOR_FAULT_POINTS)


# -- fault coverage: which real kill proved which point (tests/faultmatrix.py) --------------
FRONTS = {
    "stream": "run-stream",
    "batch": "run-batch",
    "ds-stream": "format-stream",
    "ds-batch": "format-batch",
}
"""tests/crashjob.py's modes as the fault coverage table's front ends."""


def record_coverage(sink: str, front: str, points: list[str]) -> None:
    """Note that the running test killed ``sink`` (the table's sink: ``sql-pg``,
    ``rolling``...) through ``front`` at ``points`` (``point`` or ``point:site``) and
    asserted it; conftest sets ``EOSINK_TEST_FAULT_COVERAGE`` to the run's record directory
    and checks the table at the end of a whole-suite run."""
    where = os.environ.get("EOSINK_TEST_FAULT_COVERAGE")
    if not where:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    with open(Path(where) / f"{os.getpid()}.jsonl", "a") as fh:
        for point in points:
            fh.write(json.dumps({"sink": sink, "front": front, "point": point, "test": test}))
            fh.write("\n")


def fired_points(marks: Path) -> list[str]:
    """The fault points whose marks are in ``marks`` (``EOSINK_FAULT_MARK``)."""
    return sorted(p.name.split(".")[0] for p in marks.iterdir())


def fired_sites(marks: Path) -> list[str]:
    """The same, each as ``point:site`` where the point names its site (the mark holds it)."""
    out = []
    for p in marks.iterdir():
        site = p.read_text().strip()
        out.append(f"{p.name.split('.')[0]}:{site}" if site else p.name.split(".")[0])
    return sorted(out)


class Job:
    """One driver program (tests/crashjob.py) with its paths."""

    def __init__(
        self,
        tmp: Path,
        mode: str,
        metastore: str,
        sink_options: dict[str, Any] | None = None,
        python: Path | None = None,
        **extra: str,
    ) -> None:
        """``extra``: more options of tests/crashjob.py (``partition_by="grp"`` gives
        ``--partition-by grp``). ``sink_options``: options of the sink merged over the ones
        the job builds (``--sink-options`` as JSON); ``{"path": "s3://bucket/prefix", ...}``
        makes a file sink write there instead of ``tmp/out`` (see :attr:`target`).
        ``python``: the driver's (and its executors') interpreter, another Spark line's
        environment (``bench/_pylines.py``); default this one's."""
        self.tmp = tmp
        self.python = python
        self.mode = mode
        self.input = tmp / "input"
        self.out = tmp / "out"
        self.checkpoint = tmp / "checkpoint"
        self.metastore = metastore
        self.sink_options = dict(sink_options or {})
        self.extra = extra
        self.logs: list[str] = []
        self.machine: Path | None = None
        """Set by :meth:`on_machine`: the driver's HOME, TMPDIR and working directory."""

    def on_machine(self, name: str) -> Path:
        """Run the next drivers as on another machine ``name``: their own HOME, TMPDIR and
        working directory under ``tmp/machines/<name>`` (and no EOSINK_HOME), so the default
        meta store (``metastore="default"``) is that machine's; only the checkpoint, the
        input and the target are shared. Returns the machine's HOME."""
        self.machine = self.tmp / "machines" / name
        for d in ("home", "tmp", "work"):
            (self.machine / d).mkdir(parents=True, exist_ok=True)
        return self.machine / "home"

    def argv(self) -> list[str]:
        extra = dict(self.extra)
        if extra.get("source") == "kafka" and "jars" not in extra:
            # Spark's Kafka connector (spark.jars of the driver; CDS is unaffected: the jars
            # are loaded by Spark's own class loader, not from the JVM's class path).
            from jvm import spark_kafka_conf

            extra["jars"] = spark_kafka_conf()["spark.jars"]
        args = [
            str(self.python or sys.executable),
            str(TESTS / "crashjob.py"),
            "--mode",
            self.mode,
            "--input",
            str(self.input),
            "--out",
            str(self.out),
            "--checkpoint",
            str(self.checkpoint),
            "--metastore",
            self.metastore,
        ]
        for k, v in extra.items():
            args += [f"--{k.replace('_', '-')}", v]
        if self.sink_options:
            args += ["--sink-options", json.dumps(self.sink_options)]
        return args

    def run(
        self,
        fault: str | None = None,
        kill_after: float | None = None,
        timeout: float = 300,
        kill_in_protocol: float | None = None,
    ) -> int:
        """Run the driver; with ``fault`` it must die by SIGKILL at that point.

        ``kill_after`` kills the whole driver (Python and JVM) after that many seconds.
        ``kill_in_protocol`` kills it that many seconds after this run persisted its first
        PENDING epoch (``saw_pending`` is then True), so that the kill lands inside the
        protocol rather than in Spark's start-up.
        Returns the exit code (-9 when killed).
        """
        log = self.tmp / f"run-{len(self.logs)}.log"
        self.saw_pending = False
        # format("eosink") runs eosink's driver side in Spark's Python workers: a point armed
        # there freezes its worker (SIGSTOP), and the whole driver (Python, JVM, workers) is
        # killed at once, as a driver machine dies; not the worker alone, which Spark would
        # report as a failed query while the JVM lives on.
        whole = self.mode.startswith("ds-") and _driver_points(fault)
        proc = self.spawn(str(len(self.logs)), fault, stop=whole)
        try:
            if kill_in_protocol is not None:
                self._wait_for_protocol(proc, timeout)
                kill_after = kill_in_protocol
            if whole:
                code = self._kill_when_fired(proc, timeout)
            else:
                code = proc.wait(timeout=kill_after if kill_after is not None else timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid, proc)
            if kill_after is None:
                raise AssertionError(f"driver timed out; log {log}") from None
            code = proc.wait()
        finally:
            # The driver is gone: make sure its JVM and Python workers are too.
            kill_session(proc.pid, proc)
        self.logs.append(log.read_text())
        return code

    def _kill_when_fired(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        """Wait until an armed point fired in any process of the driver (its mark appears),
        then SIGKILL every process of the driver; the driver's exit code (-9), or the code
        it exited with if it ended first."""
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if any(self.marks.iterdir()):
                kill_session(proc.pid, proc)
                break
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.argv(), timeout)
            time.sleep(0.02)
        return proc.wait()

    def spawn(
        self, name: str, fault: str | None = None, stop: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start a driver and return at once (the caller waits and kills; its log is
        ``tmp/run-<name>.log``). ``stop``: armed fault points SIGSTOP the driver instead of
        killing it (a zombie, resumed with SIGCONT to its process group)."""
        env = self._env(fault)
        if stop:
            env["EOSINK_FAULT_SIGNAL"] = "STOP"
        with open(self.tmp / f"run-{name}.log", "w") as fh:
            return subprocess.Popen(
                self.argv(),
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=None if self.machine is None else self.machine / "work",
            )

    def _env(self, fault: str | None) -> dict[str, str]:
        env = dict(os.environ)
        # Short-lived drivers start faster with the C1 JIT only, and with Spark's classes
        # from a class-data-sharing archive once conftest has built it (tests/jvm.py; another
        # Spark line's, once tests/test_spark_lines.py built it).
        from jvm import fast_driver_env, spark_cds_archive_path

        archive = os.environ.get("EOSINK_TEST_CDS", "0")
        if self.python is not None:  # another Spark line: nothing of this one's Spark
            from bench._pylines import child_env

            env = child_env(self.python)
            env.pop("EOSINK_TEST_CDS", None)
            if archive != "0":
                archive = str(spark_cds_archive_path(self.python))
        env.pop("EOSINK_FAULT", None)
        env = fast_driver_env(env, archive)
        self.marks = self.tmp / f"faults-{len(self.logs)}"
        self.marks.mkdir(exist_ok=True)
        env["EOSINK_FAULT_MARK"] = str(self.marks)
        if fault:
            env["EOSINK_FAULT"] = fault
        if self.machine is not None:
            env.pop("EOSINK_HOME", None)
            env["HOME"] = str(self.machine / "home")
            env["TMPDIR"] = str(self.machine / "tmp")
        # A killed driver leaves Spark's scratch behind (spark-*, blockmgr-*, artifacts-*, its
        # native libraries): in the job's directory, not thousands of entries in /tmp.
        scratch = self.machine / "tmp" if self.machine is not None else self.tmp / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        env["SPARK_LOCAL_DIRS"] = str(scratch)
        env["JDK_JAVA_OPTIONS"] += f" -Djava.io.tmpdir={scratch}"
        return env

    @property
    def metastore_url(self) -> str:
        """The meta store the next driver uses (``default``: its machine's own)."""
        if self.metastore != "default":
            return self.metastore
        home = (
            self.machine / "home" / ".eosink"
            if self.machine is not None
            else Path(os.environ["EOSINK_HOME"])
        )
        return f"sqlite:///{home / 'metastore.db'}"

    def _state(self) -> list[tuple[str, int]]:
        try:
            states = epoch_states(self.metastore_url, self.sink_id)
        except Exception:  # no schema yet
            return []
        return sorted((s, e) for s, epochs in states.items() for e in epochs)

    def _wait_for_protocol(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Return once this run persisted its first PENDING epoch (an epoch row that was not
        there before appeared: rows are only created PENDING), or the driver ended.
        ``saw_pending`` tells which."""
        before = {e for _, e in self._state()}
        deadline = time.monotonic() + timeout
        self.saw_pending = False
        while proc.poll() is None and time.monotonic() < deadline:
            if {e for _, e in self._state()} - before:
                self.saw_pending = True
                return
            time.sleep(0.02)

    def run_overlapping(
        self,
        timeout: float = 300,
        machines: tuple[str, str] | None = None,
        generation: Any = None,
    ) -> tuple[int, int, str, str]:
        """Start driver A; once A persisted its first PENDING epoch (it is inside the
        protocol), start driver B of the same job. A's micro-batches after its first are held
        on its executors until B has taken the sink over (the sink's generation went up), so
        B always fences a live A whatever the machine's speed. Wait for both; return
        (code A, code B, log A, log B), logs also in ``logs``. ``machines``: A and B run on
        these two machines (:meth:`on_machine`); ``generation``: how to read the sink's
        generation (default: the meta store's)."""
        generation_of = generation or self._generation
        if machines:
            self.on_machine(machines[0])
        env = self._env(None)
        env_b = env
        if machines:
            self.on_machine(machines[1])
            env_b = self._env(None)
        hold = self.tmp / "hold-a"
        hold.touch()
        procs: list[subprocess.Popen[bytes]] = []
        paths = [self.tmp / f"run-{len(self.logs)}-{name}.log" for name in ("a", "b")]
        handles = [open(p, "w") for p in paths]

        def start(run_env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(
                self.argv(),
                env=run_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(run_env["TMPDIR"]).parent / "work" if machines else None,
            )
            procs.append(proc)
            return proc

        try:
            a = start(dict(env, CRASHJOB_HOLD=str(hold)), handles[0])
            if machines:
                self.on_machine(machines[0])
            self._wait_for_protocol(a, timeout)
            generation = generation_of()
            b = start(env_b, handles[1])
            deadline = time.monotonic() + timeout
            while b.poll() is None and time.monotonic() < deadline:
                if generation_of() > generation:
                    break
                time.sleep(0.05)
            hold.unlink()
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            hold.unlink(missing_ok=True)
            for p in procs:
                kill_session(p.pid, p)
            for fh in handles:
                fh.close()
        logs = [p.read_text() for p in paths]
        self.logs += logs
        return codes[0], codes[1], logs[0], logs[1]

    def _generation(self) -> int:
        import sqlalchemy as sa

        eng = sa.create_engine(self.metastore_url)
        try:
            with eng.connect() as c:
                g = c.execute(
                    sa.text("select generation from eosink_sink where sink_id = :s"),
                    {"s": self.sink_id},
                ).scalar()
        except sa.exc.OperationalError:  # no schema yet
            return 0
        finally:
            eng.dispose()
        return int(g or 0)

    def fired(self) -> list[str]:
        """The fault points that killed a process during the last run."""
        return fired_points(self.marks)

    def fired_sites(self) -> list[str]:
        """The fault points that fired in the last run, each as ``point:site`` where the
        point names its site (``mid_commit:held``), else ``point``."""
        return fired_sites(self.marks)

    def assert_fired(self, fault: str, code: int | None = None) -> None:
        """The last run reached ``fault`` (``point`` or ``point@N``) and nothing else; a
        driver point killed the whole driver (``code`` -9, when given), an executor point
        only a task's worker (the driver finished: ``code`` 0, when given). Records the kill
        for the fault coverage table (tests/faultmatrix.py)."""
        from eosink.faults import EXECUTOR_FAULT_POINTS

        point = fault.split("@")[0]
        fired = self.fired()
        if point in EXECUTOR_FAULT_POINTS:
            assert point in fired, f"fault {fault} not reached ({fired}):\n{self.last_log()}"
            assert code in (None, 0), f"the driver failed (exit {code}):\n{self.last_log()}"
        else:
            assert fired == [point], f"fault {fault} not reached ({fired}):\n{self.last_log()}"
            assert code in (None, -signal.SIGKILL), (
                f"the driver survived {fault} (exit {code}):\n{self.last_log()}"
            )
        record_coverage(
            self.coverage_sink,
            self.coverage_front,
            [f for f in self.fired_sites() if f.split(":")[0] == point],
        )

    @property
    def coverage_front(self) -> str:
        """The front end of the fault coverage table this job drives (:data:`FRONTS`)."""
        return FRONTS[self.mode]

    @property
    def coverage_sink(self) -> str:
        """The sink as the fault coverage table names it: ``rolling`` for the file sink with
        files that span epochs, ``sql-pg`` / ``sql-sqlite`` by the sql sink's target."""
        sink = self.extra.get("sink", "file")
        opts = self.sink_options
        if sink == "file" and any(
            opts.get(k) is not None
            for k in ("max_row_count", "max_file_bytes", "rollover_seconds", "inactivity_seconds")
        ):
            return "rolling"
        if sink == "sql":
            return "sql-sqlite" if str(opts.get("url", "")).startswith("sqlite") else "sql-pg"
        return sink

    @property
    def target(self) -> str:
        """Where a file sink job writes: ``tmp/out`` or the ``path`` of ``sink_options``."""
        path = self.sink_options.get("path")
        return str(path) if path else str(self.out.resolve())

    @property
    def sink_id(self) -> str:
        if "sink_id" in self.sink_options:
            return str(self.sink_options["sink_id"])
        if self.extra.get("sink") == "iceberg":
            return "iceberg:eosink.db.events"
        if self.extra.get("sink") == "delta":
            return f"delta:{self.out}"
        if self.extra.get("sink") in ("kafka", "sql"):
            import eosink

            # the sink's own default (kafka:<topic>, sql:<server>/<database>/<table>)
            plugin = eosink.get_sink(self.extra["sink"])
            return plugin.default_sink_id(plugin.parse_options(self.sink_options))
        return f"file:{self.target.rstrip('/')}"

    def kafka_staged(self) -> list[str]:
        """Files a kafka sink job left under its staging location (``staging_path`` of the
        sink options, a directory or ``s3://bucket/prefix`` read with boto3; unset, the
        sink's default: ``<checkpoint>/eosink/staging`` for a stream,
        ``$EOSINK_HOME/kafka-staging`` for a batch), ``<sink key>/<epoch>/<attempt>/part-*``
        relative to it."""
        import hashlib

        key = hashlib.sha1(self.sink_id.encode()).hexdigest()[:16]  # the sink's own naming
        staging = self.sink_options.get("staging_path")
        if staging is None and self.mode in ("batch", "ds-batch"):
            machine = getattr(self, "machine", None)  # a driver "on another machine"
            home = machine / "home" / ".eosink" if machine else Path(os.environ["EOSINK_HOME"])
            staging = str(home / "kafka-staging")
        elif staging is None:
            staging = f"{self.checkpoint.resolve()}/eosink/staging"
        root = Output(f"{str(staging).rstrip('/')}/{key}", self.sink_options.get("s3_endpoint_url"))
        return sorted(root.objects())

    def output(self) -> Output:
        """The file sink's output, read without eosink (local disk or boto3)."""
        return Output(self.target, self.sink_options.get("s3_endpoint_url"))

    def iceberg_options(self) -> Any:
        """The iceberg sink options this job uses (to read the table independently)."""
        import eosink

        return eosink.get_sink("iceberg").parse_options(self.iceberg_raw_options())

    def iceberg_raw_options(self) -> dict[str, Any]:
        """The iceberg sink's options of this job, as keyword arguments (table, catalog)."""
        opts: dict[str, Any] = {"table": "db.events"}
        if self.extra.get("catalog_json"):
            opts["catalog"] = json.loads(self.extra["catalog_json"])
        elif self.extra.get("catalog_uri"):
            opts["catalog"] = {
                "type": "sql",
                "uri": self.extra["catalog_uri"],
                "warehouse": f"file://{self.out}",
            }
        else:
            opts["warehouse"] = str(self.out)
        return opts

    def last_log(self) -> str:
        return self.logs[-1][-6000:] if self.logs else ""


def crash_chain(job: Job, faults: list[str]) -> None:
    """Kill the driver at each fault point of ``faults`` in turn (``point`` or ``point@N``;
    each restart armed with the next point after it recovered from the previous crash:
    points of one chain fire in successive runs), asserting that each fired and killed the
    whole driver; then run it to the end (exit 0)."""
    for fault in faults:
        code = job.run(fault=fault)
        job.assert_fired(fault, code)
    assert job.run() == 0, job.last_log()


def run_with_random_kills(
    job: Job,
    rng: random.Random,
    window: float,
    attempts: int = 4,
    before_run: Any = None,
) -> None:
    """Run ``job`` with its driver killed at random instants, then until it exits 0.

    Kills alternate between an instant drawn from the first change of the sink's meta store
    rows in that run (up to ``window`` seconds after it, so kills provably land inside the
    protocol) and one drawn from the start of the driver (which may land in Spark's
    start-up). At least one kill must land after a run's first PENDING epoch. ``attempts``:
    how many runs may be killed at most (a run that exits 0 ends the kills).
    """
    in_protocol = 0
    for attempt in range(attempts):
        if before_run is not None:
            before_run()
        if attempt % 2 == 0:
            code = job.run(kill_in_protocol=rng.uniform(0.0, window))
            # Killed, and the kill came after this run's first PENDING epoch.
            in_protocol += code == -9 and job.saw_pending
        else:
            code = job.run(kill_after=rng.uniform(4.0, 16.0))
        assert code in (0, -9), job.last_log()
        if code == 0:
            break
    assert in_protocol >= 1, "no kill landed after the run's first PENDING epoch"
    if before_run is not None:
        before_run()
    assert job.run() == 0, job.last_log()


class KafkaRecord(NamedTuple):
    """One record of a topic as a consumer saw it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None


def kafka_sink_options(kafka: Any, tmp: Path, prefix: str, **more: Any) -> dict[str, Any]:
    """Options of a kafka sink writing to a new 2-partition topic ``<prefix>-<random>`` of
    ``kafka`` (the test broker), staging under ``tmp/staging``; ``more`` merged over them."""
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(topic, partitions=2)
    return {
        "bootstrap_servers": kafka.bootstrap,
        "topic": topic,
        "staging_path": str(tmp / "staging"),
        "timeout_seconds": 20,
        **more,
    }


def read_topic(
    bootstrap: str, topic: str, isolation: str = "read_committed", timeout: float = 60
) -> list[KafkaRecord]:
    """Every record of ``topic`` visible at ``isolation`` (``read_committed`` or
    ``read_uncommitted``), read with confluent-kafka from the beginning to the end of every
    partition (with ``read_committed`` the end is the last stable offset: an open
    transaction holds the reader there). Per partition in offset order."""
    import uuid

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        parts = sorted(md.topics[topic].partitions)
        assert parts, f"topic {topic} has no partitions"
        todo: set[int] = set()
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                todo.add(p)
        consumer.assign([TopicPartition(topic, p, -2) for p in sorted(todo)])  # beginning
        out: list[KafkaRecord] = []
        deadline = time.monotonic() + timeout
        while todo:
            assert time.monotonic() < deadline, (
                f"{topic}: partitions {sorted(todo)} not read to their end in {timeout} s "
                f"({len(out)} records read)"
            )
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                todo.discard(int(msg.partition() or 0))
                continue
            out.append(
                KafkaRecord(
                    int(msg.partition() or 0),
                    int(msg.offset() or 0),
                    msg.key(),
                    msg.value(),
                    msg.headers(),
                )
            )
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def fill_topic(bootstrap: str, topic: str, files: int = 4, rows: int = 300) -> list[int]:
    """Produce the rows :func:`make_input` would write (``id``, ``grp``, ``payload``) as JSON
    values (key ``grp``) into ``topic``, committed in ``files`` transactions; returns every
    id. The source of the Kafka-source crash jobs (``crashjob.py --source kafka``)."""
    import uuid

    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"fill-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(60)
    ids: list[int] = []
    for f in range(files):
        producer.begin_transaction()
        for i in range(f * rows, (f + 1) * rows):
            row = {"id": i, "grp": GROUPS[i % len(GROUPS)], "payload": payload(i)}
            producer.produce(topic, json.dumps(row).encode(), row["grp"].encode())
            ids.append(i)
        producer.commit_transaction(60)
    return ids


def read_ids(out: Path, partitioned: bool = False) -> list[int]:
    """Read the output back with pyarrow (the independent reader)."""

    def visible(p: Path) -> bool:  # what Spark and pyarrow read: no "_" or "." prefix
        return p.is_file() and not any(x[:1] in "_." for x in p.relative_to(out).parts)

    if not out.exists() or not any(visible(p) for p in out.rglob("*")):
        return []
    dataset = ds.dataset(out, format="parquet", partitioning="hive" if partitioned else None)
    return sorted(dataset.to_table(columns=["id"]).column("id").to_pylist())


def staged_files(out: Path) -> list[str]:
    return sorted(str(p) for p in out.rglob("*") if p.is_file() and "_eosink_staging" in p.parts)


def expected_epochs(job: Job) -> list[int]:
    """The epochs a finished crash job's meta store must hold COMMITTED: a batch job's one
    (``epoch=5``); a stream's, every micro-batch Spark ran, as its own offsets log in the
    checkpoint lists them (epoch = batch id; a batch retried after a crash keeps its id).
    Not one per input file: a micro-batch planned again after a crash may take two files
    (``maxFilesPerTrigger`` with ``availableNow``), as CI saw."""
    if job.mode in ("batch", "ds-batch"):
        return [5]
    offsets = job.checkpoint / "offsets"
    return sorted(int(p.name) for p in offsets.iterdir() if p.name.isdigit())


def epoch_states(metastore: str, sink_id: str) -> dict[str, list[Any]]:
    """Status -> epochs of one sink, read with plain SQL (not through eosink)."""
    import sqlalchemy as sa

    eng = sa.create_engine(metastore)
    try:
        with eng.connect() as c:
            rows = c.execute(
                sa.text("select status, epoch from pending_sink_state where sink_id = :s"),
                {"s": sink_id},
            ).all()
    finally:
        eng.dispose()
    out: dict[str, list[Any]] = {}
    for status, epoch in rows:
        out.setdefault(status, []).append(epoch)
    return out


class Output:
    """A file sink's output, a local directory or an ``s3://bucket/prefix``, read without
    eosink: plain filesystem calls, or boto3 against the S3 server (``endpoint``)."""

    def __init__(self, location: str | Path, endpoint: str | None = None) -> None:
        self.location = str(location)
        self.endpoint = endpoint
        self.is_s3 = self.location.startswith("s3://")
        if self.is_s3:
            bucket, _, prefix = self.location.removeprefix("s3://").partition("/")
            self.bucket, self.prefix = bucket, prefix.strip("/")

    def __repr__(self) -> str:
        return f"Output({self.location!r})"

    def client(self) -> Any:
        return s3_client(self.endpoint)

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def objects(self) -> dict[str, int]:
        """Every file (object) under the location: relative path -> size in bytes."""
        if not self.is_s3:
            root = Path(self.location)
            if not root.exists():
                return {}
            return {
                p.relative_to(root).as_posix(): p.stat().st_size
                for p in root.rglob("*")
                if p.is_file()
            }
        out: dict[str, int] = {}
        start = f"{self.prefix}/" if self.prefix else ""
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=start)
        )
        for page in pages:
            for o in page.get("Contents", []):
                out[o["Key"][len(start) :]] = int(o["Size"])
        return out

    def visible(self) -> dict[str, int]:
        """The files readers see (Spark, pyarrow): none under a ``_`` or ``.`` name."""
        return {
            rel: size
            for rel, size in self.objects().items()
            if not any(x[:1] in "_." for x in rel.split("/"))
        }

    def staged(self) -> list[str]:
        """Files left under ``_eosink_staging/``."""
        return sorted(rel for rel in self.objects() if rel.split("/", 1)[0] == "_eosink_staging")

    def read_bytes(self, rel: str) -> bytes:
        if not self.is_s3:
            return (Path(self.location) / rel).read_bytes()
        body = self.client().get_object(Bucket=self.bucket, Key=self._key(rel))["Body"]
        return bytes(body.read())

    def open_uploads(self) -> list[dict[str, str]]:
        """Multipart uploads started and neither completed nor aborted under the prefix
        (S3's ``ListMultipartUploads``); always empty on local disk."""
        if not self.is_s3:
            return []
        start = f"{self.prefix}/" if self.prefix else ""
        resp = self.client().list_multipart_uploads(Bucket=self.bucket, Prefix=start)
        return [{"key": u["Key"], "upload_id": u["UploadId"]} for u in resp.get("Uploads", [])]

    def abort_uploads(self) -> list[dict[str, str]]:
        """Abort every open multipart upload under the prefix behind eosink's back; return
        the ones aborted."""
        uploads = self.open_uploads()
        for u in uploads:
            self.client().abort_multipart_upload(
                Bucket=self.bucket, Key=u["key"], UploadId=u["upload_id"]
            )
        return uploads

    def manifest_files(self) -> list[tuple[str, int, str]]:
        """The files the committed epochs' manifests (``_eosink/commits/<key>/*.json``) name:
        ``(relative path, size in bytes, manifest)``, one per mention."""
        out: list[tuple[str, int, str]] = []
        for rel in sorted(self.objects()):
            parts = rel.split("/")
            if len(parts) == 4 and parts[:2] == ["_eosink", "commits"] and rel.endswith(".json"):
                for f in json.loads(self.read_bytes(rel))["files"]:
                    out.append((f["path"], int(f["bytes"]), rel))
        return out


def s3_client(endpoint: str | None) -> Any:
    """A boto3 client of the test S3 server."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def unescape_partition(segment: str) -> str:
    """``grp=de%2Fat`` -> ``de/at``; Hive's null directory -> ``""``."""
    import re

    value = segment.split("=", 1)[1]
    if value == "__HIVE_DEFAULT_PARTITION__":
        return ""
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), value)


def read_file_rows(data: bytes, name: str, fmt: str) -> list[dict[str, Any]]:
    """Decode one output file completely with the format's own reader (pyarrow, or json for
    JSON lines); raises if the file is not a valid file of that format."""
    import bz2
    import gzip
    import io

    if name.endswith(".gz"):
        data = gzip.decompress(data)
    elif name.endswith(".bz2"):
        data = bz2.decompress(data)
    if fmt == "parquet":
        table = pq.read_table(io.BytesIO(data))
    elif fmt == "orc":
        import pyarrow.orc as orc

        table = orc.ORCFile(io.BytesIO(data)).read()
    elif fmt == "csv":
        import pyarrow.csv as pcsv

        table = pcsv.read_csv(io.BytesIO(data))
    elif fmt == "json":
        text = data.decode()
        assert text.endswith("\n"), f"{name}: the last JSON line is cut"
        return [json.loads(line) for line in text.splitlines()]
    else:
        raise ValueError(f"no reader for format {fmt!r}")
    return list(table.to_pylist())


def read_output_rows(output: Output, fmt: str) -> list[dict[str, Any]]:
    """Every row of every visible file of ``output``; each row also gets ``_file`` (its
    file's relative path) and, for Hive partition directories, their unescaped values."""
    rows: list[dict[str, Any]] = []
    for rel in sorted(output.visible()):
        try:
            got = read_file_rows(output.read_bytes(rel), rel, fmt)
        except Exception as exc:
            raise AssertionError(f"{output}: {rel} is not a valid {fmt} file: {exc}") from exc
        dirs = {
            seg.split("=", 1)[0]: unescape_partition(seg)
            for seg in rel.split("/")[:-1]
            if "=" in seg
        }
        rows += [{**r, **dirs, "_file": rel} for r in got]
    return rows


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus endpoint (``eosink.metrics.serve_prometheus``, ``eosink
    metrics serve``), parsed by prometheus_client's parser: (name, labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if not k.startswith("otel_scope")}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    """The sample ``name`` whose labels include ``labels`` (sink id/kind, outcome...)."""
    want = {(k if k in ("le", "error_type") else f"eosink_{k}", v) for k, v in labels.items()}
    hits = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


_PENDING_DRIVER = textwrap.dedent(
    """
    import os, signal, sys, time
    import pyarrow as pa
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime
    from eosink.registry import get_sink
    from eosink.testing import drive_writers

    url, out, sid = sys.argv[1:4]
    plugin = get_sink("file")
    options = plugin.parse_options({"path": out, "format": "parquet"})
    rt = SinkRuntime(plugin, options, sid, MetaStore(url))
    rt.start()
    rt.lineage = "0123456789abcdef"
    schema = pa.schema([("id", pa.int64())])
    start = 0
    for epoch in range(10):
        n = 100 + 40 * epoch
        batch = pa.record_batch([pa.array(range(start, start + n), pa.int64())], schema)
        start += n
        setup = rt.coordinator.writer_setup(schema)
        results = drive_writers(plugin, options, sid, epoch, [[batch]], setup)
        c, fig = rt.pre_commit(epoch, results, rows=n, write_s=0.0)
        if epoch < 8:
            time.sleep(0.15 * (epoch % 3))  # commits that take longer, some of them
            rt.commit_epoch(epoch, c, fig)
        time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGKILL)  # epochs 8 and 9 PENDING, the driver gone
    """
)


def driver_killed_with_two_pending(url: str, out: Path, sid: str) -> None:
    """A driver process without Spark (the core's ``SinkRuntime``, the file sink at ``out``,
    the meta store at ``url``) commits epochs 0-7 (100 + 40 x epoch rows each, ids from 0),
    persists 8 and 9 and is SIGKILLed: two PENDING epochs, their owner dead."""
    died = subprocess.run(
        [sys.executable, "-c", _PENDING_DRIVER, url, str(out), sid], capture_output=True, text=True
    )
    assert died.returncode == -signal.SIGKILL, died.stderr


def runbook_blocks(page: str, heading: str) -> list[tuple[str, str]]:
    """The fenced code blocks (language, text) of ``heading``'s section of ``docs/<page>``:
    what a runbook test runs as written (substituting only its placeholders)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else len(text)]
    return [
        (lang, "\n".join(line.strip() for line in body.strip("\n").splitlines()))
        for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    ]
