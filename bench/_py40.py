"""The pyspark 4.0 environment for the row against Spark's own Iceberg streaming sink.

Iceberg publishes its Spark runtime for the Spark versions it supports, which the project's
pyspark is not; that row runs both of its sides in a separate virtual environment with
pyspark 4.0 (eosink installed from this checkout, editable; pyarrow, pyiceberg at the main
environment's versions) and the ``iceberg-spark-runtime-4.0_2.13`` jar from Maven Central,
its sha1 checked. Both are cached under ``~/.cache/eosink-bench/`` (``EOSINK_BENCH_CACHE``),
rebuilt only when what they are made of changes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PYSPARK = "4.0.5"
ICEBERG = "1.11.0"
ICEBERG_ARTIFACT = "iceberg-spark-runtime-4.0_2.13"
ICEBERG_SHA1 = "70df6b99e6c07627805db0b5e5e58000a22e716e"  # Maven Central's, for 1.11.0
MAVEN = "https://repo1.maven.org/maven2"


def cache_root() -> Path:
    root = os.environ.get("EOSINK_BENCH_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "eosink-bench"


def _requirements() -> list[str]:
    """pyspark 4.0 with the main environment's pyarrow and pyiceberg (same writers)."""
    reqs = [f"pyspark=={PYSPARK}"]
    for dist, spec in (
        ("pyarrow", "pyarrow"),
        ("pyiceberg", "pyiceberg[sql-sqlite]"),
        ("pyiceberg-core", "pyiceberg-core"),
        ("pandas", "pandas"),
    ):
        try:
            reqs.append(f"{spec}=={md.version(dist)}")
        except md.PackageNotFoundError:
            reqs.append(spec)
    return reqs


def jar(log: Callable[[str], None]) -> Path:
    """The Iceberg Spark runtime jar, downloaded once, sha1 checked."""
    name = f"{ICEBERG_ARTIFACT}-{ICEBERG}.jar"
    dst = cache_root() / "jars" / name
    if dst.exists() and hashlib.sha1(dst.read_bytes()).hexdigest() == ICEBERG_SHA1:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    url = f"{MAVEN}/org/apache/iceberg/{ICEBERG_ARTIFACT}/{ICEBERG}/{name}"
    log(f"  downloading {url}")
    part = dst.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=300) as r, open(part, "wb") as fh:
        shutil.copyfileobj(r, fh, 1 << 20)
    got = hashlib.sha1(part.read_bytes()).hexdigest()
    if got != ICEBERG_SHA1:
        part.unlink()
        raise RuntimeError(f"{name}: sha1 {got}, expected {ICEBERG_SHA1}")
    part.replace(dst)
    return dst


def venv(log: Callable[[str], None]) -> Path:
    """The environment's Python: a ``uv venv`` with pyspark 4.0 and eosink (editable)."""
    uv = shutil.which("uv") or os.environ.get("UV")  # `uv run` names itself in UV
    if uv is None:
        raise RuntimeError("`uv` is not on the PATH (it builds the pyspark 4.0 environment)")
    reqs = _requirements()
    # eosink's own dependencies come from its pyproject.toml: a change there rebuilds.
    pyproject = hashlib.sha1((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    spec = {
        "python": sys.version.split()[0],
        "reqs": reqs,
        "eosink": str(ROOT),
        "pyproject": pyproject,
    }
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    d = cache_root() / f"venv-pyspark{PYSPARK}-{key}"
    py = d / "bin" / "python"
    if (d / ".complete").exists() and py.exists():
        return py
    log(f"  building {d} ({', '.join(reqs)}, eosink from {ROOT})")
    for old in cache_root().glob("venv-pyspark*"):  # one environment at a time
        shutil.rmtree(old, ignore_errors=True)
    t0 = time.perf_counter()
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([uv, "venv", "-q", "--python", base, str(d)], check=True)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(py), *reqs, "-e", str(ROOT)],
        check=True,
    )
    (d / ".complete").write_text(json.dumps(spec, indent=1))
    log(f"  built in {time.perf_counter() - t0:.0f} s")
    return py


def child_env(py: Path) -> dict[str, str]:
    """The environment of a program run with the pyspark 4.0 environment's Python ``py``:
    this process's, without what would point it at the main environment's Spark."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_SUBMIT_ARGS")
    }
    env.update(PYSPARK_PYTHON=str(py), PYSPARK_DRIVER_PYTHON=str(py), PYTHONUNBUFFERED="1")
    return env


def run_iceberg_runtime(
    data_dir: Path, reps: int, files_per_trigger: int, tmp: Path, timeout: float, log: Any
) -> dict[str, Any]:
    """Run ``bench/iceberg_runtime.py`` in the pyspark 4.0 environment; its JSON result
    (``{"error": ...}`` when the environment could not be built or the run failed)."""
    try:
        py = venv(log)
        runtime_jar = jar(log)
    except Exception as exc:
        return {"error": f"building the pyspark {PYSPARK} environment failed: {exc}"}
    out = tmp / "iceberg-runtime.json"
    logfile = tmp / "iceberg-runtime.log"
    env = child_env(py)
    cmd = [
        str(py),
        "-m",
        "bench.iceberg_runtime",
        "--data",
        str(data_dir),
        "--reps",
        str(reps),
        "--files-per-trigger",
        str(files_per_trigger),
        "--jar",
        str(runtime_jar),
        "--tmp",
        str(tmp / "py40"),
        "--out",
        str(out),
    ]
    with open(logfile, "w") as lf:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=lf, text=True
        )
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # the child's progress lines
                log(line.rstrip())
            rc = proc.wait()
        finally:
            watchdog.cancel()
    if out.exists():
        return json.loads(out.read_text())  # type: ignore[no-any-return]
    if rc == -9:
        return {"error": f"the pyspark {PYSPARK} run took longer than {timeout:.0f} s"}
    tail = logfile.read_text().strip().splitlines()[-15:]
    return {"error": f"the pyspark {PYSPARK} run exited {rc}: " + " | ".join(tail)}
