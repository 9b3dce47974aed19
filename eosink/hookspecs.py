"""pluggy hook specifications of eosink. Plugins implement them with :data:`eosink.hookimpl`.

A plugin module registered in the ``eosink`` entry-point group::

    [project.entry-points.eosink]
    mysink = "my_package.eosink_plugin"

implements any of these hooks as module-level functions decorated with ``@eosink.hookimpl``.
"""

from __future__ import annotations

from typing import Any

import pluggy

from .sink import SinkPlugin

hookspec = pluggy.HookspecMarker("eosink")
"""Marks the hook specifications below (eosink's own use)."""
hookimpl = pluggy.HookimplMarker("eosink")
"""Decorates a plugin's implementation of a hook: ``@eosink.hookimpl``."""

__all__ = ["hookimpl", "hookspec"]


@hookspec
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:  # type: ignore[empty-body]
    """Return the sinks this plugin provides.

    Called every time eosink looks sinks up (``eosink.run``, ``eosink plugins``,
    :func:`eosink.get_sink`, :func:`eosink.list_sinks`, the ``format("eosink")`` data source),
    so keep it cheap and free of side effects. Import heavy dependencies lazily, inside the
    writer and coordinator factories, and declare them in ``SinkPlugin.requires``; raise
    :class:`eosink.MissingExtraError` from a factory when an optional dependency is missing.
    Two packages providing the same sink name are refused (``ConfigError``).
    """


@hookspec
def eosink_epoch_committed(sink_id: str, epoch: int, figures: dict[str, Any]) -> None:
    """Called on the driver after an epoch became visible and was marked COMMITTED.

    Also for epochs that recovery finished; never for skipped replays. It runs on eosink's
    committer thread in ``after_checkpoint`` mode, before the next epoch's commit: keep it
    quick and thread-safe. An exception is logged at ERROR and ignored (the epoch stays
    committed), but hook implementations not yet called do not see that epoch.

    Args:
        sink_id: the sink.
        epoch: the epoch.
        figures: ``epoch``, ``rows``, ``files``, ``bytes``, ``write_s``, ``pre_commit_ms``,
            ``persist_ms``, ``commit_ms``, ``batch_end_at``, ``committed_at``, ``skipped``,
            ``writer`` (``spark``: the native path, or ``python``) and ``visibility_lag_s``
            (commit visible minus batch end). Use it to export metrics.
    """
