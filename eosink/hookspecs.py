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
hookimpl = pluggy.HookimplMarker("eosink")

__all__ = ["hookimpl", "hookspec"]


@hookspec
def eosink_sinks() -> list[SinkPlugin[Any, Any, Any]]:  # type: ignore[empty-body]
    """Return the sinks this plugin provides.

    Called once when eosink loads its plugins. Import heavy dependencies lazily, inside the
    writer and coordinator factories, so that listing plugins stays cheap; raise
    :class:`eosink.MissingExtraError` from a factory when an optional dependency is missing.
    """


@hookspec
def eosink_epoch_committed(sink_id: str, epoch: int, figures: dict[str, Any]) -> None:
    """Called on the driver after an epoch became visible and was marked COMMITTED.

    Args:
        sink_id: the sink.
        epoch: the epoch.
        figures: ``rows``, ``files``, ``bytes``, ``pre_commit_ms``, ``commit_ms`` and
            ``visibility_lag_s`` (commit visible minus batch end). Use it to export metrics.
    """
