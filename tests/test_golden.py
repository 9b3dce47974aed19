"""Compatibility: what an older eosink left behind is finished by this one, exactly once.

``tests/golden/<version>/`` holds states written by an earlier eosink (its ``MANIFEST.json``
names the version and commit): for each built-in sink whose target lives in files (the file
sink, plain and rolling; the sql sink on a SQLite target; the iceberg sink on a SQLite catalog
with a local warehouse), ``eosink.run``'s stream and batch runs and ``format("eosink")``, a
driver SIGKILLed at a fault point with an epoch PENDING (checkpointed or not), half aborted
or half committed. Each archive holds the whole state of one such job: its SQLite meta store
(schema revision of that eosink), the checkpoint (Spark's simulated offsets and commits logs,
eosink's journal and lineage), the target with what was staged (the committables' files and
tables, the rolling sink's open files, the markers, the target's journal) and the input of a
change stream. The drivers were tests/lifecycle_driver.py's (the real lifecycle, Spark
simulated), run from a fixed root (:data:`ROOT`): the stored paths are absolute, as a real
job's are, so a state is restored where it was made.

Each test restores one state, checks that it holds what the manifest says (the PENDING epoch
is there), upgrades the meta store with ``eosink db upgrade`` when it is of an older schema
revision (as docs/deploy.md tells an operator to), runs the job again with this eosink, and
checks the target with the sink's own crash-test check: every input row exactly once, every
epoch COMMITTED, nothing PENDING, ABORTED or staged.

A new state format (a committable, journal, marker or meta store change) must keep these
passing; when a release changes one, make that release's states too::

    uv run --frozen --all-extras python tests/test_golden.py

(kafka's state lives in the broker (its transactions): it is not in these archives.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_lifecycle_kills import (
    BATCH,
    ROWS,
    Driver,
    Zygote,
    _iceberg,
    _rolling,
    _sql,
    _sql_check,
)

GOLDEN = Path(__file__).with_name("golden")
ROOT = Path("/tmp/eosink_golden")
"""Where the states were made, and are restored (their paths are absolute). Not ``eosink-``:
the iceberg check tells Spark's data files by ``/eosink-`` in their paths."""


@dataclass(frozen=True)
class Case:
    """A job (``new``: its driver in a directory), the faults its runs were killed at, and
    the check of its target once finished."""

    new: Callable[[Zygote, Path], Driver]
    chain: list[str]
    check: Callable[[Driver], None] = field(default=Driver.check)


def _file(batches: int, options: dict[str, Any] | None = None) -> Callable[[Zygote, Path], Driver]:
    return lambda z, tmp: Driver(z, tmp, batches=batches, options=options)


def _rolling_check(fmt: str) -> Callable[[Driver], None]:
    def check(d: Driver) -> None:
        from test_file_rolling_crash import check_output

        check_output(d, list(range(d.batches * ROWS)), fmt, ROWS)  # type: ignore[arg-type]

    return check


def _sql_target(tmp: Path) -> str:
    return f"sqlite:///{tmp / 'target.sqlite'}"


def _sql_case(**kw: Any) -> Callable[[Zygote, Path], Driver]:
    return lambda z, tmp: _sql(z, tmp, _sql_target(tmp), batches=4, **kw)


def _sql_case_check(cdc: bool = False) -> Callable[[Driver], None]:
    return lambda d: _sql_check(d, _sql_target(d.tmp), cdc=cdc)


def _iceberg_case(cdc: bool = False) -> Callable[[Zygote, Path], Driver]:
    return lambda z, tmp: _iceberg(z, None, tmp, "sqlite", batches=4, cdc=cdc)  # type: ignore[arg-type]


def _iceberg_check(d: Driver) -> None:
    from test_iceberg_crash import _check_table

    _check_table(d, list(range(d.batches * ROWS)), native=False)  # type: ignore[arg-type]


def _iceberg_cdc_check(d: Driver) -> None:
    from test_iceberg_cdc import _check_cdc

    _check_cdc(d)  # type: ignore[arg-type]


