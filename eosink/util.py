"""Helpers for sink plugins: the ones every built-in sink uses, so that a third-party sink
behaves the same way (secrets never printed, durable local files, stable short names).

* :func:`redact` removes secrets from a message before it is raised or logged.
* :func:`is_secret_name` tells whether a setting's name looks like a credential.
* :func:`fsync_path` makes a local file, or the names in a directory, durable.
* :func:`sink_key` is a short, stable name of a sink id for file names, transactional ids
  and marker keys.
* :func:`classify_error` says whether an error of a database, S3, Kafka, an Iceberg catalog
  or the operating system may pass on a retry (the rule the core's commit retry uses).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ._transient import ErrorVerdict, classify_error, is_transient
from .errors import SinkError

__all__ = [
    "ErrorVerdict",
    "abandon_hint",
    "classify_error",
    "fsync_path",
    "is_secret_name",
    "is_transient",
    "marker_from_property",
    "marker_property",
    "redact",
    "session_conf",
    "sink_key",
    "write_file_atomic",
]

_SECRET_NAME = re.compile(
    r"secret|passw|pwd|token|credential|(^|[._-])key($|[._-])|auth|private|pem|jaas", re.I
)
_MIN_SECRET_LEN = 4
"""Shorter values are not replaced in messages (they would mangle ordinary words)."""


def is_secret_name(name: str) -> bool:
    """Whether a setting named ``name`` may hold a credential (``password``,
    ``sasl.password``, ``s3.secret-access-key``, ``token``, ``ssl.key.pem``, ``key``...)."""
    return bool(_SECRET_NAME.search(name))


def redact(text: str, settings: Mapping[str, Any] | None = None) -> str:
    """``text`` without the secrets of ``settings``.

    Replaced by ``***``: the values (strings of 4 characters or more) of settings whose
    name :func:`is_secret_name`, and the password of any URL among the values (as written
    and percent-decoded); also the password of any ``scheme://user:password@`` URL written
    in ``text`` itself. Apply it to every message that may quote a setting, a URL or a
    client library's error before raising or logging it.
    """
    for k, v in (settings or {}).items():
        if not isinstance(v, str) or not v:
            continue
        if len(v) >= _MIN_SECRET_LEN and is_secret_name(str(k)):
            text = text.replace(v, "***")
        if "://" in v and "@" in v:
            try:
                pw = urlsplit(v).password
            except ValueError:
                pw = None
            if pw:
                text = text.replace(pw, "***").replace(unquote(pw), "***")
    return _URL_PASSWORD.sub(r"\1***@", text)


_URL_PASSWORD = re.compile(r"(://[^/:@\s]*:)[^/@\s]+@")


def fsync_path(path: str | Path) -> None:
    """fsync a local file, or a directory (the names created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(
    path: str | Path, data: bytes, *, fsync: bool = True, suffix: str = ".tmp"
) -> None:
    """Replace the local file ``path`` with ``data`` by rename: a reader sees the old file
    or the new one, never a part of it. The bytes go to ``.<name>.<8 hex digits><suffix>``
    beside it first (its directory is made if missing). With ``fsync`` the file is synced
    before the rename and its directory after it: once this returns, the new content
    survives a crash of the machine."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{suffix}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_path(path.parent)


@contextmanager
def session_conf(spark: Any, conf: Mapping[str, str]) -> Iterator[None]:
    """Set the SparkSession's ``conf`` for the block, and restore the values it had after
    it (unset what was unset): for a native writer's Parquet settings around its write
    (``with session_conf(df.sparkSession, {...}): df.write.parquet(...)``)."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def sink_key(sink_id: str) -> str:
    """16 hex digits naming the sink (the first 64 bits of the SHA-1 of ``sink_id``):
    stable across versions, so names built from it are found again by later runs."""
    return hashlib.sha1(sink_id.encode()).hexdigest()[:16]


def marker_property(marker: Mapping[str, Any]) -> str:
    """A :class:`~eosink.TargetMarker` marker as the text a plugin stores in its target (a
    table property): compact, sorted JSON, without ``last_epoch``, which the target keeps in
    a record of its own that each commit raises."""
    return json.dumps(
        {k: v for k, v in marker.items() if k != "last_epoch"},
        separators=(",", ":"),
        sort_keys=True,
    )


def marker_from_property(raw: str | None, last_epoch: int, where: str) -> dict[str, Any]:
    """The marker :func:`marker_property` stored (``raw``; None: none stored), with the
    target's ``last_epoch``.

    Raises:
        SinkError: ``raw`` is not a JSON object; the message starts with ``where`` (which
            table, which property).
    """
    marker: dict[str, Any] = {}
    if raw is not None:
        try:
            marker = dict(json.loads(raw))
        except (ValueError, TypeError):
            raise SinkError(
                f"{where} is not an eosink marker (not a JSON object): {raw[:200]!r}"
            ) from None
    marker["last_epoch"] = last_epoch
    return marker


def abandon_hint(sink_id: str | None = None, epoch: int | None = None) -> str:
    """The way out of an epoch whose data is gone (its staged files deleted while it was
    PENDING: a cleanup job, a lifecycle rule), for the end of a plugin's error message:
    the ``eosink abandon`` command that records the loss, so that the sink moves on.

    Args:
        sink_id: the sink's id (shown in ``eosink status``), when the caller knows it.
        epoch: the epoch, when the caller knows it.
    """
    sid = f"'{sink_id}'" if sink_id else "SINK_ID"
    ep = str(epoch) if epoch is not None else "N"
    return (
        "The epoch's rows are lost: record the loss with `eosink abandon --sink-id "
        f"{sid} --epoch {ep} --reason '...' --accept-data-loss` (stop the sink's jobs "
        "first), then run the query again (docs/cli.md, runbook)"
    )
