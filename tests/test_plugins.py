"""Plugin discovery, the third-party example plugin, and the conformance suite."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from harness import sinks_registered

import eosink
from eosink import ConfigError, UnknownSinkError, get_sink, list_sinks
from eosink.errors import SchemaMismatchError
from eosink.testing import SinkConformance

ROOT = Path(__file__).resolve().parents[1]


def test_builtin_and_third_party_sinks_are_discovered() -> None:
    sinks = {s.name: s for s in list_sinks()}
    assert sinks["file"].package == "eosink"
    assert sinks["file"].version == eosink.__version__
    assert sinks["jsonl_dir"].package == "eosink-example"
    assert sinks["jsonl_dir"].version == "0.1.0"


def test_plugins_cli_lists_name_package_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "eosink._cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = {s["name"]: s for s in json.loads(out)}
    assert listed["jsonl_dir"]["package"] == "eosink-example"
    assert listed["file"]["version"] == eosink.__version__
    text = subprocess.run(
        [sys.executable, "-m", "eosink._cli", "plugins"], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"^file\s+eosink\s+0\.1\.0", text, re.M)


def test_unknown_sink_lists_installed() -> None:
    with pytest.raises(UnknownSinkError) as exc:
        get_sink("icebreg")
    assert "unknown sink 'icebreg'" in str(exc.value)
    assert "file" in str(exc.value) and "jsonl_dir" in str(exc.value)
    assert isinstance(exc.value, ConfigError)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"path": "/tmp/x", "format": "xml"}, "format"),
        ({"path": "/tmp/x", "colour": "red"}, "colour"),
        ({"format": "json"}, "path"),
        ({"path": ""}, "path"),
        ({"path": "https://bucket/x"}, "path"),
        ({"path": "s3://"}, "path"),
    ],
)
def test_invalid_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        get_sink("file").parse_options(options)
    assert f"{field}:" in str(exc.value)
    assert "invalid options for sink 'file'" in str(exc.value)


def test_every_hook_is_documented() -> None:
    from eosink import hookspecs

    hooks = [
        n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("eosink_")
    ]
    assert hooks, "no hookspecs found"
    doc = (ROOT / "docs" / "plugins.md").read_text()
    for name in hooks:
        assert getattr(hookspecs, name).__doc__, f"hook {name} has no docstring"
        assert f"`{name}`" in doc, f"hook {name} is not documented in docs/plugins.md"


def test_public_api_is_small_and_exported() -> None:
    for name in eosink.__all__:
        assert hasattr(eosink, name), name
    assert all(not n.startswith("_") or n == "__version__" for n in eosink.__all__)


def test_epoch_committed_hook_reaches_plugins(tmp_path: Path) -> None:
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime
    from eosink.registry import plugin_manager

    seen: list[tuple[str, int, dict[str, Any]]] = []

    class Listener:
        @eosink.hookimpl
        def eosink_epoch_committed(self, sink_id: str, epoch: int, figures: dict[str, Any]) -> None:
            seen.append((sink_id, epoch, figures))

    pm = plugin_manager()
    listener = Listener()
    pm.register(listener)
    try:
        plugin = get_sink("jsonl_dir")
        rt = SinkRuntime(
            plugin,
            plugin.parse_options({"path": str(tmp_path / "o")}),
            "hook",
            MetaStore(f"sqlite:///{tmp_path / 'm.db'}"),
        )
        rt.start()
        c, _ = rt.pre_commit(0, [], rows=0, write_s=0.0)
        rt.commit_epoch(0, c)
    finally:
        pm.unregister(listener)
    assert [(s, e) for s, e, _ in seen] == [("hook", 0)]
    assert {"rows", "commit_ms", "visibility_lag_s"} <= set(seen[0][2])


def test_capabilities_are_read_from_the_declared_record(tmp_path: Path) -> None:
    """The core reads what a sink offers from its declared record: a promise the coordinator
    does not keep fails the start with a ConfigError naming the class; a plugin written
    before the record (declaring none) keeps working, its capabilities read
    from its coordinator's classes, with a DeprecationWarning that gives the declaration."""
    import dataclasses
    import warnings

    from eosink._metastore import MetaStore
    from eosink._mixins import _undeclared_told
    from eosink._protocol import SinkRuntime

    base = get_sink("jsonl_dir")
    assert base.capabilities == eosink.Capabilities(staged_epochs=True)

    def runtime(plugin: Any) -> SinkRuntime:
        opts = plugin.parse_options({"path": str(tmp_path / "o")})
        return SinkRuntime(plugin, opts, "caps", MetaStore(f"sqlite:///{tmp_path / 'm.db'}"))

    promised = dataclasses.replace(
        base, capabilities=eosink.Capabilities(staged_epochs=True, target_marker=True)
    )
    rt = runtime(promised)
    with pytest.raises(ConfigError) as exc:
        rt.start()
    rt.store.close()
    assert str(exc.value) == (
        "sink plugin 'jsonl_dir' declares capabilities target_marker=True, but its coordinator "
        "(Coordinator) does not implement eosink.TargetMarker: implement it, or declare "
        "target_marker=False (see docs/errors.md#configerror)"
    )
    _undeclared_told.discard("jsonl_dir")
    rt = runtime(dataclasses.replace(base, capabilities=None))  # written before the record
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt.start()
    told = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(told) == 1
    assert str(told[0].message) == (
        "sink plugin 'jsonl_dir' declares no capabilities; eosink reads them from its "
        "coordinator's classes for now. Declare them: SinkPlugin(..., "
        "capabilities=eosink.Capabilities(staged_epochs=True)); a later minor release requires it"
    )
    assert rt.caps == eosink.Capabilities(staged_epochs=True)
    rt.close()
    rt.store.close()


