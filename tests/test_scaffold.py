"""``eosink new-sink``: the generated plugin package is installed the way a user installs it
and passes its own tests (conformance and SIGKILL crash test), ruff and mypy --strict."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from eosink import ConfigError
from eosink._cli import main
from eosink._scaffold import new_sink, render, sink_names
from eosink.testing import SinkConformance

ROOT = Path(__file__).resolve().parents[1]

# Tests of the generated package beyond the conformance suite: two of the sink's own in
# test_conformance.py, one chained crash case in test_crash.py.
OWN_TESTS = 2
CRASH_CASES = 1


def _conformance_tests() -> int:
    """How many tests ``SinkConformance`` contributes, parametrizations expanded."""
    n = 0
    for name in dir(SinkConformance):
        if name.startswith("test_"):
            count = 1
            for mark in getattr(getattr(SinkConformance, name), "pytestmark", []):
                if mark.name == "parametrize":
                    count *= len(mark.args[1])
            n += count
    return n


def _uv() -> str:
    uv = shutil.which("uv") or os.environ.get("UV")
    assert uv, "uv is needed to create the throwaway environment: pip install uv"
    return uv


def _throwaway_env(tmp_path: Path) -> Path:
    """A new virtual environment that also sees this project's installed packages (eosink,
    pyspark, pytest, ruff, mypy) through a .pth file, so nothing is downloaded but the
    generated package's build backend. Returns its Python."""
    venv = tmp_path / "venv"
    subprocess.run([_uv(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    paths = {"base": str(venv), "platbase": str(venv)}
    site = Path(sysconfig.get_path("purelib", vars=paths))
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    # addsitedir, not a bare path: the project's own .pth files (editable installs) count too.
    (site / "_eosink_project.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    )
    return venv / "bin" / "python"


def _child_env(python: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "EOSINK_FAULT", "VIRTUAL_ENV"))
    }
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    # The crash test's drivers start as eosink's own crash tests' do (tests/jvm.py).
    from jvm import fast_driver_env

    return fast_driver_env(env)


def _lint(pkg: Path, python: Path, env: dict[str, str], tmp_path: Path) -> None:
    """ruff and mypy --strict on the generated code, with the package's own settings.

    mypy starts from a copy of this project's cache (CI runs mypy before the tests): the
    generated package has the same options, so eosink, pyspark and pydantic are not
    analysed again (25 s on a cold cache, 1 s warm).
    """
    cache = tmp_path / "mypy_cache"
    if (ROOT / ".mypy_cache").is_dir():
        try:
            shutil.copytree(ROOT / ".mypy_cache", cache)
        except (shutil.Error, OSError):
            pass  # a file replaced by a concurrent mypy run: a cache miss, no more
    for argv in (
        ["ruff", "check", "--no-cache", "."],
        ["ruff", "format", "--check", "--no-cache", "."],
        ["mypy", "--cache-dir", str(cache)],
    ):
        res = subprocess.run(
            [str(python), "-m", *argv], cwd=pkg, env=env, capture_output=True, text=True
        )
        assert res.returncode == 0, f"{' '.join(argv)}:\n{res.stdout}{res.stderr}"


def test_generated_package_installs_and_passes_its_own_tests(tmp_path: Path) -> None:
    t0 = time.monotonic()
    laps: dict[str, float] = {}
    pkg = new_sink("scaffold_check", tmp_path)
    assert pkg == tmp_path / "eosink-scaffold_check"
    python = _throwaway_env(tmp_path)
    env = _child_env(python)
    install = [_uv(), "pip", "install", "-q", "--python", str(python), "--no-deps", "-e"]
    subprocess.run([*install, str(pkg)], check=True, env=env)
    laps["installed"] = time.monotonic() - t0
    report = tmp_path / "report.xml"
    log = tmp_path / "pytest.log"
    pytest_argv = ["-m", "pytest", "-p", "no:cacheprovider", "--durations=5"]
    with open(log, "w") as fh:
        tests = subprocess.Popen(
            [str(python), *pytest_argv, f"--junitxml={report}"],
            cwd=pkg,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        try:
            _lint(pkg, python, env, tmp_path)  # meanwhile: no Spark there
            laps["linted"] = time.monotonic() - t0
            code = tests.wait(timeout=600)
            laps["tested"] = time.monotonic() - t0
        finally:
            tests.kill()
            tests.wait()
    out = log.read_text()
    assert code == 0, out[-6000:]
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, out[-3000:]
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    expected = _conformance_tests() + OWN_TESTS + CRASH_CASES
    assert counts == {"tests": expected, "failures": 0, "errors": 0, "skipped": 0}, out[-3000:]
    names = {c.get("name", "") for c in suite.iter("testcase")}
    assert "test_sigkill_then_rerun_lands_every_row_once[after_persist+mid_commit]" in names
    print(", ".join(f"{k} at {v:.1f} s" for k, v in laps.items()), out[-800:], sep="\n")


# -- the command and its refusals (no environment, no Spark) ------------------------------
def test_cli_writes_the_package_and_says_what_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new-sink", "my_events", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    pkg = tmp_path / "eosink-my_events"
    written = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file())
    assert written == [
        ".gitignore",
        "README.md",
        "eosink_my_events/__init__.py",
        "eosink_my_events/plugin.py",
        "pyproject.toml",
        "tests/crash_job.py",
        "tests/test_conformance.py",
        "tests/test_crash.py",
    ]
    assert f"created {pkg}" in out and "pytest" in out
    pyproject = (pkg / "pyproject.toml").read_text()
    assert 'name = "eosink-my-events"' in pyproject
    assert 'my_events = "eosink_my_events.plugin"' in pyproject
    assert 'SINK_NAME = "my_events"' in (pkg / "eosink_my_events" / "plugin.py").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary dir


def test_every_placeholder_is_substituted() -> None:
    for rel, text in render(sink_names("x1")).items():
        assert "{{" not in text and "}}" not in text, rel


@pytest.mark.parametrize(
    "name",
    ["", "Upper", "1st", "my-sink", "my sink", "a__b", "trailing_", "_lead", "a.b", "x" * 41],
)
def test_invalid_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="invalid sink name"):
        new_sink(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "why"),
    [("file", "module named eosink_file"), ("jsonl_dir", "sink named 'jsonl_dir'")],
)
def test_names_already_installed_are_refused(tmp_path: Path, name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        new_sink(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_target_must_be_an_empty_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "eosink-mine"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert main(["new-sink", "mine", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eosink: error: ") and "not an empty directory" in err
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    (target / "keep.txt").unlink()
    assert new_sink("mine", tmp_path) == target  # an empty directory is filled
    assert (target / "eosink_mine" / "plugin.py").is_file()
    other = tmp_path / "file-here"
    other.mkdir()
    (other / "eosink-x").write_text("a file")
    with pytest.raises(ConfigError, match="not an empty directory"):
        new_sink("x", other)
