"""eosink's metrics: what they are, and a Prometheus endpoint for them.

eosink records its figures through OpenTelemetry's metrics API (a dependency of eosink). They
cost nothing and go nowhere until the process installs an OpenTelemetry SDK: either your own
(any exporter: OTLP to a collector, Prometheus, the console), or the one
:func:`serve_prometheus` installs, with the ``eosink[metrics]`` extra. docs/metrics.md lists
every figure.

* In the driver: ``eosink.metrics.serve_prometheus(9464)`` before ``eosink.run``.
* Outside it, for alerts that must fire when the driver is dead (or runs inside a Spark
  Connect server): ``eosink metrics serve --metastore-url URL`` serves the state the meta store
  holds (PENDING epochs and their age, heartbeat age, time since the last commit, epochs
  committed and abandoned since it started), see :func:`serve_metastore`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from . import _metrics
from .errors import ConfigError, MissingExtraError

__all__ = ["METRICS", "serve_metastore", "serve_prometheus"]

log = logging.getLogger("eosink")

METRICS = {
    "eosink.epochs": "counter, {epoch}: epochs that ended, by eosink.epoch.outcome "
    "(committed, aborted, abandoned)",
    "eosink.commit.duration": "histogram, s: an epoch's phase 2 (commit with retries, mark)",
    "eosink.visibility.lag": "histogram, s: end of an epoch's data to its commit visible",
    "eosink.commit.retries": "counter, {retry}: commits retried, by error.type",
    "eosink.backpressure.time": "counter, s: micro-batches waiting for commits "
    "(max_pending_epochs reached)",
    "eosink.stream.restarts": "counter, {restart}: streams started again after a transient "
    "failure, by eosink.restart.reason",
    "eosink.epoch.rows": "histogram, {row}: rows an epoch committed",
    "eosink.epoch.size": "histogram, By: bytes an epoch committed",
    "eosink.epochs.pending": "gauge, {epoch}: epochs PENDING",
    "eosink.epochs.pending.oldest_age": "gauge, s: age of the oldest PENDING epoch",
    "eosink.heartbeat.age": "gauge, s: since the coordinator's last heartbeat",
    "eosink.last_commit.age": "gauge, s: since the sink's last commit",
}
"""Every instrument eosink records: its name (OpenTelemetry's), kind, unit and meaning. Each
carries ``eosink.sink.id`` and ``eosink.sink.kind``; a Prometheus endpoint shows the names
with ``_`` for ``.``, the unit appended and ``_total`` on counters."""


def _sdk() -> tuple[Any, Any, Any]:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise MissingExtraError(
            getattr(exc, "name", None) or "opentelemetry.sdk", "metrics", "a Prometheus endpoint"
        ) from None
    return MeterProvider, PrometheusMetricReader, start_http_server


def serve_prometheus(port: int = 9464, addr: str = "0.0.0.0") -> int:
    """Install an OpenTelemetry SDK whose figures a Prometheus endpoint serves, and start
    the endpoint (``http://addr:port/metrics``, a daemon thread of this process).

    Call it once per process, before the runs whose figures it should serve.

    Args:
        port: the TCP port (0: any free one).
        addr: the address to listen on.

    Returns:
        The port the endpoint listens on.

    Raises:
        MissingExtraError: ``eosink[metrics]`` is not installed.
        ConfigError: this process already has an OpenTelemetry SDK: add a Prometheus reader
            to it instead (its exporter serves eosink's figures with the rest).
    """
    from opentelemetry import metrics as otel

    provider_cls, reader_cls, start_http_server = _sdk()
    if isinstance(otel.get_meter_provider(), provider_cls):
        raise ConfigError(
            "this process already has an OpenTelemetry MeterProvider: eosink's figures go to "
            "its exporters; add opentelemetry.exporter.prometheus.PrometheusMetricReader to it "
            "instead of calling serve_prometheus"
        )
    server, _thread = start_http_server(port, addr)
    otel.set_meter_provider(provider_cls(metric_readers=[reader_cls()]))
    actual = int(server.server_port)
    log.info("eosink metrics: Prometheus endpoint on http://%s:%d/metrics", addr, actual)
    return actual


class _MetastoreWatch:
    """Reads the meta store's sinks every ``every`` seconds into eosink's state figures, and
    counts the epochs committed and abandoned since the previous read."""

    def __init__(self, url: str | None, every: float) -> None:
        from ._cli.stores import open_store

        self.store = open_store(url)
        self.every = every
        self._seen: dict[str, tuple[int, int]] = {}
        self.port = 0
        """The endpoint's port, once it serves."""
        self._stop = threading.Event()

    def read(self) -> int:
        """One read of every sink; the number of sinks."""
        from ._metastore import COMMITTED, DROPPED_OPEN_FILE, PENDING

        sinks = self.store.sinks()
        for s in sinks:
            pending = {
                r.epoch: r.created_at or time.time()
                for r in self.store.epochs(s.sink_id, (PENDING,))
            }
            last = self.store.epochs(s.sink_id, (COMMITTED,), limit=1)
            _metrics.observed(
                s.sink_id,
                s.plugin,
                pending=pending,
                heartbeat_at=s.heartbeat_at,
                last_commit_at=last[-1].committed_at if last else None,
            )
            lost = sum(1 for x in self.store.losses(s.sink_id) if x.origin != DROPPED_OPEN_FILE)
            was = self._seen.get(s.sink_id)
            self._seen[s.sink_id] = (s.committed_epochs, lost)
            if was is not None:
                attrs = {_metrics.SINK_ID: s.sink_id, _metrics.SINK_KIND: s.plugin}
                for outcome, now, before in (
                    (_metrics.COMMITTED, s.committed_epochs, was[0]),
                    (_metrics.ABANDONED, lost, was[1]),
                ):
                    if now > before:
                        _metrics.EPOCHS.add(now - before, {**attrs, _metrics.OUTCOME: outcome})
        return len(sinks)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.read()
            except Exception:
                log.warning("eosink metrics: cannot read the meta store now", exc_info=True)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self.store.close()


def serve_metastore(
    url: str | None, port: int = 9464, addr: str = "0.0.0.0", every: float = 15.0
) -> _MetastoreWatch:
    """Serve, on a Prometheus endpoint, the state of every sink of the meta store at ``url``
    (None: ``EOSINK_METASTORE_URL``, else ``~/.eosink``): what ``eosink metrics serve``
    runs. The figures are read every ``every`` seconds; nothing is written to the store.

    Returns the watcher (its ``run()`` loops until ``stop()``); the endpoint is started.

    Raises:
        MetaStoreError: no meta store at ``url``, or it cannot be read.
        MissingExtraError: ``eosink[metrics]`` is not installed.
    """
    watch = _MetastoreWatch(url, every)
    try:
        watch.read()  # a meta store that cannot be read fails here, before serving anything
        watch.port = serve_prometheus(port, addr)
    except BaseException:
        watch.stop()
        raise
    return watch
