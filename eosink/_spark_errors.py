"""Spark's errors turned back into eosink's: what a ``format("eosink")`` write or a writer task
raised reaches the user as the eosink error itself.

Errors. Spark calls a Python data source in worker processes and reports what it raises as an
``AnalysisException`` (``[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source
writer: Traceback ...``), for a stream wrapped once more in the ``StreamingQueryException`` of
the first micro-batch; the driver's Python never runs eosink code before that (``save()`` and
``start()`` are pyspark's), so options cannot be validated there first, and no Spark setting
removes the wrapping (``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled`` only
drops pyspark's frames, ``...hideTraceback.enabled`` the traceback, never the prefix).
``eosink._session.prepare_session`` therefore converts on the driver instead: it wraps pyspark's
``convert_exception`` (the function through which every JVM exception becomes a Python one),
and when a Spark error is a ``PYTHON_DATA_SOURCE_ERROR`` whose Python traceback ends with an
eosink error (``eosink.errors.ConfigError: invalid options ...``), directly or as the cause of
a ``StreamingQueryException``, the user gets that eosink error itself: same class, same
message, the worker's frames as its traceback and Spark's context as a note. So is an eosink
error a writer raised in a Spark task (``PYTHON_EXCEPTION``: a value it refuses). A Python
error of the DataFrame's own tasks (a UDF that raises) in a ``format("eosink")`` write
becomes a :class:`~eosink.errors.SinkError` whose first line is that error, as
:func:`eosink.run` gives it (Spark's message puts it under its traceback): for a stream from
the plan in its ``STREAM_FAILED`` message, for a batch through a wrapper of the classic
``DataFrameWriter.save`` that knows the writer's format. Everything else passes unchanged,
and should pyspark's internals change the wrappers step aside (the Spark exception, which
still contains the eosink message, is raised as before).
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from . import _spark_version, errors
from .errors import EosinkError

log = logging.getLogger("eosink")


_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(r"([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)(?:: |$)")


def _eosink_error_in(text: str) -> EosinkError | None:
    """The eosink error that a Python traceback as Spark reports it ends with, rebuilt.

    ``text`` is a formatted traceback (or, with tracebacks hidden, the exception line alone).
    Its last exception is rebuilt when its class is an :class:`EosinkError` of
    ``eosink.errors`` (or of a module this process has imported); else None.
    """
    start = text.rfind(_TRACEBACK)
    lines = (text[start:] if start >= 0 else text).splitlines()
    i = 1 if start >= 0 else 0
    while i < len(lines) and (not lines[i].strip() or lines[i][0].isspace()):
        i += 1  # the frames: indented
    if i >= len(lines):
        return None
    m = _ERROR_LINE.match(lines[i])
    module = sys.modules.get(m.group(1)) if m else None
    cls = getattr(module, m.group(2), None) if m else None
    if m is None or not (isinstance(cls, type) and issubclass(cls, EosinkError)):
        return None
    message = "\n".join([lines[i][m.end() :], *lines[i + 1 :]]).rstrip()
    err = errors._rebuild(cls, (message,), {})
    for name, value in _attributes(cls, message).items():
        setattr(err, name, value)
    return _worker_frames(err, text)


def _worker_frames(err: EosinkError, text: str) -> EosinkError:
    """``err`` with the frames of the Python traceback in ``text`` (a worker's, as Spark
    reports it) as its traceback, as pyspark does for its own exceptions."""
    start = text.rfind(_TRACEBACK)
    if start >= 0:
        try:
            from pyspark.errors.exceptions.tblib import Traceback

            err = err.with_traceback(Traceback.from_string(text[start:]).as_traceback())
        except Exception:  # a nicety only
            pass
    return err


def _attributes(cls: type[EosinkError], message: str) -> dict[str, Any]:
    """The attributes of the errors that have some, recovered from their message."""
    if issubclass(cls, errors.MissingExtraError):
        m = re.search(r"module '([^']+)'.*pip install '(([^'\[]+)(?:\[([^\]]+)\])?)'", message)
        if m:
            return {
                "name": m.group(1),
                "extra": m.group(4) or m.group(2),
                "install": m.group(2),
                "pip": f"pip install '{m.group(2)}'",
            }
    if issubclass(cls, errors.UnknownSinkError):
        m = re.match(r"unknown sink '([^']*)'; installed sinks: (.*?)\. Run", message)
        if m:
            known = [] if m.group(2) == "(none)" else m.group(2).split(", ")
            return {"name": m.group(1), "known": known}
    return {}


def _eosink_error_of(exc: Any) -> EosinkError | None:
    """The eosink error a converted Spark exception carries, with Spark's context as a note.

    A ``PYTHON_DATA_SOURCE_ERROR`` whose traceback ends with an eosink error, or a
    ``STREAM_FAILED`` caused by one (pyspark converts the cause first, through the same
    wrapper, so the cause is already the eosink error); anything else: None.
    """
    if isinstance(exc, EosinkError):
        return exc
    if not _spark_version.PYTHON_DATA_SOURCES and _NO_EOSINK_SOURCE.search(str(exc)):
        return _spark_version.format_eosink_unsupported()  # Spark 3.5: no Python sources
    condition = _spark_version.condition(exc) or _condition_in_text(exc)
    if condition not in ("PYTHON_DATA_SOURCE_ERROR", "STREAM_FAILED", "PYTHON_EXCEPTION"):
        return None
    get_params = getattr(exc, "getMessageParameters", None)
    params = (get_params() if get_params is not None else None) or {}
    if condition == "PYTHON_EXCEPTION":  # a task's Python error: an eosink writer's?
        return _eosink_error_in(_without_sqlstate(str(params.get("traceback") or exc)))
    if condition == "STREAM_FAILED":
        cause = getattr(exc, "_cause", None)
        err = _eosink_error_of(cause) if cause is not None else None
        if err is None:  # a Spark Connect client's exception: the cause is text only
            err = eosink_error_of_stream(exc)
        if err is None and _python_task_error(cause) and _EOSINK_STREAM.search(str(exc)):
            err = _task_error('format("eosink") stream', cause)
        where = f"the streaming query id={params.get('id')} runId={params.get('runId')} stopped"
    else:  # a Spark Connect 4.1 client's error has no message parameters: its text tells
        err = _eosink_error_in(str(params.get("msg") or _connect_message(exc)))
        where = f'raised in Spark by format("eosink"), {params.get("action")} {params.get("type")}'
    if err is not None:
        _note(err, f"({where}: {condition})")
        # pyspark raises the converted error ``from None``: keep Spark's own for the callers
        # that re-raise it with its cause (StreamingHandle.await_termination).
        err._spark_error = exc  # type: ignore[attr-defined]
    return err


# Spark's error of a format it does not know (on 3.5 an UnknownException: no condition).
_NO_EOSINK_SOURCE = re.compile(r"DATA_SOURCE_NOT_FOUND\]? Failed to find the data source: eosink\b")
# The plan Spark shows in a failed stream's message, when its sink is format("eosink"):
# "WriteToMicroBatchDataSource eosink, ..." from pyspark 4.2 on; 4.0 and 4.1 name a Python
# data source's table by its class ("~WriteToMicroBatchDataSource ...python.PythonTable@1f2e,
# <query id>, [sink=file, path=...], Append"), so there the options tell: eosink's have sink=.
_EOSINK_STREAM = re.compile(
    r"^~?WriteToMicroBatchDataSource(?:V1)? "
    r"(?:eosink\b|\S*\.python\.PythonTable@\w+, [\w-]+, \[(?:[^\]]*, )?sink=)",
    re.M,
)


def _condition_in_text(exc: Any) -> str | None:
    """The condition a pyspark exception's message opens with (``[PYTHON_DATA_SOURCE_ERROR]
    ...``), for a Spark Connect client's exception that does not carry it otherwise."""
    if not hasattr(exc, "getMessageParameters"):  # not a pyspark exception
        return None
    m = re.match(r"\[([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_]+)?\] ", str(exc))
    return m.group(1) if m else None