# --- the conformance suite, run for every sink shipped or installed here ------------------
def _read_files(root: Path, fmt: str, partitioned: bool) -> list[dict[str, Any]]:
    if not root.exists():
        return []
    if fmt == "json":
        rows = []
        for f in sorted(root.rglob("*.jsonl")):
            if "_eosink_staging" not in f.parts:
                rows += [json.loads(line) for line in f.read_text().splitlines()]
        return rows
    table = ds.dataset(
        root, format=fmt, partitioning="hive" if partitioned else None, exclude_invalid_files=False
    ).to_table()
    return table.to_pylist()


class _FileConformance(SinkConformance):
    sink_name = "file"
    fmt = "parquet"
    partition_by: tuple[str, ...] = ()

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "path": str(tmp_path / "out"),
            "format": self.fmt,
            "partition_by": list(self.partition_by),
        }

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        return _read_files(Path(options.path), self.fmt, bool(self.partition_by))

    def leftovers(self, options: Any) -> list[str]:
        return [
            str(p)
            for p in Path(options.path).rglob("*")
            if p.is_file() and "_eosink_staging" in p.parts
        ]


class TestFileParquetConformance(_FileConformance):
    pass


class TestFileJsonConformance(_FileConformance):
    fmt = "json"


class TestFileCsvConformance(_FileConformance):
    fmt = "csv"


class TestFilePartitionedConformance(_FileConformance):
    partition_by = ("name",)


class TestJsonlDirConformance(SinkConformance):
    sink_name = "jsonl_dir"

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "out")}

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        root = Path(options.path)
        return [
            json.loads(line)
            for f in sorted(root.glob("epoch-*.jsonl"))
            for line in f.read_text().splitlines()
        ]

    def leftovers(self, options: Any) -> list[str]:
        return [str(p) for p in (Path(options.path) / ".staging").rglob("*") if p.is_file()]


def test_partition_values_cannot_escape_path(tmp_path: Path) -> None:
    """Values with '/', '..', '=' land in one escaped directory under path, round-trip; a NUL,
    which no directory name can hold, is refused before anything is published."""
    from eosink.testing import drive_writers

    plugin = get_sink("file")
    opts = plugin.parse_options({"path": str(tmp_path / "out"), "partition_by": ["k"]})
    nul = pa.record_batch({"k": pa.array(["ok", "x\x00y"]), "n": pa.array([0, 1])})
    with pytest.raises(SchemaMismatchError, match="NUL"):
        drive_writers(plugin, opts, "esc", 0, [[nul]])
    assert not any(p.is_file() for p in (tmp_path / "out").rglob("*.parquet"))
    values = ["a/b", "..", "../../etc", "k=v", "%2F", "", None, "ok"]
    batch = pa.record_batch({"k": pa.array(values), "n": pa.array(range(len(values)))})
    results = drive_writers(plugin, opts, "esc", 0, [[batch]])
    coord = plugin.coordinator_factory(opts, "esc")
    coord.commit(0, coord.pre_commit(0, results).committable)
    root = (tmp_path / "out").resolve()
    files = [p for p in root.rglob("*.parquet")]
    assert len(files) == len(values) - 1  # "" and None share the default partition
    for f in files:
        assert f.resolve().is_relative_to(root)
        assert f.parent.parent == root, f  # exactly one directory level: k=<escaped>
    assert not any(p.name == ".." for p in root.rglob("*"))
    # Where an unescaped value would have landed: nothing there.
    for v in values:
        if v and "/" in v:
            landing = Path(os.path.normpath(root / f"k={v}"))
            assert not landing.exists() and not (landing.parent / "k=a").exists(), landing
    assert not (root / "etc").exists() and not (root.parent / "etc").exists()
    names = {p.name for p in root.iterdir()}
    assert {n for n in names if not n.startswith("_")} == {f.parent.name for f in files}
    assert {n for n in names if n.startswith("_")} <= {"_eosink", "_eosink_staging"}
    table = ds.dataset(
        root,
        format="parquet",
        partitioning=ds.HivePartitioning(
            pa.schema([("k", pa.string())]), null_fallback="__HIVE_DEFAULT_PARTITION__"
        ),
    ).to_table()
    got = {r["n"]: r["k"] for r in table.to_pylist()}
    for n, v in enumerate(values):
        assert got[n] == (v or None), (n, v, got[n])


