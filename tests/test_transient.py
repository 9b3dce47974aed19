"""eosink's one rule for "may a retry succeed?" (``eosink.util.classify_error``), on errors
the real services raise: a PostgreSQL server, SQLite files, the S3 server, sockets. Errors
no local service can be made to raise on demand (S3 throttling, a Kafka broker's codes, an
Iceberg catalog's 503) are built from the client libraries' own classes."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from harness import read_ids
from jvm import free_port

import eosink
from eosink.util import ErrorVerdict, classify_error, is_transient


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError("no error raised")


def _pg(url: str, sql: str, **kw: Any) -> None:
    engine = sa.create_engine(url, **kw)
    try:
        with engine.begin() as conn:
            for stmt in sql.split(";"):
                if stmt.strip():
                    conn.exec_driver_sql(stmt)
    finally:
        engine.dispose()


# -- PostgreSQL: a real server --------------------------------------------------------------
def test_postgresql_errors(pg_url: str) -> None:
    url = sa.engine.make_url(pg_url)
    got: dict[str, ErrorVerdict] = {}

    gone = url.set(port=free_port())
    got["refused"] = classify_error(_raised(lambda: _pg(gone.render_as_string(False), "SELECT 1")))
    nodb = url.set(database="eosink_no_such_db")
    got["no-db"] = classify_error(_raised(lambda: _pg(nodb.render_as_string(False), "SELECT 1")))
    _pg(pg_url, "CREATE TABLE t (id INT PRIMARY KEY); INSERT INTO t VALUES (1)")
    got["syntax"] = classify_error(_raised(lambda: _pg(pg_url, "SELEC 1")))
    got["duplicate"] = classify_error(_raised(lambda: _pg(pg_url, "INSERT INTO t VALUES (1)")))
    got["read-only"] = classify_error(
        _raised(lambda: _pg(pg_url, "SET TRANSACTION READ ONLY; INSERT INTO t VALUES (2)"))
    )
    got["permission"] = classify_error(
        _raised(
            lambda: _pg(
                pg_url,
                "CREATE ROLE eosink_nobody; SET ROLE eosink_nobody; SELECT * FROM t",
            )
        )
    )
    got["statement-timeout"] = classify_error(
        _raised(lambda: _pg(pg_url, "SET statement_timeout = 50; SELECT pg_sleep(5)"))
    )
    # A row lock held by another session: lock_timeout ends the wait (55P03).
    holder = sa.create_engine(pg_url)
    conn = holder.connect()
    try:
        conn.exec_driver_sql("BEGIN; SELECT * FROM t WHERE id = 1 FOR UPDATE")
        got["lock"] = classify_error(
            _raised(lambda: _pg(pg_url, "SET lock_timeout = 50; UPDATE t SET id = 3 WHERE id = 1"))
        )
    finally:
        conn.close()
        holder.dispose()
    # A session the administrator ends (57P01), as a failover or a restart does.
    victim = sa.create_engine(pg_url)
    vconn = victim.connect()
    try:
        pid = vconn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        _pg(pg_url, f"SELECT pg_terminate_backend({pid})")
        time.sleep(0.2)
        got["terminated"] = classify_error(_raised(lambda: vconn.exec_driver_sql("SELECT 1").all()))
    finally:
        vconn.invalidate()
        victim.dispose()

    transient = {k for k, v in got.items() if v.transient}
    assert transient == {"refused", "statement-timeout", "lock", "terminated"}, got
    assert got["no-db"].why == "the database or the role does not exist"
    assert got["read-only"].why == "the database is read-only"
    assert got["permission"].why == "permission denied"
    assert got["syntax"].why == "the database refused the statement (SQLSTATE 42601)"
    assert got["duplicate"].why == "the database refused the statement (SQLSTATE 23505)"
    assert got["lock"].why == "a lock not available"
    # libpq reports the server's 57P01, or only the closed connection when its write fails
    # first: both retried.
    assert got["terminated"].why in (
        "the database is shutting down or starting",
        "the connection to the database failed",
    )


# -- SQLite files ---------------------------------------------------------------------------
def test_sqlite_errors(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE t (id INTEGER)")
    url = f"sqlite:///{db}"
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        locked = _raised(
            lambda: _pg(url, "INSERT INTO t VALUES (1)", connect_args={"timeout": 0.05})
        )
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    read_only = _raised(
        lambda: _pg(f"sqlite:///file:{db}?mode=ro&uri=true", "INSERT INTO t VALUES (1)")
    )
    missing = _raised(lambda: _pg(url, "INSERT INTO nothing VALUES (1)"))
    cannot_open = _raised(lambda: _pg(f"sqlite:///{tmp_path}/no/such/dir/x.db", "SELECT 1"))
    assert classify_error(locked) == ErrorVerdict(True, "the database is locked")
    assert classify_error(read_only) == ErrorVerdict(False, "the database is read-only")
    assert classify_error(missing) == ErrorVerdict(False, "the database refused the statement")
    assert classify_error(cannot_open) == ErrorVerdict(
        False, "the database file cannot be opened or created"
    )
    # The DB-API error itself (a plugin using sqlite3 directly) gets the same verdict.
    raw = _raised(lambda: sqlite3.connect(":memory:").execute("SELEC 1"))
    assert classify_error(raw) == ErrorVerdict(False, "the database refused the statement")


# -- S3: a real S3 server, and botocore's own retry classes ----------------------------------
def test_s3_errors(s3_endpoint: str) -> None:
    import boto3
    from botocore.exceptions import ClientError

    def client(endpoint: str) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
            config=__import__("botocore.config").config.Config(
                retries={"max_attempts": 1}, connect_timeout=1
            ),
        )

    no_bucket = _raised(lambda: client(s3_endpoint).list_objects_v2(Bucket="eosink-no-such"))
    away = _raised(lambda: client(f"http://127.0.0.1:{free_port()}").list_objects_v2(Bucket="b"))
    assert classify_error(no_bucket) == ErrorVerdict(False, "S3 refused the request (NoSuchBucket)")
    assert classify_error(away) == ErrorVerdict(True, "S3 could not be reached")

    def answer(code: str, status: int) -> ClientError:
        meta = {"HTTPStatusCode": status}
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": meta}, "PutObject")

    assert classify_error(answer("SlowDown", 503)).transient
    assert classify_error(answer("InternalError", 500)).transient
    assert classify_error(answer("RequestTimeout", 400)).transient
    assert not classify_error(answer("AccessDenied", 403)).transient
    assert not classify_error(answer("InvalidAccessKeyId", 403)).transient


# -- Kafka, Iceberg, HTTP, the OS -----------------------------------------------------------
def test_kafka_errors() -> None:
    from confluent_kafka import KafkaError, KafkaException

    def verdict(code: int, **kw: Any) -> bool:
        return is_transient(KafkaException(KafkaError(code, **kw)))

    assert verdict(KafkaError._TRANSPORT)
    assert verdict(KafkaError._ALL_BROKERS_DOWN)
    assert verdict(KafkaError.NOT_COORDINATOR)
    assert verdict(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    assert verdict(KafkaError.UNKNOWN, retriable=True)  # librdkafka says so
    assert not verdict(KafkaError._TRANSPORT, fatal=True)  # a fatal producer is done
    assert not verdict(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert not verdict(KafkaError.MSG_SIZE_TOO_LARGE)
    assert not verdict(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert is_transient(KafkaError(KafkaError._MSG_TIMED_OUT))  # a delivery report's error


def test_iceberg_errors() -> None:
    from pyiceberg import exceptions as ix

    assert is_transient(ix.CommitFailedException("conflict"))
    assert is_transient(ix.CommitStateUnknownException("lost"))
    assert is_transient(ix.ServiceUnavailableError("503"))
    assert is_transient(ix.ServerError("500"))
    assert not is_transient(ix.NoSuchTableError("t"))
    assert not is_transient(ix.ForbiddenError("403"))
    assert not is_transient(ix.BadRequestError("400"))


def test_http_and_os_errors(tmp_path: Path) -> None:
    import requests

    port = free_port()
    refused = _raised(lambda: requests.get(f"http://127.0.0.1:{port}/v1/config", timeout=2))
    assert classify_error(refused) == ErrorVerdict(True, "the server could not be reached")
    sock = _raised(lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
    assert classify_error(sock) == ErrorVerdict(True, "ConnectionRefusedError")
    assert classify_error(_raised(lambda: open(tmp_path / "no" / "x"))) == ErrorVerdict(
        False, "ENOENT"
    )
    assert not is_transient(OSError(28, "No space left on device"))
    assert is_transient(OSError(116, "Stale file handle"))
    assert not is_transient(ValueError("a bug"))  # unknown: never retried blind


def test_the_chain_and_eosink_errors() -> None:
    """A plugin's own error decides (it knows what it raised); a wrapped error is judged by
    what caused it."""

    class Wrapped(Exception):
        pass

    def wrap() -> None:
        try:
            socket.create_connection(("127.0.0.1", free_port()), timeout=2)
        except OSError as exc:
            raise Wrapped("the target failed") from exc

    assert is_transient(_raised(wrap))
    assert is_transient(eosink.CommitFailedError("nothing visible"))
    assert is_transient(eosink.MetaStoreUnavailableError("away"))
    assert not is_transient(eosink.SinkError("refused"))
    permanent = eosink.SinkError("a refused record")
    permanent.__cause__ = ConnectionRefusedError()
    assert not is_transient(permanent)


def test_deadlock_is_transient(pg_url: str) -> None:
    """Two sessions locking two rows in opposite orders: PostgreSQL ends one with 40P01."""
    _pg(pg_url, "CREATE TABLE d (id INT PRIMARY KEY); INSERT INTO d VALUES (1), (2)")
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def session(first: int, second: int) -> None:
        engine = sa.create_engine(pg_url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"UPDATE d SET id = id WHERE id = {first}")
                barrier.wait()
                conn.exec_driver_sql(f"UPDATE d SET id = id WHERE id = {second}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=session, args=a) for a in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 1, errors
    assert classify_error(errors[0]) == ErrorVerdict(True, "a deadlock")


@pytest.mark.parametrize(
    ("raised", "committed"),
    [
        (ConnectionResetError("the catalog hung up"), True),
        (PermissionError("denied"), False),
        (eosink.CommitOutcome.retry_later("the catalog is busy"), True),
        (eosink.CommitOutcome.failed("the target refuses the epoch: denied"), False),
    ],
    ids=["raised-transient", "raised-permanent", "returned-retry-later", "returned-failed"],
)
def test_commit_retries_what_the_rule_calls_transient(
    spark,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    raised: Exception | eosink.CommitOutcome,
    committed: bool,
) -> None:
    """The core's commit retry asks the rule for any error, not only eosink's own: a raw
    connection reset from a client library is retried (commit is idempotent), a refused
    permission fails the run at once with the error and leaves the epoch PENDING. A
    ``commit`` that returns the outcome instead of raising (``CommitOutcome.retry_later``,
    ``.failed``) is treated the same way (``_rules.after_commit_attempt``)."""
    from eosink_file.plugin import FileCoordinator

    real = FileCoordinator.commit
    calls: list[int] = []

    def flaky(self: Any, epoch: int, committable: Any) -> Any:
        calls.append(epoch)
        if len(calls) == 1:
            if isinstance(raised, eosink.CommitOutcome):
                return raised
            raise raised
        return real(self, epoch, committable)

    df = spark.range(0, 5)
    out = tmp_path / "out"
    url = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setattr(FileCoordinator, "commit", flaky)
    t0 = time.monotonic()
    if committed:
        r = eosink.run(df, sink="file", path=str(out), epoch=1, metastore_url=url)
        assert r.committed and r.rows == 5 and calls == [1, 1]
    else:
        expected = PermissionError if isinstance(raised, Exception) else eosink.SinkError
        with pytest.raises(expected, match="denied"):
            eosink.run(df, sink="file", path=str(out), epoch=1, metastore_url=url)
        with sqlite3.connect(tmp_path / "m.db") as c:
            assert c.execute("select status, epoch from pending_sink_state").fetchall() == [
                ("PENDING", 1)
            ]
        assert calls == [1] and time.monotonic() - t0 < 20
        monkeypatch.undo()  # the permission fixed: the PENDING epoch is finished
        r = eosink.run(df, sink="file", path=str(out), epoch=1, metastore_url=url)
        assert r.committed and r.recovered
    assert read_ids(out) == [0, 1, 2, 3, 4]
