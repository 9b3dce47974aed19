"""A virtual environment per Spark line: pyspark at a given version, everything else as in
the main environment.

The benchmarks' pyspark 4.0 rows (``bench/_py40.py``) and the tests' compatibility profile
(``tests/test_spark_lines.py``: pyspark 3.5 and the oldest 4.x) run eosink, installed from
this checkout (editable), under another pyspark. Each environment is a ``uv venv`` whose other
packages are pinned to the main environment's versions (a constraints file of its
distributions), so that only Spark differs. They are cached under
``~/.cache/eosink-bench/`` (``EOSINK_BENCH_CACHE``) and rebuilt only when what they are made
of changes (the pyspark version, the main environment's packages, eosink's pyproject.toml).
Not when the checkout moves: a program run with :func:`child_env` imports eosink and the
built-in plugins from *this* checkout (``PYTHONPATH``), whichever checkout the environment's
editable install was made from (a CI run's fresh clone reuses the environment, ~60 s each).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What another pyspark brings its own version of, and this checkout's editable packages.
_NOT_PINNED = {"pyspark", "py4j", "eosink", "eosink-example"}


def cache_root() -> Path:
    root = os.environ.get("EOSINK_BENCH_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "eosink-bench"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# What a line's pyspark needs at another version than the main environment's (not pinned),
# and the bounds that hold instead: pyspark 3.5's Connect client (``pyspark[connect]``)
# requires numpy<2, and pyarrow 26 (the lock's) requires numpy>=2 (25 is the newest that
# imports with numpy 1.26).
_LINES: dict[str, tuple[set[str], list[str]]] = {"3.5.": ({"numpy", "pyarrow"}, ["pyarrow<26"])}


def _constraints(pyspark: str = "") -> list[str]:
    """``name==version`` of every distribution of the main environment but pyspark's own,
    this checkout's and those the ``pyspark`` line needs at another version (with that
    line's bounds instead)."""
    unpinned, bounds = set(_NOT_PINNED), []
    for prefix, (names, line_bounds) in _LINES.items():
        if pyspark.startswith(prefix):
            unpinned |= names
            bounds += line_bounds
    seen: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and _norm(name) not in unpinned:
            seen.setdefault(_norm(name), f"{name}=={dist.version}")
    return sorted([*seen.values(), *bounds])


EXTRAS = "s3,postgres,sql,iceberg,kafka,charts,connect,delta"
"""eosink's extras every line's environment has (the sinks, the meta stores, the bench's
charts, the Spark Connect client): one environment per version serves the benchmarks and
the tests alike."""


def venv(pyspark: str, log: Callable[[str], None], suite: bool = False) -> Path:
    """The Python of an environment with ``pyspark==<pyspark>``, eosink from this checkout
    (editable, with :data:`EXTRAS`), every other package at the main environment's version;
    built once, then cached. Safe to call from several processes at once (a lock file per
    version: pytest's workers).

    ``suite``: an environment that runs the whole test suite (``python -m tests.matrix``):
    every extra of eosink and the ``dev`` dependency group as well, each at the main
    environment's version; cached apart from the benchmarks' (``venv-suite-pyspark...``)."""
    import fcntl

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    kind = "venv-suite" if suite else "venv"
    with open(root / f".{kind}-pyspark{pyspark}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _venv(pyspark, log, suite)


def _suite_requirements() -> tuple[str, list[str]]:
    """Every extra of eosink's pyproject.toml, and the ``dev`` group's requirements (this
    checkout's path packages as editable installs), for :func:`venv`'s ``suite``."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = ",".join(sorted(project["project"]["optional-dependencies"]))
    sources = project.get("tool", {}).get("uv", {}).get("sources", {})
    reqs: list[str] = []
    for req in project["dependency-groups"]["dev"]:
        name = re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0]
        path = sources.get(name, {}).get("path")
        reqs += ["-e", str(ROOT / path)] if path else [req]
    return extras, reqs


def _venv(pyspark: str, log: Callable[[str], None], suite: bool = False) -> Path:
    uv = shutil.which("uv") or os.environ.get("UV")  # `uv run` names itself in UV
    if uv is None:
        raise RuntimeError(f"`uv` is not on the PATH (it builds the pyspark {pyspark} environment)")
    constraints = _constraints(pyspark)
    wanted = [f"pyspark=={pyspark}"]
    extras, dev = _suite_requirements() if suite else (EXTRAS, [])
    spec = {
        "python": sys.version.split()[0],
        "wanted": wanted,
        "extras": extras,
        "constraints": constraints,
        "pyproject": hashlib.sha1((ROOT / "pyproject.toml").read_bytes()).hexdigest(),
    }
    if suite:
        spec["dev"] = dev
    kind = "venv-suite" if suite else "venv"
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    d = cache_root() / f"{kind}-pyspark{pyspark}-{key}"
    py = d / "bin" / "python"
    if (d / ".complete").exists() and py.exists():
        return py
    log(f"  building {d} ({', '.join(wanted)}, eosink[{extras}] from {ROOT})")
    for old in cache_root().glob(f"{kind}-pyspark{pyspark}-*"):  # one per version
        shutil.rmtree(old, ignore_errors=True)
    t0 = time.perf_counter()
    d.parent.mkdir(parents=True, exist_ok=True)
    pins = d.parent / f".{d.name}.constraints.txt"
    pins.write_text("\n".join(constraints) + "\n")
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([uv, "venv", "-q", "--python", base, str(d)], check=True)
    install = [uv, "pip", "install", "-q", "--python", str(py), "-c", str(pins)]
    subprocess.run([*install, *wanted, "-e", f"{ROOT}[{extras}]", *dev], check=True)
    pins.unlink()
    (d / ".complete").write_text(json.dumps(spec, indent=1))
    log(f"  built in {time.perf_counter() - t0:.0f} s")
    return py


def child_env(py: Path) -> dict[str, str]:
    """The environment of a program run with another line's Python ``py``: this process's,
    without what would point it at the main environment's Spark, and with this checkout's
    eosink and plugins first on the path (the environment's editable install may be of
    another checkout; the entry points are the same, since the environment's key holds
    pyproject.toml). Spark's Python workers inherit it."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_SUBMIT_ARGS")
    }
    env.update(PYSPARK_PYTHON=str(py), PYSPARK_DRIVER_PYTHON=str(py), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = checkout_path()
    return env


def checkout_path() -> str:
    """``PYTHONPATH`` that puts this checkout's eosink and built-in plugins first, for a
    program run with another line's Python (its editable install may be of another
    checkout)."""
    return os.pathsep.join([str(ROOT), str(ROOT / "plugins")])
