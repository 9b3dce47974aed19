"""The pyspark 4.0 environment for the row against Spark's own Iceberg streaming sink.

Iceberg publishes its Spark runtime for the Spark versions it supports, which the project's
pyspark is not; that row runs both of its sides in a separate virtual environment with
pyspark 4.0 (``bench/_pylines.py``: eosink installed from this checkout, editable, every
other package at the main environment's version) and the ``iceberg-spark-runtime-4.0_2.13``
jar from Maven Central, its sha1 checked. Both are cached under ``~/.cache/eosink-bench/``
(``EOSINK_BENCH_CACHE``), rebuilt only when what they are made of changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _pylines

ROOT = Path(__file__).resolve().parents[1]

PYSPARK = "4.0.5"
ICEBERG = "1.11.0"
ICEBERG_ARTIFACT = "iceberg-spark-runtime-4.0_2.13"
ICEBERG_SHA1 = "70df6b99e6c07627805db0b5e5e58000a22e716e"  # Maven Central's, for 1.11.0
MAVEN = "https://repo1.maven.org/maven2"


def cache_root() -> Path:
    return _pylines.cache_root()


def jar(log: Callable[[str], None]) -> Path:
    """The Iceberg Spark runtime jar, downloaded once, sha1 checked."""
    name = f"{ICEBERG_ARTIFACT}-{ICEBERG}.jar"
    url = f"{MAVEN}/org/apache/iceberg/{ICEBERG_ARTIFACT}/{ICEBERG}/{name}"
    return _download(url, name, ICEBERG_SHA1, log)


DELTA = "4.4.0"
DELTA_JARS = {
    # Delta Lake's Spark connector built for Spark 4.0, and its storage layer; Maven
    # Central's sha1s. The reference reader (and writer) of the delta sink's tests and bench.
    "delta-spark_4.0_2.13": "853edc8e1c2a415a2cbde4abfb3ebed8e85fa40e",
    "delta-storage": "a068e489ce20d7f79bc4ca2d3392f12adbb69ddd",
}


def delta_jars(log: Callable[[str], None]) -> list[Path]:
    """Delta Lake's Spark jars for the pyspark 4.0 environment, downloaded once, sha1 checked."""
    out = []
    for artifact, sha1 in DELTA_JARS.items():
        name = f"{artifact}-{DELTA}.jar"
        out.append(_download(f"{MAVEN}/io/delta/{artifact}/{DELTA}/{name}", name, sha1, log))
    return out


def _download(url: str, name: str, sha1: str, log: Callable[[str], None]) -> Path:
    """``url`` into the jar cache as ``name`` (once; its sha1 checked)."""
    dst = cache_root() / "jars" / name
    if dst.exists() and hashlib.sha1(dst.read_bytes()).hexdigest() == sha1:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    log(f"  downloading {url}")
    part = dst.with_suffix(f".part{os.getpid()}")
    with urllib.request.urlopen(url, timeout=300) as r, open(part, "wb") as fh:
        shutil.copyfileobj(r, fh, 1 << 20)
    got = hashlib.sha1(part.read_bytes()).hexdigest()
    if got != sha1:
        part.unlink()
        raise RuntimeError(f"{name}: sha1 {got}, expected {sha1}")
    part.replace(dst)
    return dst


def venv(log: Callable[[str], None]) -> Path:
    """The environment's Python: pyspark 4.0 with eosink (editable) and pyiceberg, every other
    package at the main environment's version (``bench/_pylines.py``)."""
    return _pylines.venv(PYSPARK, log)


def child_env(py: Path) -> dict[str, str]:
    """The environment of a program run with the pyspark 4.0 environment's Python ``py``."""
    return _pylines.child_env(py)


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
