"""Path-like options, made absolute where the user's working directory is known.

A relative path means "relative to where I run this". eosink makes such a value absolute in
the process that runs the user's code, before the options leave it:

* ``eosink.run``: the sink's options model resolves its paths (it runs in the user's process,
  over Spark Connect too), and :func:`absolute_url` the meta store's SQLite URL;
* ``format("eosink")`` over Spark Connect: the options travel to the server as strings, and
  the server's Python worker runs in the Spark session's own temporary folder
  (``.../spark-*/userFiles-*/<session>``, deleted with the session): a relative path
  resolved there loses the output. :func:`absolute_options` rewrites them on the client
  (:func:`eosink.register_datasource` installs it), and :func:`check_no_relative` refuses the
  ones that still reach such a worker relative (a client that did not register eosink).

A value is path-like by its option's name (:data:`CORE_PATH_OPTIONS` and the sink's
:attr:`~eosink.SinkPlugin.path_options`) and is rewritten by its shape: a SQLAlchemy URL
(``sqlite:///db``) gets its SQLite database made absolute, a URI (``s3://``, ``hdfs://``,
``file:///``) and an absolute path are kept, anything else is a path relative to the
working directory (``~`` expanded).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import ConfigError

__all__ = [
    "CORE_PATH_OPTIONS",
    "absolute",
    "absolute_options",
    "absolute_url",
    "check_no_relative",
    "in_session_folder",
    "path_options",
]

CORE_PATH_OPTIONS = ("path", "checkpointLocation", "metastore_url", "staging_path")
"""Options that name a location whatever the sink: the target's ``path``, a stream's
checkpoint, the meta store's URL and a sink's ``staging_path``."""

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_SQLALCHEMY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def path_options(plugin_paths: Iterable[str] = ()) -> frozenset[str]:
    """The lowercased names of the path-like options (the core's and a sink's)."""
    return frozenset(n.lower() for n in (*CORE_PATH_OPTIONS, *plugin_paths))


def _relative_sqlite(value: str) -> str | None:
    """The database path of a SQLite URL when it is relative, else None."""
    if not value.lower().startswith("sqlite") or not _SQLALCHEMY.match(value):
        return None
    from sqlalchemy.engine import make_url

    try:
        db = make_url(value).database or ""
    except Exception:  # not a URL: its own options model reports it
        return None
    if db in ("", ":memory:") or db.startswith("file:") or os.path.isabs(db):
        return None
    return db


def is_relative(value: str) -> bool:
    """Whether ``value`` (a path, a URI or a SQLAlchemy URL) depends on the working
    directory (a ``~`` path does not: it names the user's home)."""
    v = value.strip()
    if not v:
        return False
    if _SQLALCHEMY.match(v):
        return _relative_sqlite(v) is not None
    if v.startswith("file:") and not v.startswith("file:/"):
        return True  # file:out (Hadoop's spelling of a relative local path)
    if _SCHEME.match(v):
        return False
    return not os.path.isabs(os.path.expanduser(v))


def absolute(value: str, cwd: str | None = None) -> str:
    """``value`` independent of the working directory: relative to ``cwd`` (default: this
    process's) when it is relative, ``~`` expanded; URIs, absolute paths and non-SQLite
    URLs unchanged."""
    v = value.strip()
    base = cwd or os.getcwd()
    if _SQLALCHEMY.match(v):
        db = _relative_sqlite(v)
        if db is None:
            return value
        from sqlalchemy.engine import make_url

        url = make_url(v)
        full = os.path.normpath(os.path.join(base, os.path.expanduser(db)))
        return url.set(database=full).render_as_string(hide_password=False)
    if v.startswith("file:") and not v.startswith("file:/"):
        return Path(os.path.normpath(os.path.join(base, v[len("file:") :]))).as_uri()
    if _SCHEME.match(v) or not v:
        return value
    expanded = os.path.expanduser(v)
    return os.path.normpath(os.path.join(base, expanded))


def absolute_url(url: str | None) -> str | None:
    """A meta store URL whose SQLite file does not depend on the working directory."""
    return None if url is None else absolute(url)


def absolute_options(
    options: Mapping[str, str], names: frozenset[str], cwd: str | None = None
) -> dict[str, str]:
    """``options`` with every path-like one (``names``, lowercased) made absolute."""
    return {k: absolute(v, cwd) if k.lower() in names else v for k, v in options.items()}


def in_session_folder() -> bool:
    """Whether this process runs in a Spark session's own temporary folder: a Python worker
    of a Spark Connect server (Spark starts those in ``<userFiles>/<session uuid>`` and
    deletes it with the session; ``SPARK_JOB_ARTIFACT_UUID`` names the session, ``default``
    for a classic session, whose workers run in the driver's working directory)."""
    uuid = os.environ.get("SPARK_JOB_ARTIFACT_UUID", "default")
    if uuid in ("", "default"):
        return False
    try:
        return Path.cwd().name == uuid
    except OSError:  # the folder is gone already
        return True


def check_no_relative(options: Mapping[str, str], names: frozenset[str]) -> None:
    """Refuse path-like options that are relative when this process runs in a Spark
    session's temporary folder (:func:`in_session_folder`).

    Raises:
        ConfigError: naming each such option and its value, and what to do.
    """
    if not in_session_folder():
        return
    bad = [(k, v) for k, v in options.items() if k.lower() in names and is_relative(v)]
    if not bad:
        return
    given = ", ".join(f"{k}={v!r}" for k, v in bad)
    raise ConfigError(
        f'format("eosink"): {given}: a relative path, and this Spark Connect server\'s '
        "Python worker would resolve it against the session's temporary folder "
        f"({os.getcwd()}), which Spark deletes with the session: the output would be lost. "
        "Give an absolute path or a URI (/data/out, file:///data/out, s3://bucket/out), "
        "or register eosink on the client (eosink.spark_session() or "
        "eosink.register_datasource(spark)): it makes relative paths absolute against the "
        "client's working directory"
    )
