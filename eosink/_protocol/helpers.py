"""Small conversions shared by the runtime's modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._rules import (
    KnownEpoch,
)


def _known(r: Any) -> KnownEpoch:
    """An epoch's meta-store row as the rules see it."""
    return KnownEpoch(r.epoch, r.status, r.origin)


def _span(epochs: Sequence[int]) -> str:
    """``3``, ``3-7`` or ``3, 5, 9-12``: epochs as runs."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and runs[-1][1] == e - 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
