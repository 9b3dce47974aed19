"""A real Spark standalone cluster on 127.0.0.1 and a packed Python environment for it.

``env_archive()`` builds the environment executors run in, the way users ship one to
YARN, Kubernetes or a standalone cluster: a relocatable virtualenv made by uv from the
project's lock (``uv export --frozen``: the same pinned pyarrow, pandas, pyiceberg...), with
eosink itself installed from this checkout, packed as ``env.tar.gz``. Spark ships it with
``--archives env.tar.gz#env`` and executors run ``./env/bin/python``. pyspark is *not* in it:
executors' Python workers import pyspark and py4j from Spark's own ``python/lib/*.zip`` on
the worker (Spark puts them on the workers' ``PYTHONPATH``), which saves 480 MB. The
archive is cached under ``~/.cache/eosink/pyenv/`` (``EOSINK_JAR_CACHE``'s parent, like the
other caches of ``tests/jvm.py``), keyed by a digest of ``uv.lock``, ``pyproject.toml``,
the eosink sources, this file, the Python version and the extras: built once per machine
and checkout state (PyPI must be reachable; 33 s with an empty uv cache on the loaded
2-core machine: 17 s to download and install, 10 s to pack 400 MB into 140 MB).

Like any virtualenv (and venv-pack's archives), ``env/bin/python`` is a link to the base
interpreter, which must exist at the same path on every node: here it is the Python running
the tests.

``StandaloneCluster`` starts a master and two workers as separate JVMs with
``spark-class org.apache.spark.deploy.{master.Master,worker.Worker}`` from the pyspark
package, in the foreground, each in its own process group, loopback only, on ports the JVMs
pick themselves (read back from their logs), with their own log, local and temp
directories and an environment stripped of the tests' virtualenv. The workers' work
directories (where executors run and unpack the archive) are in ``/dev/shm`` when it has
room, on disk otherwise.

``shared_cluster()`` gives one cluster to every pytest-xdist worker of a run: the first that
needs it starts it, each user registers its pid, the last one to leave stops it, and a
watchdog process stops it when no registered user is alive any more (a pytest killed hard
leaves nothing behind). ``cluster_app()`` lets one Spark application at a time use it (each
takes every core).

``SubmittedJob`` runs ``tests/standalone_job.py`` with ``spark-submit --deploy-mode
client`` against the cluster, each run on "its own machine" (new ``HOME``, ``TMPDIR``,
JVM temp and local directories and working directory; only the input, the checkpoint
location and the target are shared), and kills the whole driver process group with SIGKILL
as soon as an armed fault point fired.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
ENV_EXTRAS = ("file", "iceberg")
# What the executors' Python must not see: this virtualenv (the tests' and the driver's).
TEST_VENV = Path(sys.prefix).resolve()
FAST_JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


class ClusterError(RuntimeError):
    """The cluster or the packed environment could not be set up (the message says why)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _cache_dir() -> Path:
    root = os.environ.get("EOSINK_JAR_CACHE")
    base = Path(root).parent if root else Path.home() / ".cache" / "eosink"
    return base / "pyenv"


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes (xdist workers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------
# The packed environment
# ---------------------------------------------------------------------------------------


def _source_files() -> list[Path]:
    files = [ROOT / "uv.lock", ROOT / "pyproject.toml", Path(__file__)]  # this: how
    for top in ("eosink", "plugins", "alembic"):
        files += [
            p
            for p in (ROOT / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    return sorted(files)


def env_key(extras: tuple[str, ...] = ENV_EXTRAS) -> str:
    """Digest of what the packed environment is made of."""
    h = hashlib.sha256()
    h.update(f"{sys.version_info[:3]} {sys.platform} {','.join(extras)}\n".encode())
    for p in _source_files():
        h.update(p.relative_to(ROOT).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _uv() -> str:
    # `uv run` names its own binary in $UV; else the uv on the PATH (README: pip install uv).
    uv = os.environ.get("UV") or shutil.which("uv")
    if not uv:
        raise ClusterError("uv is needed to build the executors' environment (pip install uv)")
    return uv


def _run(cmd: list[str], what: str, **kw: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if proc.returncode != 0:
        raise ClusterError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{(proc.stdout + proc.stderr)[-4000:]}"
        )


def build_env_archive(target: Path, extras: tuple[str, ...] = ENV_EXTRAS) -> dict[str, float]:
    """Build the packed environment into ``target`` (a ``.tar.gz``); returns timings (s)."""
    times: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="eosink-env-", dir=target.parent))
    try:
        t = time.monotonic()
        uv = _uv()
        req = work / "requirements.txt"
        export = [uv, "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes"]
        for extra in extras:
            export += ["--extra", extra]
        # pyspark and py4j come from Spark's python/lib on the workers (see the docstring).
        export += ["--no-emit-package", "pyspark", "--no-emit-package", "py4j", "-o", str(req)]
        _run(export, "uv export", cwd=ROOT)
        env = work / "env"
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run([uv, "venv", "--relocatable", "--python", base, str(env)], "uv venv")
        py = str(env / "bin" / "python")
        _run(
            [uv, "pip", "install", "--python", py, "-r", str(req)],
            "uv pip install (locked dependencies)",
        )
        # A wheel built now: uv's cache would reuse an older build of a directory whose
        # pyproject.toml did not change.
        _run([uv, "build", "--wheel", "--out-dir", str(work / "dist"), str(ROOT)], "uv build")
        (wheel,) = (work / "dist").glob("eosink-*.whl")
        _run(
            [uv, "pip", "install", "--python", py, "--no-deps", str(wheel)],
            "uv pip install (eosink from this checkout)",
        )
        times["install"] = time.monotonic() - t
        site = next((env / "lib").glob("python*/site-packages"))
        for src in [ROOT / "eosink", *sorted((ROOT / "plugins").glob("eosink_*"))]:
            for f in src.rglob("*.py"):
                got = site / src.name / f.relative_to(src)
                if not got.exists() or got.read_bytes() != f.read_bytes():
                    raise ClusterError(f"the packed environment's {got} is not {f}")
        # The environment must import what executors need, on its own (no PYTHONPATH).
        check = (
            "import sys, eosink, eosink_file, eosink_iceberg, pyarrow, pandas, pyiceberg; "
            "assert sys.prefix != sys.base_prefix"
        )
        _run([py, "-I", "-c", check], "importing eosink in the packed environment")
        t = time.monotonic()
        partial = work / "env.tar.gz"
        with tarfile.open(partial, "w:gz", compresslevel=1) as tf:
            for entry in sorted(env.iterdir()):
                tf.add(entry, arcname=entry.name)
        os.replace(partial, target)
        times["pack"] = time.monotonic() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return times


def env_archive(extras: tuple[str, ...] = ENV_EXTRAS) -> Path:
    """The packed environment of this checkout, built once and cached (see the module doc).

    Older archives of the cache are deleted when a new one is built (two are kept).
    """
    cache = _cache_dir()
    target = (
        cache / f"eosink-env-py{sys.version_info[0]}{sys.version_info[1]}-{env_key(extras)}.tar.gz"
    )
    if target.exists():
        return target
    with _flock(cache / ".build.lock"):
        if not target.exists():
            cache.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            times = build_env_archive(target, extras)
            mb = target.stat().st_size / 1e6
            (cache / f"{target.name}.build.json").write_text(
                json.dumps({**times, "total": time.monotonic() - started, "mb": mb})
            )
            others = sorted(cache.glob("eosink-env-*.tar.gz"), key=lambda p: p.stat().st_mtime)
            for old in [p for p in others if p != target][:-1]:
                old.unlink(missing_ok=True)
                Path(f"{old}.build.json").unlink(missing_ok=True)
    return target


# ---------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the tests' virtualenv or eosink's settings: what
    a machine of the cluster would have (Java, a PATH), plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_", "EOSINK_", "UV_", "PYTHON", "SPARK_", "PYTEST_"))
        and k
        not in (
            "VIRTUAL_ENV",
            "CONDA_PREFIX",
            "UV",
            "LOG4J_CONFIGURATION_FILE",
            "JDK_JAVA_OPTIONS",
            "_JAVA_OPTIONS",
            "JAVA_TOOL_OPTIONS",
        )
    }
    venv_bin = str(TEST_VENV / "bin")
    env["PATH"] = os.pathsep.join(
        d
        for d in env.get("PATH", "").split(os.pathsep)
        if d and Path(d).resolve() != Path(venv_bin)
    )
    from eosink._session import find_java

    env["JAVA_HOME"] = find_java()
    env.update(extra)
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped by its parent) is not alive.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _owned(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live process whose command line holds ``marker`` (ours, not a
    later process that reused its pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker.encode() in fh.read()
    except OSError:
        return False


def _kill_group(pgid: int, marker: str) -> None:
    """SIGKILL the process group ``pgid`` that one of our daemons leads (checked)."""
    if not _owned(pgid, marker):
        # The leader is gone; its group may live on (executors): kill what carries the marker.
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if os.getpgid(int(proc.name)) == pgid and _owned(int(proc.name), marker):
                        break
                except OSError:
                    continue
        else:
            return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGKILL when the process that started it dies (Linux
    ``PR_SET_PDEATHSIG``), so a driver never outlives a pytest killed hard."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def kill_processes_in(directory: Path) -> list[int]:
    """SIGKILL every process whose working directory is under ``directory`` (a directory
    of ours: executors run in their worker's ``<work>/<app>/<id>``, Python workers inherit
    it, drivers run in their machine's ``cwd``). Python daemons leave their parent's
    process group (``setpgid``), so killing the groups alone could leave them running."""
    killed = []
    root = directory.resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def memory_dir(need_gib: float = 4) -> Path | None:
    """A new directory in ``/dev/shm`` when it is a tmpfs with ``need_gib`` GiB free, else
    None. Executors unpack the 400 MB environment into their work directory at every
    application start: on the CI machine's disk that takes 15 s, in memory 6 s."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < need_gib * 2**30 or not os.access(shm, os.W_OK):
        return None
    return Path(tempfile.mkdtemp(prefix="eosink-cluster-", dir=shm))


def worker_host(i: int) -> str:
    """Worker ``i``'s address: a loopback address of its own (127.0.0.2, 127.0.0.3...), so
    that Spark sees two hosts, as on a real cluster (it never runs a speculative copy of a
    task on a host where the task runs already)."""
    return f"127.0.0.{2 + i}"


class StandaloneCluster:
    """A Spark standalone master on 127.0.0.1 and ``workers`` workers, each on a loopback
    address of its own (:func:`worker_host`; see the module doc).

    ``master_url`` is ``spark://127.0.0.1:<port>``, ``web_url`` the master's web UI. Every
    process carries ``-Deosink.cluster=<root>`` on its command line, so :meth:`stop` kills
    only processes of this cluster (executors included: they live in their worker's
    process group).
    """

    def __init__(
        self,
        root: Path,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        work: Path | None = None,
    ) -> None:
        self.root = root
        # The workers' work directories, where executors run and unpack the archives.
        self.work = work or root / "work"
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.master_url = ""
        self.web_url = ""
        self.pgids: list[int] = []
        self.logs: list[Path] = []
        self.started_in = 0.0

    @property
    def marker(self) -> str:
        return f"-Deosink.cluster={self.root}"

    def state(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "work": str(self.work),
            "master_url": self.master_url,
            "web_url": self.web_url,
            "pgids": self.pgids,
            "logs": [str(p) for p in self.logs],
            "workers": self.workers,
            "started_in": self.started_in,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> StandaloneCluster:
        c = cls(Path(state["root"]), workers=int(state["workers"]), work=Path(state["work"]))
        c.master_url, c.web_url = state["master_url"], state["web_url"]
        c.pgids = [int(p) for p in state["pgids"]]
        c.logs = [Path(p) for p in state["logs"]]
        c.started_in = float(state["started_in"])
        return c

    def _env(self, name: str, host: str = "127.0.0.1") -> dict[str, str]:
        d = self.root / name
        for sub in ("logs", "tmp", "local", "home"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        conf = self.root / "conf"
        conf.mkdir(exist_ok=True)
        return clean_env(
            HOME=str(d / "home"),
            TMPDIR=str(d / "tmp"),
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP=host,
            SPARK_LOCAL_HOSTNAME=host,
            SPARK_LOG_DIR=str(d / "logs"),
            SPARK_PID_DIR=str(d / "tmp"),
            SPARK_LOCAL_DIRS=str(d / "local"),
            SPARK_WORKER_DIR=str(self.work / name),
            SPARK_WORKER_CORES=str(self.cores),
            SPARK_WORKER_MEMORY=self.memory,
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=" ".join(
                [
                    self.marker,
                    f"-Djava.io.tmpdir={d / 'tmp'}",
                    # No REST submission server (it would take the fixed port 6066).
                    "-Dspark.master.rest.enabled=false",
                    *FAST_JVM_FLAGS,
                ]
            ),
        )

    def _start(
        self, name: str, cls: str, *args: str, host: str = "127.0.0.1"
    ) -> subprocess.Popen[bytes]:
        log = self.root / name / "logs" / f"{name}.log"
        env = self._env(name, host)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), cls, *args],
                env=env,
                cwd=self.root / name,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pgids.append(proc.pid)
        self.logs.append(log)
        return proc

    def _wait_log(
        self, proc: subprocess.Popen[bytes], log: Path, pattern: str, deadline: float
    ) -> re.Match[str]:
        while time.monotonic() < deadline:
            m = re.search(pattern, log.read_text(errors="replace"))
            if m:
                return m
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        state = f"exited with {proc.returncode}" if proc.poll() is not None else "is running"
        raise ClusterError(
            f"{log.stem} {state} and did not log {pattern!r} in time; its log {log}:\n"
            f"{log.read_text(errors='replace')[-4000:]}"
        )

    def start(self, timeout: float = 120) -> None:
        """Start the master, then the workers; return once every worker is ALIVE.

        Raises:
            ClusterError: a JVM exited or the cluster was not up in ``timeout`` s.
        """
        started = time.monotonic()
        deadline = started + timeout
        self.root.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            master = self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            )
            log = self.logs[-1]
            m = self._wait_log(master, log, r"Starting Spark master at (spark://\S+)", deadline)
            self.master_url = m.group(1)
            m = self._wait_log(master, log, r"MasterWebUI.*started at (http://\S+)", deadline)
            self.web_url = m.group(1)
            procs = [
                self._start(
                    f"worker{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    worker_host(i),
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.work / f"worker{i}"),
                    host=worker_host(i),
                )
                for i in range(self.workers)
            ]
            while True:
                alive = self.alive_workers()
                if alive >= self.workers:
                    break
                for p, wlog in zip([master, *procs], self.logs, strict=True):
                    if p.poll() is not None:
                        raise ClusterError(
                            f"{wlog.stem} exited with {p.returncode} while the cluster "
                            f"started; its log {wlog}:\n{wlog.read_text(errors='replace')[-4000:]}"
                        )
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{alive} of {self.workers} workers registered with {self.master_url} "
                        f"in {timeout:.0f} s; logs: {', '.join(map(str, self.logs))}"
                    )
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - started

    def status(self) -> dict[str, Any]:
        """The master's status (its web UI's ``/json``)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as r:
            return dict(json.load(r))

    def alive_workers(self) -> int:
        try:
            st = self.status()
        except OSError:
            return 0
        return sum(1 for w in st.get("workers", []) if w.get("state") == "ALIVE")

    def alive(self) -> bool:
        return all(_owned(p, self.marker) for p in self.pgids) and (
            self.alive_workers() >= self.workers
        )

    def stop(self) -> None:
        """SIGKILL every process of the cluster (daemons, executors, their Python workers)."""
        for pgid in self.pgids:
            _kill_group(pgid, self.marker)
        deadline = time.monotonic() + 10
        while any(_owned(p, self.marker) for p in self.pgids) and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_processes_in(self.root)
        kill_processes_in(self.work)
        self.pgids = []
        if self.work.is_relative_to(self.root):
            self.drop_unpacked(timeout=0)
        else:  # in memory: the executors' logs go with it
            shutil.rmtree(self.work, ignore_errors=True)

    def drop_unpacked(self, timeout: float = 30) -> None:
        """Once no application runs, delete the environments executors unpacked (400 MB
        each) from the workers' directories; their logs stay."""
        deadline = time.monotonic() + timeout
        while timeout and time.monotonic() < deadline:
            try:
                if not self.status().get("activeapps"):
                    break
            except OSError:
                break
            time.sleep(0.2)
        for env in self.work.glob("worker*/app-*/*/env"):
            shutil.rmtree(env, ignore_errors=True)

    def executor_logs(self) -> str:
        """Every executor's stderr (``<work>/worker<i>/<app>/<id>/stderr``), for messages."""
        out = []
        for p in sorted(self.work.glob("worker*/*/*/stderr")):
            out.append(f"== {p}\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)


_WATCHDOG = r"""
import fcntl, json, os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from standalone import StandaloneCluster, _alive
state_file, lock_file = Path(sys.argv[2]), Path(sys.argv[3])
while True:
    time.sleep(1)
    with open(lock_file, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            sys.exit(0)  # stopped by its users
        if state.get("watchdog") != os.getpid():
            sys.exit(0)
        if not any(_alive(p) for p in state["users"]):
            StandaloneCluster.from_state(state).stop()
            state_file.unlink()
            sys.exit(0)
"""


@contextlib.contextmanager
def shared_cluster(shared_dir: Path, timeout: float = 120) -> Iterator[StandaloneCluster]:
    """The cluster of this pytest run, shared by its xdist workers (see the module doc).

    ``shared_dir``: a directory every worker of the run sees (the parent of the workers'
    base temp directories under xdist).
    """
    lock = shared_dir / "standalone-cluster.lock"
    state_file = shared_dir / "standalone-cluster.json"
    me = os.getpid()
    with _flock(lock):
        state: dict[str, Any] | None = None
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(state_file.read_text())
        cluster = StandaloneCluster.from_state(state) if state else None
        if cluster is None or not cluster.alive():
            if cluster is not None:
                cluster.stop()
            root = Path(tempfile.mkdtemp(prefix="cluster-", dir=shared_dir))
            cluster = StandaloneCluster(root, work=memory_dir())
            cluster.start(timeout=timeout)
            state = {**cluster.state(), "users": []}
            with open(root / "watchdog.log", "wb") as wlog:
                watchdog = subprocess.Popen(
                    [sys.executable, "-c", _WATCHDOG, str(TESTS), str(state_file), str(lock)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=wlog,
                    start_new_session=True,
                )
            state["watchdog"] = watchdog.pid
        assert state is not None
        state["users"] = [p for p in state["users"] if _alive(p)] + [me]
        state_file.write_text(json.dumps(state))
    try:
        yield cluster
    finally:
        with _flock(lock):
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):
                state = None
            if state is not None and state["root"] == str(cluster.root):
                users = [p for p in state["users"] if p != me and _alive(p)]
                if users:
                    state_file.write_text(json.dumps({**state, "users": users}))
                else:
                    cluster.stop()
                    state_file.unlink()
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(state["watchdog"]), signal.SIGKILL)
            else:
                cluster.stop()


@contextlib.contextmanager
def cluster_app(shared_dir: Path) -> Iterator[None]:
    """One Spark application at a time on the shared cluster (each takes every core)."""
    with _flock(shared_dir / "standalone-app.lock"):
        yield


# ---------------------------------------------------------------------------------------
# Driver programs submitted to the cluster
# ---------------------------------------------------------------------------------------


class SubmittedJob:
    """``tests/standalone_job.py`` submitted to a cluster, run by run (see the module doc).

    ``tmp/input`` (parquet files), ``tmp/out`` (the target) and ``tmp/checkpoint`` are
    shared by every run; each run gets ``tmp/<machine>/`` with its own ``home``, ``tmp``
    and working directory ``cwd``.
    """

    def __init__(
        self, tmp: Path, cluster: StandaloneCluster, archive: Path, sink: str, **extra: str
    ) -> None:
        self.tmp = tmp
        self.cluster = cluster
        self.archive = archive
        self.sink = sink
        self.extra = extra
        self.input = tmp / "input"
        self.out = tmp / "out"
        self.checkpoint = tmp / "checkpoint"
        self.logs: list[str] = []
        self.marks = tmp / "faults"

    def command(self, machine: Path, probe: bool = False) -> list[str]:
        # (Not tests/jvm.py's CDS archive: this driver's class path holds its machine's
        # conf directory, so the archive never matches.)
        java_opts = [f"-Djava.io.tmpdir={machine / 'tmp'}", *FAST_JVM_FLAGS]
        conf = {
            "spark.pyspark.python": "./env/bin/python",
            "spark.executorEnv.PYSPARK_PYTHON": "./env/bin/python",
            "spark.pyspark.driver.python": sys.executable,
            "spark.driver.memory": "768m",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.extraJavaOptions": " ".join(java_opts),
            "spark.local.dir": str(machine / "tmp"),
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.cluster.workers),
            # Executors' temp files (the fetched archive...) in the cluster's directory.
            "spark.executor.extraJavaOptions": " ".join(
                [f"-Djava.io.tmpdir={self.cluster.root / 'tmp'}", *FAST_JVM_FLAGS]
            ),
            # The first job waits for both executors (60 s at most).
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
            "spark.ui.enabled": "false",
            # A cluster's own settings: eosink.spark_session() leaves them alone there.
            "spark.sql.shuffle.partitions": "2",
        }
        cmd = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            self.cluster.master_url,
            "--deploy-mode",
            "client",
            "--name",
            f"eosink-standalone-{self.sink}",
            "--archives",
            f"{self.archive}#env",
        ]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd += [
            str(TESTS / "standalone_job.py"),
            "--sink",
            self.sink,
            "--input",
            str(self.input),
            "--out",
            str(self.out),
            "--checkpoint",
            str(self.checkpoint),
        ]
        for k, v in self.extra.items():
            cmd += [f"--{k.replace('_', '-')}", v]
        if probe:
            cmd.append("--probe")
        return cmd

    def run(
        self, machine: str, fault: str | None = None, probe: bool = False, timeout: float = 300
    ) -> int:
        """Run the driver on ``machine`` (a fresh name: a fresh machine); return its exit
        code, -9 when it was killed. With ``fault`` armed, the driver's whole process group
        (the spark-submit JVM and the Python driver program) is killed with SIGKILL as soon
        as the fault point fired (the point itself kills the Python process)."""
        home = self.tmp / machine
        for sub in ("home", "tmp", "cwd", "conf"):
            (home / sub).mkdir(parents=True)
        # Spark's own log lines at WARN (the driver's JVM reads this machine's conf dir).
        (home / "conf" / "log4j2.properties").write_text(
            "rootLogger.level = warn\nrootLogger.appenderRef.stderr.ref = console\n"
            "appender.console.type = Console\nappender.console.name = console\n"
            "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex\n"
        )
        if self.marks.exists():
            shutil.rmtree(self.marks)
        self.marks.mkdir()
        env = clean_env(
            HOME=str(home / "home"),
            TMPDIR=str(home / "tmp"),
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(home / "conf"),
            SPARK_LOCAL_IP="127.0.0.1",
            EOSINK_FAULT_MARK=str(self.marks),
        )
        if fault:
            env["EOSINK_FAULT"] = fault
        log = self.tmp / f"{machine}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                self.command(home, probe),
                env=env,
                cwd=home / "cwd",
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            try:
                deadline = time.monotonic() + timeout
                while proc.poll() is None:
                    if any(self.marks.iterdir()):
                        # The fault point killed the Python driver: the driver dies whole,
                        # as on a lost machine (not through the JVM's orderly shutdown).
                        os.killpg(proc.pid, signal.SIGKILL)
                        break
                    if time.monotonic() > deadline:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        self.logs.append(log.read_text(errors="replace"))
                        raise AssertionError(
                            f"driver timed out after {timeout:.0f} s; log {log}:\n"
                            f"{self.last_log()}\n{self.cluster.executor_logs()}"
                        )
                    time.sleep(0.02)
                code = proc.wait()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                kill_processes_in(home)
        self.logs.append(log.read_text(errors="replace"))
        return code

    def fired(self) -> list[str]:
        """The fault points that killed the driver during the last run."""
        return sorted(p.name.split(".")[0] for p in self.marks.iterdir())

    def last_log(self) -> str:
        return self.logs[-1][-8000:] if self.logs else ""

    def executor_python(self) -> list[dict[str, Any]]:
        """What the last run's executors reported about their Python (``EXECUTOR_PYTHON``)."""
        return [json.loads(m) for m in re.findall(r"^EXECUTOR_PYTHON (.*)$", self.logs[-1], re.M)]

    def iceberg_options(self) -> Any:
        import eosink

        return eosink.get_sink("iceberg").parse_options(
            {"table": "db.events", "warehouse": str(self.out)}
        )
