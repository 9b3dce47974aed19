"""Shared fixtures: one local Spark session, real PostgreSQL, meta store URLs.

PostgreSQL is the machine's server on 127.0.0.1:5432 (override with EOSINK_TEST_PG, a URL
of a database where the test user may CREATE DATABASE). It is never skipped: a missing
server fails the tests that need it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

PG_ADMIN = os.environ.get("EOSINK_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
TESTS = Path(__file__).resolve().parent


def create_pg_database() -> str:
    """Create a fresh PostgreSQL database; return its URL."""
    name = f"eosink_test_{uuid.uuid4().hex[:10]}"
    eng = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is required for these tests and is not reachable at {PG_ADMIN}: "
            f"{exc.orig}. Start it (see .ci/run)."
        )
    finally:
        eng.dispose()
    return sa.engine.make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = sa.engine.make_url(url).database
    eng = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
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


@pytest.fixture(params=["sqlite", "postgres"])
def metastore_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metastore.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    import eosink

    session = eosink.spark_session("local[2]", app_name="eosink-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
