"""A real Spark Connect server on 127.0.0.1, and the client jobs the Connect tests run.

``ConnectServer`` starts ``org.apache.spark.sql.connect.service.SparkConnectServer`` as a JVM
process of its own with the pyspark package's ``bin/spark-submit`` (pyspark 4 ships the server,
``jars/spark-connect_2.13-*.jar``, among its jars: ``sbin/start-connect-server.sh`` does the
same through ``spark-daemon.sh``), ``--master local[2]``, in the foreground, on a free loopback
port, in a session of its own (``start_new_session``): its Python workers (pyspark's
``daemon.py``, which moves to a process group of its own, and Spark Connect's ``foreachBatch``
worker) stay in that session, so :meth:`ConnectServer.kill` finds every process the server
started by its session id. The JVM gets SIGKILL when the process that started it dies
(``PR_SET_PDEATHSIG``) and at interpreter exit (``atexit``), and a watchdog process kills the
rest of the session then (Spark Connect's ``foreachBatch`` worker outlives its JVM for
minutes otherwise), so a pytest killed hard leaves nothing behind. The server's Python
workers run this interpreter (``PYSPARK_PYTHON``): they import eosink from the tests'
environment, as the classic tests' executors do.

Spark Connect clients never run in the pytest process: creating a remote session switches
pyspark to Connect mode process-wide (the classic sessions the rest of the suite shares would
break). Every client is ``tests/connect_job.py`` in a subprocess, given its steps as JSON
(see that file); :class:`ConnectJob` is the crash harness's :class:`harness.Job` for it (same
independent readers, same kill helpers), and :func:`run_client` runs several steps in one
client session (one Python start-up for several cases).

Fault points (``EOSINK_FAULT``) fire where eosink's code runs. Over Spark Connect that is:

* ``eosink.run`` batch: the client (the coordinator runs in the client's Python; Spark's
  writes run on the server): arm them in the client's environment (``Job.run(fault=...)``).
* ``eosink.run`` streams: the server's ``foreachBatch`` worker (a Python process the server
  JVM starts per query); ``format("eosink")``: the server's data-source Python workers. Both
  inherit the server JVM's environment, so the points are armed when the server starts
  (``ConnectServer(env={"EOSINK_FAULT": ...})``), and a point kills that worker, not the
  JVM: the query fails (and the JVM lives on). A test that wants the *server* dead at the
  point kills it as soon as the point's mark appears (:meth:`ConnectServer.kill_when_fired`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import Job, kill_session, session_members
from jvm import FAST_JVM_FLAGS, free_port

TESTS = Path(__file__).resolve().parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home(python: Path | None = None) -> Path:
    """pyspark's directory (its ``bin/spark-submit``, ``jars/``): this interpreter's, or the
    one ``python`` imports (another Spark line's environment, bench/_pylines.py)."""
    if python is None:
        import pyspark

        return Path(pyspark.__file__).resolve().parent
    out = subprocess.run(
        [str(python), "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()).resolve()


CONNECT_35_JAR = "org.apache.spark:spark-connect_2.12:3.5.7"
"""Spark 3.5's Connect server (pyspark 3.5 does not ship it): the newest 3.5 build the Maven
Central mirror here serves (3.5.8 and 3.5.9 are refused); a 3.5 patch release runs another's
Connect plugin."""


def connect_jars(home: Path) -> list[Path]:
    """The jars a Connect server of the pyspark in ``home`` needs beyond its own: Spark 3.5's
    Connect plugin (:data:`CONNECT_35_JAR`, fetched once); none from 4.0 on, which ships it."""
    if any((home / "jars").glob("spark-connect_*.jar")) or not any(
        (home / "jars").glob("spark-core_2.12-3.5.*.jar")
    ):
        return []
    from jvm import fetch

    return [j for j in fetch([CONNECT_35_JAR]) if j.name.startswith("spark-connect_2.12")]


def _die_with_parent() -> None:
    """``preexec_fn``: SIGKILL when the starting process dies (Linux ``PR_SET_PDEATHSIG``;
    kept across ``exec``, so the JVM that ``spark-submit`` execs has it)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


# Watches the process that started a server: once it is gone (a pytest killed hard), kills
# every process of the server's session. PR_SET_PDEATHSIG covers the JVM alone, and Spark
# Connect's foreachBatch worker outlives its JVM for minutes (its Connect client retries the
# lost server). Exits when the session is empty (the server was killed or stopped).
_WATCHDOG = """
import os, signal, sys, time
parent, sid = int(sys.argv[1]), int(sys.argv[2])
def members():
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out
while members():
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        for _ in range(10):
            for pid in members():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        break
    time.sleep(1)
"""

_LIVE: set[ConnectServer] = set()


@atexit.register
def _kill_live_servers() -> None:
    for server in list(_LIVE):
        server.kill()


class ServerError(RuntimeError):
    """The Connect server did not start (the message carries the end of its log)."""


class ConnectServer:
    """A Spark Connect server (its own JVM, ``local[2]``) on ``127.0.0.1:<port>``.

    Args:
        root: a directory for the server's log, working, local and temp directories.
        conf: more Spark settings (``--conf``), e.g. ``jvm.spark_kafka_conf()``.
        env: more environment variables of the server and so of its Python workers
            (``EOSINK_FAULT``, ``EOSINK_FAULT_MARK``); :meth:`restart` can change them.
        port: the gRPC port (default: a free one); kept across restarts.
        python: the server's Python workers' interpreter, whose pyspark runs the server
            (default: this one); another Spark line's environment (bench/_pylines.py).
        jars: more jars of the server (``--jars``); by default :func:`connect_jars` (Spark
            3.5 ships no Connect server: its ``spark-connect_2.12`` jar from Maven Central).

    ``url`` is the client's ``sc://127.0.0.1:<port>``. The server starts at construction
    (``start=False`` defers it) and is ready when the port is open and a client query ran.
    """

    def __init__(
        self,
        root: Path,
        conf: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        start: bool = True,
        timeout: float = 180,
        python: Path | None = None,
        jars: list[Path] | None = None,
    ) -> None:
        self.python = str(python or sys.executable)
        self.home = spark_home(python)
        self.jars = list(jars) if jars is not None else connect_jars(self.home)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.conf = dict(conf or {})
        self.env = dict(env or {})
        self.port = port or free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log = self.root / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._orphans: list[tuple[int, subprocess.Popen[bytes] | None]] = []
        self.starts = 0
        if start:
            self.start(timeout)

    def __repr__(self) -> str:
        return f"ConnectServer({self.url}, pid={self.proc.pid if self.proc else None})"

    def command(self) -> list[str]:
        (self.root / "local").mkdir(exist_ok=True)
        java_options = list(FAST_JVM_FLAGS)
        # The Spark drivers' class-data-sharing archive (tests/jvm.py; conftest names it in
        # EOSINK_TEST_CDS once built): the server's class path is a driver's, and it starts
        # in half the time (6 s instead of 12 here). A mismatch is ignored (-Xshare:auto).
        archive = os.environ.get("EOSINK_TEST_CDS", "0")
        if archive != "0" and self.python != sys.executable:  # another line's (if built)
            from jvm import spark_cds_archive_path

            archive = str(spark_cds_archive_path(Path(self.python)))
        if archive != "0" and Path(archive).exists():
            java_options += [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds=off"]
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.local.dir": str(self.root / "local"),
            "spark.driver.extraJavaOptions": " ".join(java_options),
            # A Python worker started without the daemon (Spark Connect's foreachBatch
            # worker) has 15 s by default to connect back: not enough for its imports on a
            # loaded 2-core machine (seen: "Timed out while waiting for the Python worker").
            "spark.python.authenticate.socketTimeout": "120s",
            **self.conf,
        }
        cmd = [
            str(self.home / "bin" / "spark-submit"),
            *(["--jars", ",".join(map(str, self.jars))] if self.jars else []),
            "--class",
            SERVER_CLASS,
            "--name",
            "eosink-connect-tests",
            "--master",
            "local[2]",
        ]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        return cmd

    def _environ(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("EOSINK_FAULT", "EOSINK_FAULT_MARK", "EOSINK_FAULT_SIGNAL", "SPARK_REMOTE"):
            env.pop(key, None)
        env.pop("PYSPARK_SUBMIT_ARGS", None)  # a client's (CDS archive), not this JVM's
        env.update(
            SPARK_HOME=str(self.home),
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.root),
            TMPDIR=str(self.root / "local"),
        )
        if self.python != sys.executable:  # another line's: this checkout's eosink first
            from bench._pylines import checkout_path

            env["PYTHONPATH"] = checkout_path()
        env.update(self.env)
        return env

    def start(self, timeout: float = 180) -> None:
        """Start the server and wait until it answers a client query."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        with open(self.log, "ab") as fh:
            fh.write(f"\n==== start {self.starts} {time.ctime()} env {self.env}\n".encode())
            fh.flush()
            self.proc = subprocess.Popen(
                self.command(),
                env=self._environ(),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self.proc.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        _LIVE.add(self)
        try:
            self.wait_ready(timeout)
        except ServerError:
            self.kill()
            # The free port chosen at construction was taken by another process meanwhile
            # (parallel tests): a server that never served may move to another one.
            if self.starts == 1 and "Failed to bind to address" in self.tail():
                self.port = free_port()
                self.url = f"sc://127.0.0.1:{self.port}"
                self.start(timeout)
                return
            raise
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout: float = 180) -> None:
        """Return once the gRPC port accepts connections and a client ran a query (``probe``
        of tests/connect_job.py in a subprocess: 2 s on a warm server)."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"{self}: port not open in {timeout:.0f} s\n{self.tail()}")
            time.sleep(0.25)
        while True:
            left = deadline - time.monotonic()
            try:
                out = subprocess.run(
                    [self.python, str(TESTS / "connect_job.py"), "--probe", self.url],
                    capture_output=True,
                    text=True,
                    timeout=max(left, 5),
                )
                if out.returncode == 0:
                    return
                reason = (out.stdout + out.stderr)[-2000:]
            except subprocess.TimeoutExpired:
                reason = "probe timed out"
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServerError(f"{self}: no client query in {timeout:.0f} s: {reason}")
            time.sleep(0.5)

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise ServerError(f"{self}: the server exited ({code})\n{self.tail()}")

    def tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def processes(self) -> list[int]:
        """The live processes the server started (its session: the JVM, Python workers)."""
        return session_members(self.proc.pid) if self.proc is not None else []

    def kill(self) -> None:
        """SIGKILL the JVM and every process of its session, at once (a machine losing its
        driver), and any orphans :meth:`kill_jvm` left; returns when none is left."""
        if self.proc is not None:
            kill_session(self.proc.pid, self.proc)
            self._end_watchdog(self._watchdog)
            self._watchdog = None
        self.kill_orphans()
        _LIVE.discard(self)

    def kill_jvm(self) -> list[int]:
        """SIGKILL the server's JVM alone (as the kernel's OOM killer would): the Python
        workers it started live on, orphaned, until they notice (Spark Connect's
        foreachBatch worker: minutes, its Connect client retrying the lost server, which may
        be back on the same port by then). Returns their pids; :meth:`kill_orphans` ends
        them (:meth:`kill` and :meth:`stop` too)."""
        assert self.proc is not None
        sid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(sid, signal.SIGKILL)
        self.proc.wait()
        self._orphans.append((sid, self._watchdog))
        self._watchdog = None
        return session_members(sid)

    def orphans(self) -> list[int]:
        """The live processes of the sessions of JVMs that :meth:`kill_jvm` killed."""
        return [pid for sid, _ in self._orphans for pid in session_members(sid)]

    def kill_orphans(self) -> None:
        while self._orphans:
            sid, watchdog = self._orphans.pop()
            kill_session(sid, None)
            self._end_watchdog(watchdog)

    @staticmethod
    def _end_watchdog(watchdog: subprocess.Popen[bytes] | None) -> None:
        if watchdog is not None:  # nothing left to watch
            with contextlib.suppress(ProcessLookupError):
                watchdog.kill()
            watchdog.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then :meth:`kill` whatever is left after 20 s)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        self.kill()

    def restart(
        self, env: dict[str, str] | None = None, kill: bool = True, timeout: float = 180
    ) -> None:
        """Kill (``kill=True``) or stop the server, then start it again on the same port;
        ``env`` replaces the extra environment (``{}``: none)."""
        self.kill() if kill else self.stop()
        if env is not None:
            self.env = dict(env)
        self.start(timeout)

    def ensure(self, env: dict[str, str] | None = None, timeout: float = 180) -> None:
        """Make the server run with the extra environment ``env`` (``None``: whatever it
        has): start it if it is not running, restart it if its environment differs."""
        if env is not None and env != self.env:
            if self.alive:
                self.kill()
            self.env = dict(env)
        if not self.alive:
            self.start(timeout)

    def kill_when_fired(
        self, marks: Path, point: str, count: int = 1, timeout: float = 300
    ) -> float:
        """Wait until fault point ``point`` fired in ``count`` of the server's processes
        (their ``<point>.<pid>`` marks appear in ``marks``, the server's
        ``EOSINK_FAULT_MARK``), then SIGKILL the server at once. Returns the seconds waited."""
        started = time.monotonic()
        while len(list(marks.glob(f"{point}.*"))) < count:
            if time.monotonic() - started > timeout:
                raise AssertionError(f"fault {point} did not fire {count}x in {timeout:.0f} s")
            if not self.alive:
                raise ServerError(f"{self}: died before {point} fired\n{self.tail()}")
            time.sleep(0.02)
        self.kill()
        return time.monotonic() - started

    def __enter__(self) -> ConnectServer:
        if not self.alive:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------
# Clients: tests/connect_job.py in subprocesses
# ---------------------------------------------------------------------------------------


def client_command(url: str, steps: list[dict[str, Any]], python: str | None = None) -> list[str]:
    """tests/connect_job.py running ``steps`` against ``url`` (with ``python``: another Spark
    line's client)."""
    job = json.dumps({"url": url, "steps": steps})
    return [python or sys.executable, str(TESTS / "connect_job.py"), job]


def client_env(fault: str | None = None, marks: Path | None = None) -> dict[str, str]:
    """The environment of a client process: the tests', less Spark driver settings (a
    Connect client starts no JVM), with ``fault`` armed in the client itself."""
    env = dict(os.environ)
    for key in ("EOSINK_FAULT", "EOSINK_FAULT_MARK", "PYSPARK_SUBMIT_ARGS", "SPARK_REMOTE"):
        env.pop(key, None)
    if fault:
        env["EOSINK_FAULT"] = fault
    if marks is not None:
        env["EOSINK_FAULT_MARK"] = str(marks)
    return env


class ClientRun:
    """What one client process printed: its exit code, its log and its steps' outcomes."""

    def __init__(self, code: int | None, log: str) -> None:
        self.code = code
        self.log = log
        self.results: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        """One per step that raised: ``{"step", "class", "module", "eosink_class",
        "message"}`` (``eosink_class``: the eosink error class the message names, if any)."""
        for line in log.splitlines():
            tag, _, rest = line.partition(" ")
            if tag == "RESULT":
                self.results.append(json.loads(rest))
            elif tag == "ERROR":
                self.errors.append(json.loads(rest))

    def error(self, step: int) -> dict[str, Any] | None:
        return next((e for e in self.errors if e["step"] == step), None)

    def result(self, step: int) -> dict[str, Any] | None:
        return next((r for r in self.results if r["step"] == step), None)

    def __repr__(self) -> str:
        return f"ClientRun(code={self.code}, log=...{self.log[-4000:]})"


class Client:
    """A client process (tests/connect_job.py) running ``steps`` in one session, started in
    the background (its own session: :meth:`finish` kills whatever it left)."""

    def __init__(
        self,
        url: str,
        steps: list[dict[str, Any]],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        python: str | None = None,
    ) -> None:
        self.log = log
        env = dict(env or client_env())
        if python is not None and python != sys.executable:  # another line's client
            from bench._pylines import checkout_path

            env["PYTHONPATH"] = checkout_path()
        with open(log, "w") as fh:
            self.proc = subprocess.Popen(
                client_command(url, steps, python),
                env=env,
                cwd=cwd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> ClientRun:
        """What the client printed so far (``code`` is its exit code, None while it runs)."""
        return ClientRun(self.proc.poll(), self.log.read_text(errors="replace"))  # type: ignore[arg-type]

    def wait_until(self, done: Any, timeout: float = 300) -> ClientRun:
        """Poll the client's output until ``done(output)`` holds; fail if the client ends
        first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.output()
            if done(out):
                return out
            assert out.code is None, f"the client ended: {out}"
            assert time.monotonic() < deadline, f"client: nothing after {timeout:.0f} s: {out}"
            time.sleep(0.2)

    def finish(self, timeout: float = 300) -> ClientRun:
        """Wait for the client to end (at most ``timeout`` s: then kill it and fail)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -999
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        run = ClientRun(code, self.log.read_text(errors="replace"))
        assert code != -999, f"client timed out after {timeout:.0f} s: {run}"
        return run


def run_client(
    url: str,
    steps: list[dict[str, Any]],
    log: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    python: str | None = None,
) -> ClientRun:
    """Run ``steps`` in one client session (tests/connect_job.py, in the working directory
    ``cwd``, with the interpreter ``python``: this one by default); wait for the client."""
    return Client(url, steps, log, env, cwd, python).finish(timeout)


class ConnectJob(Job):
    """One pipeline written through a Spark Connect client (tests/connect_job.py), with the
    crash harness's paths, readers and kill helpers (:class:`harness.Job`).

    ``mode``: ``batch`` or ``stream``; ``front``: ``run`` (``eosink.run``) or ``format``
    (``format("eosink")``); ``extra``: ``sink`` (file, iceberg, kafka), ``partition_by``,
    ``catalog_uri``, ``catalog_json`` as in tests/crashjob.py. ``step`` entries override the
    client step the job builds (``trigger``, ``end``, ``epoch``...). Runs through
    ``Job.run``: ``fault`` arms a point in the *client* (see the module docstring), the
    kill arguments kill the client.
    """

    def __init__(
        self,
        server: ConnectServer,
        tmp: Path,
        mode: str,
        metastore: str,
        front: str = "run",
        sink_options: dict[str, Any] | None = None,
        step: dict[str, Any] | None = None,
        **extra: str,
    ) -> None:
        assert mode in ("batch", "stream") and front in ("run", "format")
        super().__init__(tmp, mode, metastore, sink_options, **extra)
        self.server = server
        self.front = front
        self.step_overrides = dict(step or {})

    @property
    def coverage_front(self) -> str:
        """``connect-run-stream``, ``connect-format-batch``...: the fault coverage table's
        front end (over Spark Connect)."""
        return f"connect-{self.front}-{self.mode}"

    def sink_opts(self) -> dict[str, Any]:
        """The sink's options as tests/crashjob.py builds them."""
        sink = self.extra.get("sink", "file")
        opts: dict[str, Any] = {}
        if sink == "file":
            opts.update(path=str(self.out), format=self.extra.get("format", "parquet"))
        elif sink == "iceberg":
            opts.update(self.iceberg_raw_options())
        if self.extra.get("partition_by"):
            opts["partition_by"] = self.extra["partition_by"].split(",")
        opts.update(self.sink_options)
        return opts

    def step(self, **overrides: Any) -> dict[str, Any]:
        """This job as one step of tests/connect_job.py."""
        s: dict[str, Any] = {
            "front": self.front,
            "mode": self.mode,
            "sink": self.extra.get("sink", "file"),
            "options": self.sink_opts(),
            "input": str(self.input),
        }
        if self.metastore != "default":
            s["metastore_url"] = self.metastore
        if self.mode == "batch":
            s["epoch"] = 5
        else:
            s["checkpoint_location"] = str(self.checkpoint)
            s["trigger"] = {"availableNow": True}
            s["end"] = "await"
        s.update(self.step_overrides)
        s.update(overrides)
        return s

    def argv(self) -> list[str]:
        return client_command(self.server.url, [self.step()])

    def _env(self, fault: str | None) -> dict[str, str]:
        self.marks = self.tmp / f"faults-{len(self.logs)}"
        self.marks.mkdir(exist_ok=True)
        return client_env(fault, self.marks)

    def start(self) -> subprocess.Popen[bytes]:
        """Start the client in the background (its own session; log ``run-<n>.log``);
        :meth:`reap` ends it."""
        log = open(self.tmp / f"run-{len(self.logs)}.log", "w")
        try:
            proc = subprocess.Popen(
                self.argv(),
                env=self._env(None),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        proc.log = Path(log.name)  # type: ignore[attr-defined]
        return proc

    def wait_started(self, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
        """Return once the client started its stream (its ``STARTED`` line): over Spark
        Connect, an ``eosink.run`` stream's start returns once the server's foreachBatch
        worker is up. Tests start the next client only then: a worker has 10 s to start
        (see tests/connect_job.py), better not spent competing with another one."""
        log: Path = proc.log  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        while "\nSTARTED " not in "\n" + log.read_text(errors="replace"):
            assert proc.poll() is None, f"the client ended ({proc.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no stream started in {timeout:.0f} s"
            time.sleep(0.1)

    def wait_in_protocol(self, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
        """Return once the client's stream persisted its first PENDING epoch."""
        self._wait_for_protocol(proc, timeout)
        assert self.saw_pending, f"no PENDING epoch (client: {proc.poll()})\n{proc.log.read_text()}"  # type: ignore[attr-defined]

    def reap(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGKILL the client started by :meth:`start` (if it still runs), keep its log;
        returns its exit code (-9: killed)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        self.logs.append(proc.log.read_text(errors="replace"))  # type: ignore[attr-defined]
        return code

    def client(self) -> ClientRun:
        """The last run's client output, parsed."""
        return ClientRun(0, self.logs[-1] if self.logs else "")