FORMAT = {"front": "format", "tasks": 2}
CASES: dict[str, Case] = {
    # eosink.run's stream of the file sink: epoch 1 checkpointed by Spark, PENDING (the
    # restart commits it from its committable); epoch 1 PENDING, not checkpointed (aborted
    # with its committable, written again); that abort killed between its files.
    "file-stream-checkpointed": Case(_file(4), ["before_commit@2"]),
    "file-stream-uncheckpointed": Case(_file(4), ["after_persist@2"]),
    "file-stream-mid-abort": Case(_file(5), ["after_persist@2", "mid_abort"]),
    # A batch run's epoch PENDING; its commit killed between two tasks' files.
    "file-batch-pending": Case(_file(4, BATCH), ["after_persist"]),
    "file-batch-mid-commit": Case(_file(4, BATCH), ["after_persist", "mid_commit"]),
    # Files that span epochs: JSON files open across micro-batches, an epoch PENDING and
    # checkpointed; Parquet pieces, a roll killed inside its merge.
    "rolling-json-checkpointed": Case(
        _file(5, _rolling("json")), ["before_commit@2"], _rolling_check("json")
    ),
    "rolling-parquet-mid-merge": Case(
        _file(5, _rolling("parquet")), ["roll_mid_merge"], _rolling_check("parquet")
    ),
    # The sql sink on a SQLite target: staging tables of two tasks.
    "sql-stream-checkpointed": Case(_sql_case(), ["before_commit@2"], _sql_case_check()),
    "sql-batch-pending": Case(_sql_case(batch=True), ["after_persist"], _sql_case_check()),
    "sql-cdc-checkpointed": Case(
        _sql_case(cdc=True), ["before_commit@2"], _sql_case_check(cdc=True)
    ),
    # The iceberg sink: data files of two tasks (appends), staged change files (upserts).
    "iceberg-stream-checkpointed": Case(_iceberg_case(), ["before_commit@2"], _iceberg_check),
    "iceberg-cdc-checkpointed": Case(
        _iceberg_case(cdc=True), ["before_commit@2"], _iceberg_cdc_check
    ),
    # format("eosink")'s data source: a stream's epoch PENDING after its tasks' phase 1; a
    # batch's PENDING epoch.
    "format-stream-pending": Case(_file(4, FORMAT), ["after_persist@2"]),
    "format-batch-pending": Case(_file(4, {**FORMAT, "batch": True}), ["after_persist"]),
}


def _version_dir() -> Path:
    """The newest release's states (the only one so far)."""
    dirs = sorted(p for p in GOLDEN.iterdir() if (p / "MANIFEST.json").exists())
    assert dirs, f"no golden states in {GOLDEN}"
    return dirs[-1]


@contextlib.contextmanager
def _restored_place(name: str) -> Iterator[Path]:
    """``ROOT/name``, emptied, held by this process alone (xdist workers, other checkouts)."""
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        place = ROOT / name
        shutil.rmtree(place, ignore_errors=True)
        try:
            yield place
        finally:
            shutil.rmtree(place, ignore_errors=True)


def _restore(zygote: Zygote, vdir: Path, name: str, place: Path) -> Driver:
    """Case ``name``'s job (its directories, a change stream's input) with its state of
    ``vdir`` restored at ``place``."""
    d = CASES[name].new(zygote, place)
    with tarfile.open(vdir / f"{name}.tar.gz") as tar:
        tar.extractall(place, filter="data")
    return d


def _upgrade(url: str) -> str:
    """``eosink db upgrade --url URL``, as an operator runs it (the CLI's ``main``, in this
    process: a new interpreter per state cost ~1.5 s each); its output."""
    import io

    from eosink._cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(["db", "upgrade", "--url", url])
    assert code == 0, out.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