# --- readiness: a sink's missing extra, listed and refused before Spark ----------------------
def _without(module: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``args``) in a fresh interpreter where ``module`` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules[{module!r}] = None\n{code}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_testing_without_pytest_names_the_extra() -> None:
    res = _without("pytest", "import eosink.testing")
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last == (
        "eosink.errors.MissingExtraError: Python module 'pytest' is not installed (needed for "
        "eosink.testing, the conformance suite for sink plugins). Install it with: "
        "pip install 'eosink[testing]' (see docs/errors.md#missingextraerror)"
    )


def test_plugins_cli_shows_a_missing_extra() -> None:
    run_cli = "from eosink._cli import main; sys.exit(main(sys.argv[1:]))"
    res = _without("pyiceberg", run_cli, "plugins")
    assert res.returncode == 0, res.stderr
    assert re.search(
        r"^iceberg\s+eosink\s+0\.1\.0\s+missing extra\s+Apache Iceberg", res.stdout, re.M
    )
    assert re.search(r"^file\s+eosink\s+0\.1\.0\s+ready\s", res.stdout, re.M)
    assert (
        "iceberg: pyiceberg is not installed; to use the sink: pip install 'eosink[iceberg]'"
        in res.stdout.splitlines()
    )
    res = _without("pyiceberg", run_cli, "plugins", "--json")
    assert res.returncode == 0, res.stderr
    listed = {s["name"]: s for s in json.loads(res.stdout)}
    assert listed["iceberg"]["status"] == "missing extra"
    assert listed["iceberg"]["missing_modules"] == ["pyiceberg"]
    assert listed["iceberg"]["install"] == "pip install 'eosink[iceberg]'"
    assert listed["file"]["status"] == "ready" and listed["file"]["install"] is None
    # With the extra installed, every sink here is ready.
    res = _without("no_such_module_eosink", run_cli, "plugins", "--json")
    assert {s["status"] for s in json.loads(res.stdout)} == {"ready"}


def test_a_missing_extra_fails_before_spark_is_touched() -> None:
    """eosink.run and format("eosink")'s setup refuse the sink with the pip hint, as a
    ConfigError, before any Spark call: the DataFrame passed is not even a DataFrame."""
    from eosink._spark_version import PYTHON_DATA_SOURCES

    attempts = "lambda: eosink.run(object(), sink='iceberg', table='db.t'),"
    if PYTHON_DATA_SOURCES:  # format("eosink")'s, Spark 4's Python data sources only
        attempts += "lambda: _setup({'sink': 'iceberg', 'table': 'db.t'}, None)"
    res = _without(
        "pyiceberg",
        "import eosink\n"
        + ("from eosink._datasource import _setup\n" if PYTHON_DATA_SOURCES else "")
        + "from pyspark import SparkContext\n"
        f"for attempt in ({attempts}):\n"
        "    try:\n"
        "        attempt()\n"
        "    except eosink.ConfigError as e:\n"
        "        assert isinstance(e, eosink.MissingExtraError) and isinstance(e, ImportError)\n"
        "        print(type(e).__name__, e.install, '|', e)\n"
        "assert SparkContext._active_spark_context is None\n",
    )
    assert res.returncode == 0, res.stderr
    line = (
        "MissingExtraError eosink[iceberg] | Python module 'pyiceberg' is not installed "
        "(needed for the iceberg sink). Install it with: pip install 'eosink[iceberg]' "
        "(see docs/errors.md#missingextraerror)"
    )
    assert res.stdout.splitlines() == [line] * (2 if PYTHON_DATA_SOURCES else 1)


