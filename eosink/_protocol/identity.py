"""The identity checks of a sink's start: its sink_id's plugin and target in the meta store,
and the meta store against the target's marker."""

from __future__ import annotations

from typing import Any

from ..errors import SinkIdentityError

__all__ = ["check_identity"]


def check_identity(
    store: Any,
    sid: str,
    existing: Any,
    plugin: str,
    target: str | None,
    marker: dict[str, Any] | None,
) -> tuple[int | None, dict[str, Any] | None]:
    """The start's identity checks (also ``eosink retire --dry-run``'s), from the sink's row
    in ``store`` (``existing``), the plugin's name, the coordinator's target and the target's
    marker. Returns the epoch up to which the store must take the sink over from the marker
    (None: it need not) and the retirement the marker records (None: none).

    Raises:
        SinkIdentityError: the sink_id is bound to another target or plugin, or the meta
            store is behind the target's marker.
    """
    if existing is not None and existing.plugin != plugin:
        raise SinkIdentityError(
            f"sink_id {sid!r} belongs to a {existing.plugin!r} sink in meta store "
            f"{store.url_redacted}; this run is a {plugin!r} sink. "
            "Give this sink its own sink_id="
        )
    if existing is not None and existing.target and target and existing.target != target:
        raise SinkIdentityError(
            f"sink_id {sid!r} is bound to {existing.target} (meta store "
            f"{store.url_redacted}), but this run writes to {target}. A sink_id names "
            "one target, because its committed epochs are recorded against it: pass another "
            "sink_id= for this target, or leave sink_id unset (the default is derived from "
            "the target)"
        )
    known = store.max_epoch(sid) if existing is not None else -1
    marked = int(marker.get("last_epoch", -1)) if marker else -1
    retired = marker.get("retired") if marker else None
    if isinstance(retired, dict) and isinstance(retired.get("high"), int):
        # A retired sink's marker: its target's own record of the epochs (a SQL sink's
        # sql_epochs rows) may be gone; the retirement keeps the highest.
        marked = max(marked, int(retired["high"]))
    else:
        retired = None
    if marker is None or marked <= known:
        return None, retired
    if known >= 0:
        raise SinkIdentityError(
            f"the target of sink {sid!r} holds committed epochs up to {marked} (its "
            f"eosink marker), but meta store {store.url_redacted} knows only up to "
            f"{known}: it is not the store this sink was written with, or an older copy "
            "of it. Run with the meta store the sink was written with (metastore_url=)"
        )
    return marked, retired