@pytest.mark.parametrize("moved", [False, True], ids=["same-store", "moved"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_older_state_is_finished(zygote: Zygote, name: str, moved: bool) -> None:
    """``moved``: the job's driver restarts on another machine, with a meta store of its own
    (an empty SQLite file there): only the checkpoint and the target (their journals, the
    target's markers) carry the older eosink's state."""
    from eosink._metastore.migrations import head_revision

    vdir = _version_dir()
    manifest = json.loads((vdir / "MANIFEST.json").read_text())
    made = manifest["cases"][name]
    case = CASES[name]
    with _restored_place(name) as place:
        d = _restore(zygote, vdir, name, place)
        assert d.batches == made["batches"], "the case's job changed since its state was made"
        revision = manifest["revision"]
        if revision != head_revision():
            assert f"{revision} -> {head_revision()}" in _upgrade(d.url)
        # The state holds what the older eosink left: the epochs as the manifest lists them.
        assert d.states() == made["states"]
        if not case.chain[-1].startswith("roll_"):  # a roll's state is the target's own
            assert "PENDING" in made["states"] or "ABORTED" in made["states"], made
        if moved:
            for p in place.glob("m.db*"):
                p.unlink()
        d.finish()
        case.check(d)
        d.finish()  # and running the finished job again changes nothing
        case.check(d)


def _execute(url: str, statement: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def _refused(d: Driver, message: str) -> None:
    """A run of ``d`` fails with ``message`` and changes nothing: the same epochs, the same
    files in the target."""
    before = (d.states(), sorted(str(p) for p in d.out.rglob("*")))
    assert d.run() == 1, d.log[-3000:]
    assert message in d.log, d.log[-3000:]
    assert (d.states(), sorted(str(p) for p in d.out.rglob("*"))) == before


def test_what_a_downgrade_meets(zygote: Zygote) -> None:
    """An older eosink run on what a newer one left (docs/deploy.md, "Downgrading"): a meta
    store of a newer schema revision, and a PENDING epoch whose committable a newer codec
    wrote, or whose epoch spec a newer eosink wrote, are refused with an error that says
    what to do, before anything changes; back on the newer eosink (here: the state as it
    was), the job finishes exactly once."""
    name = "file-stream-checkpointed"
    vdir = _version_dir()
    with _restored_place(name) as place:
        d = _restore(zygote, vdir, name, place)
        _execute(d.url, "UPDATE alembic_version SET version_num = '9999'")
        _refused(d, "has schema revision 9999, newer than this eosink")
        from eosink._metastore.migrations import head_revision

        made = json.loads((vdir / "MANIFEST.json").read_text())["revision"]
        _execute(d.url, f"UPDATE alembic_version SET version_num = '{made}'")
        if made != head_revision():
            _upgrade(d.url)
        _execute(d.url, "UPDATE pending_sink_state SET codec_version = 7 WHERE status = 'PENDING'")
        _refused(d, "was staged by a newer eosink: its committable has version 7")
        assert "Run the job with the eosink (and sink plugin) version that staged it" in d.log
        _execute(d.url, "UPDATE pending_sink_state SET codec_version = 1")
        newer = '{"v": 2, "options": {}, "schema": null}'
        _execute(d.url, f"UPDATE pending_sink_state SET spec = '{newer}' WHERE status = 'PENDING'")
        _refused(d, "was staged by a newer eosink: its epoch spec has version 2")
        _execute(d.url, "UPDATE pending_sink_state SET spec = NULL")
        d.finish()
        d.check()


def test_every_case_has_its_state() -> None:
    """Each case here has a state of the newest release, and each state a case."""
    vdir = _version_dir()
    states = sorted(p.name.removesuffix(".tar.gz") for p in vdir.glob("*.tar.gz"))
    assert states == sorted([*CASES, SCAFFOLD])


SCAFFOLD = "scaffold"
"""The archive of the plugin package ``eosink new-sink scaffold_frozen`` made at that release."""


def test_a_plugin_made_by_an_older_scaffold_passes_the_conformance_suite(tmp_path: Path) -> None:
    """A third-party plugin as ``eosink new-sink`` generated it at the older release, left
    as it was, installed the way its README says, passes this eosink's conformance suite
    (``eosink.testing.SinkConformance``: every phase of the contract, a simulated crash at
    every fault point, recovery through this core) and the sink's own tests. (Its Spark crash
    test is tests/test_scaffold.py's, on a package made now.)"""
    import xml.etree.ElementTree as ET

    from test_scaffold import OWN_TESTS, _child_env, _conformance_tests, _throwaway_env, _uv

    with tarfile.open(_version_dir() / f"{SCAFFOLD}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    (pkg,) = tmp_path.glob("eosink-*")
    python = _throwaway_env(tmp_path)
    env = _child_env(python)
    install = [_uv(), "pip", "install", "-q", "--python", str(python), "--no-deps", "-e"]
    subprocess.run([*install, str(pkg)], check=True, env=env)
    report = tmp_path / "report.xml"
    argv = ["-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}"]
    out = subprocess.run(
        [str(python), *argv, "tests/test_conformance.py"],
        cwd=pkg,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    expected = _conformance_tests() + OWN_TESTS
    assert counts == {"tests": expected, "failures": 0, "errors": 0, "skipped": 0}, out.stdout


def make(version_dir: Path) -> None:
    """Run each case's chain with this checkout's eosink at :data:`ROOT` and store its state
    in ``version_dir`` (one archive a case, and ``MANIFEST.json``)."""
    import datetime

    import eosink
    from eosink._metastore.migrations import head_revision

    version_dir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=GOLDEN
    ).stdout.strip()
    manifest: dict[str, Any] = {
        "eosink": eosink.__version__,
        "commit": commit,
        "made": datetime.date.today().isoformat(),
        "root": str(ROOT),
        "revision": head_revision(),
        "cases": {},
    }
    z = Zygote()
    try:
        for name, case in sorted(CASES.items()):
            with _restored_place(name) as place:
                d = case.new(z, place)
                for fault in case.chain:
                    d.kill_at(fault)
                states = d.states()
                with tarfile.open(version_dir / f"{name}.tar.gz", "w:gz") as tar:
                    for p in sorted(place.iterdir()):
                        if not (p.name.startswith("marks-") or p.name.startswith("run-")):
                            tar.add(p, arcname=p.name)
                manifest["cases"][name] = {
                    "batches": d.batches,
                    "chain": case.chain,
                    "states": states,
                }
                print(f"{name}: {states}")
    finally:
        z.close()
    (version_dir / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    # A plugin package as this release's scaffold generates it.
    import tempfile

    from eosink._scaffold import new_sink

    with tempfile.TemporaryDirectory() as tmp:
        pkg = new_sink("scaffold_frozen", Path(tmp))
        with tarfile.open(version_dir / f"{SCAFFOLD}.tar.gz", "w:gz") as tar:
            tar.add(pkg, arcname=pkg.name)


if __name__ == "__main__":
    import eosink

    make(GOLDEN / eosink.__version__)
