"""One rule for "may a retry succeed?": the verdict on an error raised by a database, S3,
Kafka, an Iceberg catalog or the operating system.

The core's commit retry, the meta store and the sinks all ask :func:`classify_error`, so an
error is retried (or not) the same way wherever it is met. Plugin authors reach it as
``eosink.util.classify_error``.

The rule walks the error and what caused it (``orig`` of a SQLAlchemy error, ``__cause__``,
``__context__``) and takes the first verdict one of them gives:

* an :class:`~eosink.EosinkError`: its ``transient`` attribute;
* a database error (SQLAlchemy or DB-API): by SQLSTATE where the driver gives one (class
  08 connection, 40001/40P01 serialization and deadlock, 53 resources, 55P03 lock not
  available, 57 operator intervention, 58 system error: transient; read-only, permissions,
  a refused login, a missing database or a full disk and every other class: permanent),
  else by SQLite's and the drivers' messages, else by class (``OperationalError`` and
  ``InterfaceError`` transient, the others permanent);
* boto3/botocore: what botocore's own standard retry mode retries (connection errors, HTTP
  500/502/503/504, request timeouts, throttling codes); any other S3 answer (AccessDenied,
  NoSuchBucket...) is permanent;
* confluent-kafka: a fatal error is permanent; a retriable one, or a broker away (transport,
  timeouts, no leader or coordinator yet), transient; the others permanent;
* pyiceberg: a commit conflict (retried from the new snapshot), an unknown commit state,
  a catalog that answers 5xx or "too many requests": transient; the others permanent;
* requests (pyiceberg's REST client): connection errors and timeouts are transient;
* the operating system: ``ConnectionError``, ``TimeoutError``, and ``OSError``s whose errno
  says busy, interrupted, unreachable or stale are transient; a full disk, a read-only file
  system, a refused permission, a missing file are permanent.

Anything else is permanent: an error nobody knows to be passing is not retried blind.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["ErrorVerdict", "classify_error", "is_transient"]


class ErrorVerdict(NamedTuple):
    """Whether retrying the failed operation later may succeed, and why (a few words)."""

    transient: bool
    why: str


def is_transient(exc: BaseException) -> bool:
    """``classify_error(exc).transient``."""
    return classify_error(exc).transient


def classify_error(exc: BaseException) -> ErrorVerdict:
    """The verdict of the first error in ``exc``'s chain that gives one (see the module's
    docstring); permanent when none does."""
    for e in _chain(exc):
        verdict = _verdict(e)
        if verdict is not None:
            return verdict
    return ErrorVerdict(False, f"{type(exc).__name__} is not known to be transient")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for nxt in (getattr(e, "orig", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _verdict(e: BaseException) -> ErrorVerdict | None:
    from .errors import EosinkError

    if isinstance(e, EosinkError):
        return ErrorVerdict(e.transient, type(e).__name__)
    module = type(e).__module__ or ""
    root = module.split(".", 1)[0]
    if root == "sqlalchemy" or _is_dbapi_error(e):
        return _database(e)
    if root in ("botocore", "boto3", "s3transfer"):
        return _aws(e)
    if root in ("confluent_kafka", "cimpl"):  # confluent-kafka's C classes live in cimpl
        return _kafka(e)
    if root == "pyiceberg":
        return _iceberg(e)
    if root in ("requests", "urllib3"):
        return _http_client(e)
    if isinstance(e, OSError):
        return _os(e)
    return None


# -- databases -------------------------------------------------------------------------------
_PERMANENT_SQLSTATES = {
    "25006": "the database is read-only",
    "42501": "permission denied",
    "3D000": "the database does not exist",
    "53100": "the database's disk is full",
}
_TRANSIENT_SQLSTATES = {
    "40001": "a serialization failure",
    "40P01": "a deadlock",
    "55P03": "a lock not available",
    "57014": "the statement was cancelled (a timeout)",
}
_TRANSIENT_SQLSTATE_CLASSES = {
    "08": "the connection to the database failed",
    "53": "the database is out of resources",
    "57": "the database is shutting down or starting",
    "58": "a system error of the database",
}
# Messages of drivers that give no SQLSTATE (SQLite; a connection psycopg never made).
_PERMANENT_TEXT = (
    ("readonly database", "the database is read-only"),
    ("read-only", "the database is read-only"),
    ("unable to open database file", "the database file cannot be opened or created"),
    ("permission denied", "permission denied"),
    ("authentication failed", "the login was refused"),
    ("no password supplied", "the login was refused"),
    ("does not exist", "the database or the role does not exist"),  # refused at connect
    ("database or disk is full", "the database's disk is full"),
    ("no such table", "the database refused the statement"),
    ("no such column", "the database refused the statement"),
    ("has no column", "the database refused the statement"),
    ("syntax error", "the database refused the statement"),
)
_TRANSIENT_TEXT = (
    ("database is locked", "the database is locked"),
    ("busy", "the database is busy"),
    ("connection", "the connection to the database failed"),
    ("server closed", "the connection to the database failed"),
    ("terminating", "the database ended the session"),
    ("timeout", "a timeout"),
    ("timed out", "a timeout"),
    ("disk i/o error", "an I/O error"),
)


def _is_dbapi_error(e: BaseException) -> bool:
    """A DB-API 2 error (PEP 249): its class derives from one named ``DatabaseError`` or
    ``InterfaceError`` (sqlite3, psycopg, adbc)."""
    names = {c.__name__ for c in type(e).__mro__}
    return "DatabaseError" in names or "InterfaceError" in names


def _database(e: BaseException) -> ErrorVerdict:
    orig = getattr(e, "orig", None) or e
    code = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    if code:
        if code in _PERMANENT_SQLSTATES:
            return ErrorVerdict(False, _PERMANENT_SQLSTATES[code])
        if code.startswith("28"):
            return ErrorVerdict(False, "the login was refused")
        if code in _TRANSIENT_SQLSTATES:
            return ErrorVerdict(True, _TRANSIENT_SQLSTATES[code])
        if code[:2] in _TRANSIENT_SQLSTATE_CLASSES:
            return ErrorVerdict(True, _TRANSIENT_SQLSTATE_CLASSES[code[:2]])
        return ErrorVerdict(False, f"the database refused the statement (SQLSTATE {code})")
    text = str(orig).lower()
    for needle, why in _PERMANENT_TEXT:
        if needle in text:
            return ErrorVerdict(False, why)
    for needle, why in _TRANSIENT_TEXT:
        if needle in text:
            return ErrorVerdict(True, why)
    names = {c.__name__ for c in type(e).__mro__} | {c.__name__ for c in type(orig).__mro__}
    if "OperationalError" in names or "InterfaceError" in names:
        return ErrorVerdict(True, "the database could not be reached or was busy")
    return ErrorVerdict(False, "the database refused the statement")


# -- S3 (boto3/botocore) --------------------------------------------------------------------
def _aws(e: BaseException) -> ErrorVerdict:
    from botocore import exceptions as bx
    from botocore.retries import standard

    if isinstance(e, bx.ClientError):
        response = getattr(e, "response", None) or {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = str((response.get("Error") or {}).get("Code") or "")

        class _Http:
            status_code = status

        ctx = standard.RetryContext(
            attempt_number=1,
            parsed_response=response,
            http_response=_Http() if status is not None else None,
            caught_exception=None,
        )
        if standard.ThrottledRetryableChecker().is_retryable(ctx):
            return ErrorVerdict(True, f"S3 throttled the request ({code})")
        if standard.TransientRetryableChecker().is_retryable(ctx):
            return ErrorVerdict(True, f"S3 failed to answer ({code or status})")
        return ErrorVerdict(False, f"S3 refused the request ({code or status})")
    ctx = standard.RetryContext(attempt_number=1, caught_exception=e)
    if standard.TransientRetryableChecker().is_retryable(ctx):
        return ErrorVerdict(True, "S3 could not be reached")
    return ErrorVerdict(False, f"the S3 client failed ({type(e).__name__})")


# -- Kafka (confluent-kafka) ----------------------------------------------------------------
_KAFKA_TRANSIENT = (
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_TIMED_OUT",
    "_MSG_TIMED_OUT",
    "_RESOLVE",
    "_WAIT_COORD",
    "_TIMED_OUT_QUEUE",
    "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "CONCURRENT_TRANSACTIONS",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "BROKER_NOT_AVAILABLE",
    "THROTTLING_QUOTA_EXCEEDED",
)


def _kafka(e: BaseException) -> ErrorVerdict | None:
    from confluent_kafka import KafkaError

    err = e if isinstance(e, KafkaError) else (e.args[0] if e.args else None)
    if not isinstance(err, KafkaError):
        return None
    name = err.name()
    if err.fatal():
        return ErrorVerdict(False, f"Kafka: fatal error {name}")
    if err.retriable() or name in _KAFKA_TRANSIENT:
        return ErrorVerdict(True, f"Kafka: {name}")
    return ErrorVerdict(False, f"Kafka refused the request ({name})")


# -- Iceberg (pyiceberg) --------------------------------------------------------------------
_ICEBERG_TRANSIENT = {
    "CommitFailedException": "another writer committed first (retried from the new snapshot)",
    "CommitStateUnknownException": "the catalog's answer to a commit was lost",
    "ServiceUnavailableError": "the catalog is unavailable",
    "ServerError": "the catalog failed (5xx)",
    "TooManyRequestsError": "the catalog throttled the request",
    "WaitingForLockException": "the table's lock is held",
}


def _iceberg(e: BaseException) -> ErrorVerdict:
    for cls in type(e).__mro__:
        if cls.__name__ in _ICEBERG_TRANSIENT:
            return ErrorVerdict(True, _ICEBERG_TRANSIENT[cls.__name__])
    return ErrorVerdict(False, f"the Iceberg catalog refused ({type(e).__name__})")


def _http_client(e: BaseException) -> ErrorVerdict | None:
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"ConnectionError", "Timeout", "ProtocolError", "NewConnectionError"}:
        return ErrorVerdict(True, "the server could not be reached")
    return None


# -- the operating system ------------------------------------------------------------------
_OS_TRANSIENT = {
    errno.EAGAIN,
    errno.EBUSY,
    errno.EINTR,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EPIPE,
    errno.ESTALE,
}


def _os(e: OSError) -> ErrorVerdict:
    if isinstance(e, ConnectionError | TimeoutError | InterruptedError | BlockingIOError):
        return ErrorVerdict(True, f"{type(e).__name__}")
    if e.errno in _OS_TRANSIENT:
        return ErrorVerdict(True, errno.errorcode.get(e.errno, str(e.errno)))
    code = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    return ErrorVerdict(False, code or type(e).__name__)
