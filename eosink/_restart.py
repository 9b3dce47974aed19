"""Restarting a stream that failed on a transient error: the policy and its two rules.

* :func:`stream_failure_verdict`: whether the error that stopped a streaming query may pass
  on a restart (eosink's own errors by their ``transient`` flag, Spark's own passing failures
  by their text, the rest by the one transient-error rule, :func:`eosink.util.classify_error`);
* :func:`restart_rule`: whether the policy allows one more restart now, and after what delay.

Both are pure: :class:`eosink.StreamingHandle` applies them.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ._transient import ErrorVerdict, classify_error
from .errors import ConfigError, EosinkError

__all__ = ["RestartDecision", "RestartPolicy", "restart_rule", "stream_failure_verdict"]


@dataclass(frozen=True)
class RestartPolicy:
    """How ``eosink.run`` restarts a stream that failed on a transient error (Flink's
    failure-rate strategy): at most ``max_failures`` restarts within any ``interval_s``
    seconds, the first after ``delay_s``, each next one after twice the delay before, up to
    ``max_delay_s``. A restart starts the query again from its checkpoint, which is exactly
    once whatever the failure left behind.

    Errors that a restart cannot fix are never retried: options and identity
    (``ConfigError``, ``SinkIdentityError``), another driver that took the sink over
    (``FencedError``), an epoch the sink refused, a bug in the pipeline's own code.

    Attributes:
        max_failures: restarts allowed within ``interval_s`` (0: never restart).
        interval_s: the window of ``max_failures``, in seconds.
        delay_s: seconds before the first restart.
        max_delay_s: the longest delay between restarts.
    """

    max_failures: int = 3
    interval_s: float = 600.0
    delay_s: float = 5.0
    max_delay_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_failures, int) or self.max_failures < 0:
            raise ConfigError(f"RestartPolicy.max_failures must be >= 0, not {self.max_failures!r}")
        for name in ("interval_s", "delay_s", "max_delay_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or v < 0:
                raise ConfigError(f"RestartPolicy.{name} must be a number >= 0, not {v!r}")


NO_RESTART = RestartPolicy(max_failures=0)


@dataclass(frozen=True)
class RestartDecision:
    """What :func:`restart_rule` says: restart after ``delay_s``, or not, and why."""

    restart: bool
    delay_s: float
    why: str


def restart_rule(
    verdict: ErrorVerdict, failures: Sequence[float], now: float, policy: RestartPolicy
) -> RestartDecision:
    """Whether a stream that failed with ``verdict`` at ``now`` restarts.

    Args:
        verdict: the failure's (:func:`stream_failure_verdict`).
        failures: the times of the earlier restarts of this stream.
        now: the time of this failure.
        policy: the stream's policy.
    """
    if not verdict.transient:
        return RestartDecision(False, 0.0, f"not transient ({verdict.why})")
    recent = [t for t in failures if now - t < policy.interval_s]
    if len(recent) >= policy.max_failures:
        return RestartDecision(
            False,
            0.0,
            f"{len(recent)} restart(s) within {policy.interval_s:g}s already "
            f"(RestartPolicy.max_failures={policy.max_failures})",
        )
    delay = min(policy.max_delay_s, policy.delay_s * 2 ** len(recent))
    return RestartDecision(True, delay, f"transient ({verdict.why})")


_SPARK_PASSING = (
    ("Python worker failed to connect back", "a Python worker did not start in time"),
    ("Python worker exited unexpectedly", "a Python worker died"),
    ("ExecutorLostFailure", "an executor was lost"),
    ("FetchFailed", "shuffle data of a lost executor"),
    ("Connection reset by peer", "a connection was reset"),
    ("Connection refused", "a connection was refused"),
)
_PY_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Timeout)): ", re.M)


def stream_failure_verdict(exc: BaseException, eosink_error: EosinkError | None) -> ErrorVerdict:
    """Whether the failure that stopped a stream may pass on a restart.

    Args:
        exc: what the query raised (Spark's ``StreamingQueryException``, or an error of the
            stream's async committer).
        eosink_error: the eosink error that stopped it, when there is one (rebuilt from
            Spark's text): its ``transient`` flag decides.
    """
    if eosink_error is not None:
        name = type(eosink_error).__name__
        return ErrorVerdict(bool(eosink_error.transient), name)
    verdict = classify_error(exc)
    if verdict.transient:
        return verdict
    text = str(exc)
    for needle, why in _SPARK_PASSING:
        if needle in text:
            return ErrorVerdict(True, why)
    # A Python exception of the pipeline's foreachBatch, as Spark reports it: its last line.
    names = _PY_ERROR_LINE.findall(text)
    cls = getattr(builtins, names[-1], None) if names else None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return classify_error(cls())
    return verdict
