"""The release matrix: the whole test suite on every supported Spark line, one after another.

``python -m tests.matrix`` (docs/testing.md, "The Spark-line matrix") runs the README's test
command (``pytest -n 2``) once per pyspark line of :data:`LINES`:

* the lock's pyspark in the main environment (what CI runs);
* every other line in an environment of its own, built and cached the way the benchmarks'
  and the compatibility profile's are (``bench/_pylines.py``, ``suite=True``): pyspark at
  that line, eosink from this checkout with every extra, the ``dev`` dependency group, every
  other package at the main environment's version, so that only Spark differs.

Each run's JUnit report and log go to ``--out`` (``matrix-<line>.xml``, ``.log``); at the end
it prints one Markdown row per line (passed, failed, errors, skipped, deselected, minutes)
for docs/testing.md's table, and exits 1 unless every line passed.

Spark 3.5 has no Python data sources: ``format("eosink")`` cannot run there (eosink refuses
it with a ``ConfigError``, which the compatibility profile tests). On 3.5 the modules that
import Spark 4's data source API are not collected (tests/conftest.py, ``SPARK4_MODULES``),
and a test of another module that fails because eosink refused its ``format("eosink")``
write with that ``ConfigError`` (the parametrized ``format`` cases) is reported as skipped,
``conftest.SPARK4_SKIP`` its reason: 3.5's row counts them in its "skipped" column, and
every other failure stays one.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _pylines  # noqa: E402

LINES = ("3.5.9", "4.0.5", "4.1.4", "4.2.1", "4.3.0")
"""The newest release of every supported Spark line on PyPI (November 2026)."""


@dataclass
class LineResult:
    line: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    deselected: int = 0
    seconds: float = 0.0
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.failed == 0 and self.errors == 0

    def row(self, commit: str) -> str:
        verdict = "passed" if self.ok else f"**failed** (exit {self.exit_code})"
        return (
            f"| {self.line} | {commit} | {self.passed} | {self.failed} | {self.errors} | "
            f"{self.skipped} | {self.deselected} | {self.seconds / 60:.1f} | {verdict} |"
        )


HEADER = (
    "| pyspark | commit | passed | failed | errors | skipped | deselected | minutes | result |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def python_of(line: str) -> Path:
    """The Python that runs the suite on ``line``: this one for the main environment's
    pyspark, else the line's suite environment (built once, cached)."""
    if md.version("pyspark") == line:
        return Path(sys.executable)
    return _pylines.venv(line, lambda msg: print(msg, flush=True), suite=True)


def read_junit(path: Path, result: LineResult) -> None:
    """Count ``path``'s test cases into ``result`` (pytest's JUnit XML)."""
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        if "failure" in tags:
            result.failed += 1
        elif "error" in tags:
            result.errors += 1
        elif "skipped" in tags:
            result.skipped += 1
        else:
            result.passed += 1


def run_line(line: str, out: Path, pytest_args: list[str]) -> LineResult:
    """Run the suite on ``line``; its report and log in ``out``."""
    result = LineResult(line)
    py = python_of(line)
    report, log = out / f"matrix-{line}.xml", out / f"matrix-{line}.log"
    argv = [str(py), "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "--durations=25"]
    argv += [f"--junitxml={report}", *pytest_args]
    print(f"== pyspark {line}: {' '.join(argv)} (log: {log})", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as sink:
        done = subprocess.run(
            argv, cwd=ROOT, env=_pylines.child_env(py), stdout=sink, stderr=subprocess.STDOUT
        )
    result.seconds = time.monotonic() - t0
    result.exit_code = done.returncode
    if report.exists():
        read_junit(report, result)
    for text in reversed(log.read_text(errors="replace").splitlines()):
        if " deselected" in text:  # pytest's last line: "... 12 deselected in 300.1s ..."
            words = text.replace(",", " ").split()
            result.deselected = int(words[words.index("deselected") - 1])
            break
    print(f"   {result.row(_commit())}", flush=True)
    return result


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True)
    return done.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.matrix", description=__doc__.split("\n")[0])
    p.add_argument("--lines", default=",".join(LINES), help="comma-separated pyspark versions")
    p.add_argument("--out", type=Path, default=ROOT / "matrix-results", help="reports and logs")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest as they are")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_line(line, args.out, args.pytest_args) for line in args.lines.split(",")]
    commit = _commit()
    print(f"\n{HEADER}")
    for r in results:
        print(r.row(commit))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