def _connect_message(exc: Any) -> str:
    """A Spark Connect client's exception text without the server's JVM stack trace and
    SQLSTATE that the client appends."""
    text = str(exc)
    cut = text.find("\n\nJVM stacktrace:")
    return _without_sqlstate(text[:cut] if cut >= 0 else text)


def _without_sqlstate(text: str) -> str:
    return re.sub(r"(\s*SQLSTATE: \w+)+\s*$", "", text).rstrip()


def _python_task_error(exc: Any) -> bool:
    """Whether a converted Spark error is a Python error raised in a task (a Python UDF's,
    or a writer's), whose own line Spark puts under its traceback."""
    condition = _spark_version.condition(exc)
    return condition == "PYTHON_EXCEPTION" and not isinstance(exc, EosinkError)


def _task_error(what: str, exc: Any) -> EosinkError:
    """A write of ``format("eosink")`` that failed in a Spark task with a Python error that
    is not eosink's (a UDF of the DataFrame raised): that error's line first, as
    :func:`eosink.run` gives it, and the task's Python frames as its traceback."""
    err = errors.SinkError(
        f"{what}: writing failed in a Spark task: {_root_cause(exc)} (nothing of the epoch "
        "was committed; the task's frames are this error's traceback)"
    )
    params = exc.getMessageParameters() if hasattr(exc, "getMessageParameters") else None
    text = str((params or {}).get("traceback") or exc)
    return _worker_frames(err, _without_sqlstate(text))


