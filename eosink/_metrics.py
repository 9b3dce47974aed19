"""eosink's metrics, through OpenTelemetry's metrics API.

The API alone is a dependency of eosink: every instrument here is a no-op until the process
installs an OpenTelemetry SDK ``MeterProvider`` (with any exporter: OTLP, Prometheus...).
:func:`eosink.metrics.serve_prometheus` installs one with a Prometheus endpoint
(``eosink[metrics]``). Names follow OpenTelemetry's conventions (dotted, the unit apart,
counters without ``_total``); every figure carries the sink's id and kind as
``eosink.sink.id`` and ``eosink.sink.kind``. docs/metrics.md lists them.

Two kinds of figures:

* **events** of the driver that runs the protocol (epochs ended, commit duration, visibility
  lag, retries, rows and bytes): recorded where they happen, in this process;
* **state** (PENDING epochs and the oldest one's age, the heartbeat's age): observed when the
  exporter collects, from what this process's runtimes hold. ``eosink metrics serve`` observes
  the same state from the meta store, in a process that outlives the driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import metrics as otel

SINK_ID = "eosink.sink.id"
SINK_KIND = "eosink.sink.kind"
OUTCOME = "eosink.epoch.outcome"
ERROR_TYPE = "error.type"
"""OpenTelemetry's semantic-convention attribute for the class of an error."""

COMMITTED = "committed"
ABORTED = "aborted"
ABANDONED = "abandoned"

_LOCK = threading.Lock()
_PENDING: dict[tuple[str, str], dict[int, float]] = {}
"""(sink id, kind) -> {epoch: PENDING since}: the PENDING epochs of this process's runtimes."""
_BEATS: dict[tuple[str, str], float] = {}
"""(sink id, kind) -> the time of the runtime's last heartbeat in the meta store."""
_LAST_COMMIT: dict[tuple[str, str], float] = {}
"""(sink id, kind) -> when its last epoch was committed."""


def _attrs(sink_id: str, kind: str, **more: str) -> dict[str, str]:
    return {SINK_ID: sink_id, SINK_KIND: kind, **more}


def _pending_count(_: Any) -> Iterator[otel.Observation]:
    with _LOCK:
        items = [(k, len(v)) for k, v in _PENDING.items()]
    for (sink_id, kind), n in items:
        yield otel.Observation(n, _attrs(sink_id, kind))


def _pending_age(_: Any) -> Iterator[otel.Observation]:
    now = time.time()
    with _LOCK:
        items = [(k, min(v.values(), default=now)) for k, v in _PENDING.items()]
    for (sink_id, kind), since in items:
        yield otel.Observation(max(0.0, now - since), _attrs(sink_id, kind))


def _ages(of: dict[tuple[str, str], float]) -> Any:
    def observe(_: Any) -> Iterator[otel.Observation]:
        now = time.time()
        with _LOCK:
            items = list(of.items())
        for (sink_id, kind), at in items:
            yield otel.Observation(max(0.0, now - at), _attrs(sink_id, kind))

    return observe


_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_ROWS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
_BYTES = tuple(float(4**k * 1024) for k in range(0, 12))  # 1 KiB ... 4 GiB

_METER = otel.get_meter("eosink")
EPOCHS = _METER.create_counter(
    "eosink.epochs",
    unit="{epoch}",
    description="Epochs that ended, by outcome: committed, aborted (nothing visible), "
    "abandoned (recorded as lost by `eosink abandon`)",
)
COMMIT_DURATION = _METER.create_histogram(
    "eosink.commit.duration",
    unit="s",
    description="Phase 2 of an epoch: the sink's commit, with its retries, and the COMMITTED mark",
    explicit_bucket_boundaries_advisory=_SECONDS,
)
VISIBILITY_LAG = _METER.create_histogram(
    "eosink.visibility.lag",
    unit="s",
    description="From the end of an epoch's data (its micro-batch written) to its commit "
    "being visible at the target",
    explicit_bucket_boundaries_advisory=_SECONDS,
)
RETRIES = _METER.create_counter(
    "eosink.commit.retries",
    unit="{retry}",
    description="Commits retried after a transient error, by the error's class (error.type)",
)
BACKPRESSURE = _METER.create_counter(
    "eosink.backpressure.time",
    unit="s",
    description="Seconds micro-batches waited for commits before writing (max_pending_epochs "
    "reached: the target is down or slower than the stream)",
)
RESTARTS = _METER.create_counter(
    "eosink.stream.restarts",
    unit="{restart}",
    description="Streaming queries started again from their checkpoint after a transient "
    "failure, by its reason",
)
ROWS = _METER.create_histogram(
    "eosink.epoch.rows",
    unit="{row}",
    description="Rows an epoch committed",
    explicit_bucket_boundaries_advisory=_ROWS,
)
SIZE = _METER.create_histogram(
    "eosink.epoch.size",
    unit="By",
    description="Bytes of the files an epoch committed",
    explicit_bucket_boundaries_advisory=_BYTES,
)
_METER.create_observable_gauge(
    "eosink.epochs.pending",
    callbacks=[_pending_count],
    unit="{epoch}",
    description="Epochs PENDING: phase 1 persisted, the commit not done yet",
)
_METER.create_observable_gauge(
    "eosink.epochs.pending.oldest_age",
    callbacks=[_pending_age],
    unit="s",
    description="Age of the oldest PENDING epoch (0 when none is)",
)
_METER.create_observable_gauge(
    "eosink.heartbeat.age",
    callbacks=[_ages(_BEATS)],
    unit="s",
    description="Seconds since the sink's coordinator last wrote its heartbeat",
)
_METER.create_observable_gauge(
    "eosink.last_commit.age",
    callbacks=[_ages(_LAST_COMMIT)],
    unit="s",
    description="Seconds since the sink's last epoch was committed",
)


