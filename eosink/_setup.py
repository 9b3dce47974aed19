"""The setup step both front ends share: from what the user gave to a validated sink.

``eosink.run`` (keyword arguments) and ``format("eosink")`` (string options that Spark
lowercased) each turn what they were given into keyword arguments, then call
:func:`prepare_sink`: the sink is looked up, its extra checked, its options validated, the
run's own arguments (``epoch``, ``new_checkpoint``...) checked, the DataFrame's schema
validated, the default staging location resolved and the sink id and meta store URL derived.
All of it before any Spark job, meta store row or file: a mistake is a
:class:`~eosink.errors.ConfigError` (or one of its kind) with nothing written.

:func:`open_runtime` then opens the meta store and starts the sink's coordinator.

What comes out (:class:`SinkSetup`) is picklable: under Spark Connect the streaming front end
sends it to the server, whose Python worker builds its own runtime from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ._metastore import BATCH, MetaStore, default_url
from ._paths import absolute_url
from ._protocol import SinkRuntime
from ._staging import resolve_staging_path
from .errors import ConfigError
from .registry import get_sink
from .sink import SinkPlugin

__all__ = ["MAX_EPOCH", "SinkSetup", "check_epoch", "open_runtime", "prepare_sink"]

MAX_EPOCH = 2**62
"""The largest epoch a run may name: meta stores keep epochs as signed 64-bit integers, and a
stream's epochs are its base plus Spark's batch ids."""

NEW_CHECKPOINT = ("refuse", "continue")


@dataclass(frozen=True)
class SinkSetup:
    """A validated sink of one run: what both front ends need before anything is written.

    Attributes:
        plugin: the sink's plugin.
        options: its validated options (the plugin's pydantic model).
        sink_id: the sink's stable name.
        metastore_url: the meta store's SQLAlchemy URL.
        metastore_retry_s: how long an unreachable meta store is retried.
        epoch: batch runs: the epoch asked for (None: the next free one).
        new_checkpoint: streams: ``refuse`` or ``continue``.
    """

    plugin: SinkPlugin[Any, Any, Any]
    options: Any
    sink_id: str
    metastore_url: str
    metastore_retry_s: float = 60.0
    epoch: int | None = None
    new_checkpoint: str = "refuse"

    def __reduce__(self) -> Any:
        # The plugin is found again by name where the setup is unpickled (a Spark Connect
        # server's Python worker), so that its entry point loads there.
        return (
            _rebuild,
            (
                self.plugin.name,
                self.options,
                self.sink_id,
                self.metastore_url,
                self.metastore_retry_s,
                self.epoch,
                self.new_checkpoint,
            ),
        )


def _rebuild(name: str, *args: Any) -> SinkSetup:
    return SinkSetup(get_sink(name), *args)


def check_epoch(value: Any) -> int | None:
    """``epoch=`` as an int, or None.

    Accepts an int (not a bool) or its decimal string (``format("eosink")`` options are
    strings), from 0 to :data:`MAX_EPOCH`.

    Raises:
        ConfigError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"epoch must be an integer from 0 to {MAX_EPOCH}, not {value!r}")
    if not 0 <= value <= MAX_EPOCH:
        raise ConfigError(f"epoch must be an integer from 0 to {MAX_EPOCH}, not {value}")
    return value


def prepare_sink(
    sink: str,
    sink_options: Mapping[str, Any],
    *,
    streaming: bool,
    sink_id: str | None = None,
    metastore_url: str | None = None,
    metastore_retry_s: float = 60.0,
    checkpoint_location: str | None = None,
    epoch: Any = None,
    new_checkpoint: Any = "refuse",
    schema: pa.Schema | None = None,
    master: Callable[[], str | None] | None = None,
) -> SinkSetup:
    """Validate a run's sink and arguments; derive its id and meta store (nothing written).

    Args:
        sink: the sink's name.
        sink_options: the sink's options, as its options model takes them.
        streaming: a streaming run (``epoch`` is then refused).
        sink_id: the sink's name, or None for the plugin's default for the target.
        metastore_url: None: ``EOSINK_METASTORE_URL``, else ``$EOSINK_HOME/metastore.db``.
        metastore_retry_s: how long an unreachable store is retried (>= 0).
        checkpoint_location: a stream's (qualified) checkpoint location: where a sink's
            default staging goes.
        epoch: a batch run's epoch (:func:`check_epoch`).
        new_checkpoint: ``refuse`` or ``continue``.
        schema: the DataFrame's Arrow schema, checked by the sink's ``validate_schema``.
        master: returns Spark's master (a default staging on a cluster is refused); None
            when it cannot be known.

    Raises:
        UnknownSinkError, MissingExtraError, ConfigError, SchemaMismatchError.
    """
    plugin = get_sink(sink)
    plugin.check_ready()  # a missing extra: MissingExtraError with its pip install, first
    options = plugin.parse_options(dict(sink_options))
    if new_checkpoint not in NEW_CHECKPOINT:
        raise ConfigError(f"new_checkpoint must be 'refuse' or 'continue', not {new_checkpoint!r}")
    if (
        isinstance(metastore_retry_s, bool)
        or not isinstance(metastore_retry_s, (int, float))
        or not metastore_retry_s >= 0
    ):
        raise ConfigError(f"metastore_retry_s must be a number >= 0, not {metastore_retry_s!r}")
    if streaming and epoch is not None:
        raise ConfigError("epoch= is for batch DataFrames; a stream's epoch is its batchId")
    wanted = check_epoch(epoch)
    if schema is not None and plugin.validate_schema is not None:
        plugin.validate_schema(options, schema)
    # A sink's unset staging_path: under the stream's checkpoint, or refused on a cluster.
    options = resolve_staging_path(
        options,
        sink=plugin.name,
        checkpoint_location=checkpoint_location if streaming else None,
        master=master,
    )
    if sink_id is not None and (not isinstance(sink_id, str) or not sink_id.strip()):
        raise ConfigError(f"sink_id must be a non-empty string, not {sink_id!r}")
    return SinkSetup(
        plugin,
        options,
        sink_id or plugin.default_sink_id(options),
        # A relative SQLite file is this process's: the setup may be unpickled elsewhere (a
        # Spark Connect server's worker runs in a temporary folder of its own).
        absolute_url(metastore_url) or default_url(checkpoint_location if streaming else None),
        float(metastore_retry_s),
        wanted,
        str(new_checkpoint),
    )


def open_runtime(
    setup: SinkSetup, lineage: str = BATCH, *, micro_batch: bool = False, retiring: bool = False
) -> SinkRuntime:
    """Open the setup's meta store and start its sink's coordinator (identity checked, the
    sink acquired: older coordinators are fenced). Closes the store if that fails.

    ``micro_batch``: the coordinator of one micro-batch of a ``format("eosink")`` stream (see
    :attr:`SinkRuntime.micro_batch`); ``retiring``: ``eosink retire``'s."""
    store = MetaStore(setup.metastore_url, retry_s=setup.metastore_retry_s)
    runtime = SinkRuntime(setup.plugin, setup.options, setup.sink_id, store)
    runtime.micro_batch = micro_batch
    runtime.retiring = retiring
    try:
        runtime.start()
    except BaseException:
        store.close()
        raise
    runtime.lineage = lineage
    return runtime