def _writes_eosink(writer: Any) -> bool:
    """Whether a classic ``DataFrameWriter`` writes ``format("eosink")``."""
    try:
        return str(writer._jwrite.source()).lower() == "eosink"  # EosinkDataSource.name()
    except Exception:  # not a classic writer, or its JVM is gone
        return False


def _wrap_save(cls: Any) -> None:
    """Wrap ``DataFrameWriter.save`` once: a ``format("eosink")`` batch write that fails with
    a Python error of a task (a UDF of the DataFrame) raises a :class:`SinkError` whose
    first line is that error (Spark's own message opens with "An exception was thrown from
    the Python worker" and the traceback); every other error passes unchanged."""
    original = getattr(cls, "save", None)
    if original is None or getattr(original, "__eosink__", False):
        return

    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            if not (_python_task_error(exc) and _writes_eosink(self)):
                raise
            err = _task_error('format("eosink")', exc)
            _note(err, '(raised in Spark by format("eosink"), write: PYTHON_EXCEPTION)')
            raise err from exc

    save.__eosink__ = True  # type: ignore[attr-defined]
    save.__wrapped__ = original  # type: ignore[attr-defined]
    save.__doc__ = original.__doc__
    cls.save = save


def _note(err: BaseException, note: str) -> None:
    add_note = getattr(err, "add_note", None)  # Python 3.11+
    if add_note is not None and note not in getattr(err, "__notes__", ()):
        add_note(note)


def _install_error_conversion(connect: bool = False) -> None:
    """Wrap pyspark's ``convert_exception`` once per process (see the module's docstring):
    classic sessions' (``pyspark.errors.exceptions.captured``) and, for a Spark Connect
    client, the one its client module imported (``pyspark.sql.connect.client.core``)."""
    try:
        from pyspark.errors.exceptions import captured
    except ImportError:  # pragma: no cover - pyspark without the classic exception module
        pass
    else:
        _wrap(captured, "convert_exception")
    try:
        from pyspark.sql.readwriter import DataFrameWriter
    except ImportError:  # pragma: no cover - pyspark without the classic writer
        pass
    else:
        _wrap_save(DataFrameWriter)
    if not connect:
        return
    try:
        from pyspark.sql.connect.client import core
    except ImportError:  # the Spark Connect client packages are not installed
        return
    _wrap(core, "convert_exception")


def _wrap(module: Any, name: str) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "__eosink__", False):
        return

    def convert_exception(*args: Any, **kwargs: Any) -> Any:
        converted = original(*args, **kwargs)
        try:
            return _eosink_error_of(converted) or converted
        except Exception:  # never make an error worse
            return converted

    convert_exception.__eosink__ = True  # type: ignore[attr-defined]
    convert_exception.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, name, convert_exception)


def _root_cause(exc: BaseException) -> str:
    """The last ``SomethingError: message`` line of a Spark failure, else its first line."""
    text = str(exc)
    java = re.findall(r"^\s*Caused by: (?:[\w.$]+\.)?(\w+(?:Error|Exception): .+)$", text, re.M)
    if java:  # a JVM failure: its innermost cause says what went wrong
        return str(java[-1])[:500]
    found = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", text, re.M)
    causes = [c for c in found if not c.startswith(("PythonException", "Py4JJavaError"))]
    return causes[-1] if causes else text.strip().splitlines()[0][:300]


def eosink_error_of_stream(exc: BaseException) -> EosinkError | None:
    """The eosink error that stopped a stream, from Spark's ``StreamingQueryException``.

    Spark reports an exception of a ``foreachBatch`` function as text (the Python traceback
    inside ``FOREACH_BATCH_USER_FUNCTION_ERROR``, on classic sessions and over Spark Connect);
    when that traceback ends with an eosink error, the error is rebuilt (same class and
    message, Spark's error as its cause). Anything else: None.
    """
    if isinstance(exc, EosinkError):
        return exc
    text = str(exc)
    for attr in ("desc", "_desc"):
        more = getattr(exc, attr, None)
        if isinstance(more, str) and more not in text:
            text += "\n" + more
    cut = text.find("\n=== Streaming Query ===")
    if cut >= 0:
        text = text[:cut]
    if "Traceback (most recent call last)" not in text:
        return None
    try:  # (Spark Connect appends SQLSTATEs)
        return _eosink_error_in(_without_sqlstate(text))
    except Exception:  # never make an error worse
        return None