def test_a_third_party_sink_declares_its_requirements() -> None:
    import pickle

    from eosink import MissingExtraError

    base = get_sink("jsonl_dir")
    needy = eosink.SinkPlugin(
        name="needy",
        options_model=base.options_model,
        writer_factory=base.writer_factory,
        coordinator_factory=base.coordinator_factory,
        write_result_codec=base.write_result_codec,
        committable_codec=base.committable_codec,
        default_sink_id=base.default_sink_id,
        description="needs a module that is not installed",
        requires={"json": "needy-sink", "no_such_module_eosink": "needy-sink[fast]"},
    )

    with sinks_registered("needy-provider", needy):
        info = {s.name: s for s in list_sinks()}["needy"]
        with pytest.raises(ConfigError) as exc:
            get_sink("needy").check_ready()
    assert info.status == "missing extra"
    assert info.missing == ("no_such_module_eosink",)
    assert info.install == "pip install 'needy-sink[fast]'"
    err = exc.value
    assert isinstance(err, MissingExtraError)
    assert str(err) == (
        "Python module 'no_such_module_eosink' is not installed (needed for the needy sink). "
        "Install it with: pip install 'needy-sink[fast]' (see docs/errors.md#missingextraerror)"
    )
    again = pickle.loads(pickle.dumps(err))
    assert (again.extra, again.install, again.pip) == ("fast", "needy-sink[fast]", err.pip)
    get_sink("file").check_ready()  # nothing declared: ready