def epoch_pending(sink_id: str, kind: str, epoch: int, since: float | None = None) -> None:
    """``epoch`` of the sink is PENDING (its committable persisted) since ``since``."""
    with _LOCK:
        _PENDING.setdefault((sink_id, kind), {})[epoch] = time.time() if since is None else since


def epoch_ended(
    sink_id: str,
    kind: str,
    epoch: int,
    outcome: str,
    *,
    figures: Any = None,
) -> None:
    """``epoch`` ended (``outcome``: committed, aborted or abandoned). For a committed epoch,
    ``figures`` (its :class:`EpochFigures`) gives the duration, lag, rows and bytes."""
    with _LOCK:
        _PENDING.get((sink_id, kind), {}).pop(epoch, None)
        if outcome == COMMITTED:
            _LAST_COMMIT[(sink_id, kind)] = time.time()
    attrs = _attrs(sink_id, kind)
    EPOCHS.add(1, _attrs(sink_id, kind, **{OUTCOME: outcome}))
    if figures is not None and outcome == COMMITTED:
        COMMIT_DURATION.record(figures.commit_ms / 1000.0, attrs)
        if figures.batch_end_at:
            VISIBILITY_LAG.record(figures.visibility_lag_s, attrs)
        ROWS.record(figures.rows, attrs)
        SIZE.record(figures.bytes, attrs)


def commit_retried(sink_id: str, kind: str, exc: BaseException | None) -> None:
    """The sink's commit failed with ``exc``, which the transient-error rule let retry (None:
    the plugin's ``commit`` returned ``CommitOutcome.retry_later``)."""
    error_type = "retry_later" if exc is None else type(exc).__name__
    RETRIES.add(1, _attrs(sink_id, kind, **{ERROR_TYPE: error_type}))


def backpressure(sink_id: str, kind: str, seconds: float) -> None:
    """A micro-batch of the sink waited ``seconds`` for commits (``max_pending_epochs``)."""
    BACKPRESSURE.add(seconds, _attrs(sink_id, kind))


def stream_restarted(sink_id: str, kind: str, why: str) -> None:
    """The sink's stream was started again after a transient failure (``why``)."""
    RESTARTS.add(1, _attrs(sink_id, kind, **{"eosink.restart.reason": why}))


def heartbeat(sink_id: str, kind: str) -> None:
    """The sink's coordinator in this process recorded its heartbeat, now."""
    with _LOCK:
        _BEATS[(sink_id, kind)] = time.time()
        _PENDING.setdefault((sink_id, kind), {})  # a running sink shows 0 PENDING epochs


def runtime_closed(sink_id: str, kind: str) -> None:
    """The runtime of the sink in this process ended: its state is no longer this process's
    to report (``eosink metrics serve`` reports it from the meta store)."""
    with _LOCK:
        _PENDING.pop((sink_id, kind), None)
        _BEATS.pop((sink_id, kind), None)
        _LAST_COMMIT.pop((sink_id, kind), None)


def observed(
    sink_id: str,
    kind: str,
    *,
    pending: dict[int, float],
    heartbeat_at: float | None,
    last_commit_at: float | None,
) -> None:
    """The sink's state as read from its meta store (``eosink metrics serve``)."""
    key = (sink_id, kind)
    with _LOCK:
        _PENDING[key] = dict(pending)
        for table, at in ((_BEATS, heartbeat_at), (_LAST_COMMIT, last_commit_at)):
            if at is None:
                table.pop(key, None)
            else:
                table[key] = at
