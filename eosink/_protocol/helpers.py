"""Small conversions shared by the runtime's modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._rules import (
    KnownEpoch,
)
from ..errors import SchemaOutdatedError


def _known(r: Any) -> KnownEpoch:
    """An epoch's meta-store row as the rules see it."""
    return KnownEpoch(r.epoch, r.status, r.origin)


def retired_by_whom(rec: Any) -> str:
    """``at <ISO time> by <who>`` of a retired sink's record (what is known of it)."""
    from datetime import datetime

    at = (
        datetime.fromtimestamp(rec.retired_at).astimezone().isoformat(timespec="seconds")
        if rec.retired_at
        else "at an unknown time"
    )
    return f"{'at ' if rec.retired_at else ''}{at} by {rec.retired_by or 'an unknown operator'}"


def _span(epochs: Sequence[int]) -> str:
    """``3``, ``3-7`` or ``3, 5, 9-12``: epochs as runs."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and runs[-1][1] == e - 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _committable(plugin: Any, sink_id: str, rec: Any) -> Any:
    """An epoch row's committable, decoded by ``plugin``'s codec.

    Raises:
        SchemaOutdatedError: a newer eosink (or plugin) staged the epoch: its committable's
            version is above what this codec reads (after a downgrade). Nothing of the epoch
            was changed; the eosink that staged it finishes it.
    """
    codec = plugin.committable_codec
    if rec.codec_version > codec.version:
        raise SchemaOutdatedError(
            f"sink {sink_id} epoch {rec.epoch} ({rec.status}) was staged by a newer eosink: its "
            f"committable has version {rec.codec_version}, and the {plugin.name} sink here "
            f"reads up to version {codec.version}. Nothing of it was changed. Run the job "
            "with the eosink (and sink plugin) version that staged it, which finishes the "
            "epoch; downgrade only after that"
        )
    return codec.decode(rec.committable, rec.codec_version)


def _keep_newest(kept: dict[int, Any], epoch: int, value: Any, limit: int) -> None:
    """Set ``kept[epoch]`` as its newest entry, keeping only the newest ``limit``
    (a stream runs for months: its driver's memory must not grow per epoch)."""
    kept.pop(epoch, None)
    kept[epoch] = value
    while len(kept) > limit:
        del kept[next(iter(kept))]
