"""The restart rules (eosink/_restart.py), exhaustively where they decide; the real restart
of a real stream is tests/test_run.py::test_a_stream_restarts_after_a_transient_failure."""

from __future__ import annotations

import itertools

import pytest

from eosink import ConfigError, RestartPolicy
from eosink._restart import restart_rule, stream_failure_verdict
from eosink._transient import ErrorVerdict
from eosink.errors import (
    CommitFailedError,
    FencedError,
    MetaStoreUnavailableError,
    SinkError,
    SinkIdentityError,
)

T, P = ErrorVerdict(True, "t"), ErrorVerdict(False, "p")


@pytest.mark.parametrize(
    ("transient", "earlier", "max_failures"),
    list(itertools.product([True, False], range(5), range(4))),
)
def test_restart_rule(transient: bool, earlier: int, max_failures: int) -> None:
    """Restart iff transient and fewer than max_failures restarts in the window; earlier
    restarts outside the window do not count; the delay doubles per recent restart, capped."""
    policy = RestartPolicy(max_failures=max_failures, interval_s=100, delay_s=1, max_delay_s=5)
    now = 1000.0
    inside = [now - 10 * (i + 1) for i in range(earlier)]
    outside = [now - 500, now - 101]
    d = restart_rule(T if transient else P, outside + inside, now, policy)
    assert d.restart == (transient and earlier < max_failures), d
    if d.restart:
        assert d.delay_s == min(5, 2**earlier)
    else:
        assert d.delay_s == 0 and d.why


class StreamingQueryException(Exception):
    pass


@pytest.mark.parametrize(
    ("text", "err", "transient"),
    [
        ("org.apache.spark.SparkException: Python worker failed to connect back.", None, True),
        ("Job aborted: ExecutorLostFailure (executor 1 exited)", None, True),
        ("Traceback ...\nConnectionResetError: [Errno 104] reset", None, True),
        ("Traceback ...\nTimeoutError: the catalog did not answer", None, True),
        ("Traceback ...\nValueError: bad row", None, False),
        ("Traceback ...\nZeroDivisionError: division by zero", None, False),
        ("something else", None, False),
        ("", MetaStoreUnavailableError("down"), True),
        ("", CommitFailedError("conflict"), True),
        ("", FencedError("newer coordinator"), False),
        ("", SinkIdentityError("other target"), False),
        ("", ConfigError("bad option"), False),
        ("", SinkError("refused"), False),
        # The eosink error decides, whatever Spark's text around it says.
        ("Python worker failed to connect back", FencedError("newer"), False),
    ],
)
def test_stream_failure_verdict(text: str, err: Exception | None, transient: bool) -> None:
    v = stream_failure_verdict(StreamingQueryException(text), err)  # type: ignore[arg-type]
    assert v.transient is transient, v


@pytest.mark.parametrize(
    "kwargs",
    [{"max_failures": -1}, {"max_failures": 1.5}, {"delay_s": -1}, {"interval_s": "x"}],
)
def test_a_bad_policy_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="RestartPolicy"):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]
