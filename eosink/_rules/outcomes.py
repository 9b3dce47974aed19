"""The three answers a decision about one epoch can give a run."""

from __future__ import annotations

from typing import Final

SKIP: Final = "skip"
"""A decision: the epoch is committed already; the run's output for it is discarded."""
FINISH: Final = "finish"
"""A decision: the epoch is PENDING from a crashed run; it is committed from its record."""
WRITE: Final = "write"
"""A decision: the epoch is written (new, or ABORTED and written again)."""