def test_executor_imports_stay_light() -> None:
    """What a Spark Python worker imports to unpickle a writer task (the sink plugin and
    eosink._tasks) pulls in neither the meta store (SQLAlchemy, Alembic), nor the protocol,
    nor pyspark's data source API; the driver-side names still import on first use."""
    import subprocess
    import sys

    code = (
        "import sys, eosink_file.plugin, eosink._tasks\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')"
        " or m in ('eosink._protocol', 'eosink._metastore', 'eosink._run', 'eosink._session',"
        " 'eosink._write', 'eosink._datasource', 'pyspark.sql.datasource'))\n"
        "assert not heavy, heavy\n"
        "from eosink import run, EpochFigures\n"
        "assert 'sqlalchemy' in sys.modules and callable(run)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_broken_plugin_never_stops_the_other_sinks(tmp_path: Path) -> None:
    """An installed entry point whose module fails to import: reported once with its name
    and package, listed as broken by `eosink plugins` (which still exits 0), and every other
    sink works; asking for a sink that is not there names the broken plugin."""
    dist = tmp_path / "eosink_broken-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eosink-broken\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[eosink]\nbroken = eosink_broken_no_such_module\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cli = [sys.executable, "-m", "eosink._cli", "plugins"]
    res = subprocess.run(cli, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^file\s+eosink\s+0\.1\.0\s+ready\s", res.stdout, re.M)
    assert re.search(r"^broken\s+eosink-broken\s+1\.2\.3\s+broken", res.stdout, re.M)
    assert (
        "broken: the plugin of package eosink-broken 1.2.3 failed to load (ModuleNotFoundError: "
        "No module named 'eosink_broken_no_such_module'); fix or uninstall it: "
        "pip uninstall eosink-broken"
    ) in res.stdout.splitlines()
    assert res.stderr.count("failed to load") == 1, res.stderr  # the warning, once
    res = subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env)
    listed = {s["name"]: s for s in json.loads(res.stdout)}
    assert listed["broken"]["status"] == "broken"
    assert listed["broken"]["error"].startswith("ModuleNotFoundError")
    assert listed["file"]["status"] == "ready" and listed["file"]["error"] is None
    # Asking a run for the broken plugin's sink: the row "plugin-broken" of test_bad_inputs.py.


# -- the conformance suite catches what plugins.md forbids ---------------------------------
# Each case breaks the example sink (jsonl_dir) the way a third-party author might, and the
# conformance check for that contract must fail on it (the unbroken sink passes it above).


def _jsonl_variant(**replace: Any) -> Any:
    import dataclasses

    return dataclasses.replace(get_sink("jsonl_dir"), **replace)


def _commit_skipping_older_epochs() -> Any:
    import eosink_example as ex

    class Broken(ex.Coordinator):
        def commit(self, epoch: int, committable: dict[str, Any]) -> None:
            done = [int(p.name[6:14]) for p in self.root.glob("epoch-*.jsonl")]
            if done and max(done) >= epoch:  # "already committed": a high-water mark
                return
            super().commit(epoch, committable)

    return _jsonl_variant(coordinator_factory=lambda o, s: Broken(o, s))


def _marker(read: Any, write: Any) -> Any:
    import eosink_example as ex

    class Broken(ex.Coordinator, eosink.TargetMarker):
        def read_marker(self) -> dict[str, Any] | None:
            return dict(read(self))

        def write_marker(self, marker: dict[str, Any]) -> None:
            write(self, marker)

    return _jsonl_variant(
        coordinator_factory=lambda o, s: Broken(o, s),
        capabilities=eosink.Capabilities(staged_epochs=True, target_marker=True),
    )


def _stored_marker_file(c: Any) -> Path:
    return Path(c.root) / ".marker.json"


def _marker_ignored() -> Any:  # write_marker does nothing; read_marker makes one up
    return _marker(lambda c: {"sink_id": "x", "last_epoch": -1}, lambda c, m: None)


def _marker_without_last_epoch() -> Any:  # stored, but last_epoch is never maintained
    return _marker(
        lambda c: {**json.loads(_stored_marker_file(c).read_text()), "last_epoch": -1},
        lambda c, m: _stored_marker_file(c).write_text(json.dumps(m)),
    )


def _staged_names_without_attempt_id() -> Any:
    import eosink_example as ex

    def make_writer(opts: Any, ctx: eosink.WriterContext) -> Any:
        w = ex.Writer(opts, ctx)
        w.file = Path(opts.path) / ".staging" / str(ctx.epoch) / f"p{ctx.partition_id}.jsonl"
        return w

    return _jsonl_variant(writer_factory=make_writer)


def _staged_epochs_empty() -> Any:
    import eosink_example as ex

    class Broken(ex.Coordinator):
        def staged_epochs(self) -> list[int]:
            return []

    return _jsonl_variant(coordinator_factory=lambda o, s: Broken(o, s))


@pytest.mark.parametrize(
    ("breakage", "check"),
    [
        (_commit_skipping_older_epochs, "test_commits_out_of_order"),
        (_marker_ignored, "test_target_marker_round_trip"),
        (_marker_without_last_epoch, "test_target_marker_round_trip"),
        (_staged_names_without_attempt_id, "test_staged_names_carry_the_attempt_id"),
        (_staged_epochs_empty, "test_staged_epochs_lists_what_writers_staged"),
    ],
    ids=lambda v: getattr(v, "__name__", v).strip("_") if callable(v) else v,
)
def test_conformance_check_fails_on_its_breakage(tmp_path: Path, breakage: Any, check: str) -> None:
    suite = TestJsonlDirConformance()
    suite._db = tmp_path / "conformance-metastore.db"
    plugin = breakage()
    options = plugin.parse_options(suite.make_options(tmp_path))
    with pytest.raises(AssertionError):
        getattr(suite, check)((plugin, options))


def test_conformance_fails_a_fault_point_the_sink_never_reaches(tmp_path: Path) -> None:
    """A commit that never calls fault_point("mid_commit"): the crash test fails (it used to
    skip), saying what to add."""
    import eosink_example as ex

    class NoMidCommit(ex.Coordinator):
        def commit(self, epoch: int, committable: dict[str, Any]) -> None:
            final = self.root / f"epoch-{epoch:08d}.jsonl"
            if not final.exists():
                final.write_text("".join(Path(f).read_text() for f in committable["files"]))
            shutil.rmtree(self.root / ".staging" / str(epoch), ignore_errors=True)

    suite = TestJsonlDirConformance()
    suite._db = tmp_path / "conformance-metastore.db"
    plugin = _jsonl_variant(coordinator_factory=lambda o, s: NoMidCommit(o, s))
    options = plugin.parse_options(suite.make_options(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r'fault_point\("mid_commit"\)'):
        suite.test_crash_at_fault_point((plugin, options), "mid_commit", True)
    # The core's own points are still reached: that case passes on a fresh target.
    suite._db = tmp_path / "again" / "conformance-metastore.db"
    options = plugin.parse_options(suite.make_options(tmp_path / "again"))
    suite.test_crash_at_fault_point((plugin, options), "before_commit", True)
